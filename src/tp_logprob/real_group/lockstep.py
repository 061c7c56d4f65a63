"""Lockstep: every rank of a real process group draws, judges and shrinks the same examples.

Under ``torchrun`` each process runs the whole suite for its own rank, and the
ranks meet in the backend's collectives. Hypothesis decides what to run next from
what the last example did, so the ranks stay together only if every rank sees
every example end the same way. :class:`Lockstep` makes sure of it: each example
(each call of a property test's body) ends with an exchange of
:class:`~tp_logprob.real_group.verdicts.Report` s over a separate gloo *control*
group, and every rank then takes the one
:func:`~tp_logprob.real_group.verdicts.settle` decision: pass, re-raise (a skip),
raise the one agreed :class:`LockstepFailure` from one line (so Hypothesis sees the
same failure, at the same place, on every rank, and shrinks it the same way), or
abort (:class:`RealGroupAbort`). The op's runs on a rank's shard exchange the
same way (:mod:`tp_logprob.real_group.group`), so a rank that left an example
early is noticed at the next collective instead of leaving its peers waiting.

What Hypothesis must not decide by the clock or by the process is switched off by
:func:`lockstep_settings` and :func:`suspend_shrink_time_limit`: no example
database, no deadline, no ``too_slow`` health check, no shrinking time limit, one
bug per test; the plugin gives every rank rank 0's seed.

Each rank appends to its own log (``rank{r}.log``): one line per example, the same
on every rank, and the rank's own exceptions before it reports them.
"""

from __future__ import annotations

import functools
import hashlib
import math
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis.errors import HypothesisException

from tp_logprob.comm import CollectiveError
from tp_logprob.judging.violation import LABEL_WIDTH, PropertyViolation
from tp_logprob.real_group.verdicts import Phase, Report, Settlement, Status, settle
from tp_logprob.suite.outcomes import NotApplicable
from tp_logprob.suite.property import FAILURE_ATTRIBUTE, PropertyRun, recording_runs

__all__ = [
    "AllGather",
    "Lockstep",
    "LockstepFailure",
    "RealGroupAbort",
    "error_fields",
    "lockstep_settings",
    "log_file",
    "suspend_shrink_time_limit",
]

AllGather = Callable[[Report], list[Report]]
"""The transport: this rank's report in, every rank's report out (rank order)."""


class LockstepFailure(PropertyViolation):
    """The failure every rank raises when any rank's part of an example failed."""


class RealGroupAbort(BaseException):
    """The ranks cannot go on together: a rank failed on its own, or they fell out of step.

    A BaseException, so that neither a property nor Hypothesis takes it for a failing
    example; the plugin stops the session. Like a failure, it carries the property
    run in progress (:data:`~tp_logprob.suite.property.FAILURE_ATTRIBUTE`), if
    any, so that its case is written as an artifact.
    """

    def __init__(self, message: str, record: Any = None) -> None:
        super().__init__(message)
        if record is not None:
            setattr(self, FAILURE_ATTRIBUTE, record)


class _Settled(BaseException):
    """A peer ended the example while this rank was still in it: unwind to its end."""

    def __init__(self, settlement: Settlement, reports: Sequence[Report]) -> None:
        super().__init__(settlement.kind)
        self.settlement = settlement
        self.reports = reports


def lockstep_settings(base: settings) -> settings:
    """``base`` with nothing left that differs between processes or depends on the clock."""
    suppressed = set(base.suppress_health_check) | {HealthCheck.too_slow}
    return settings(
        base,
        database=None,
        deadline=None,
        report_multiple_bugs=False,
        suppress_health_check=sorted(suppressed, key=lambda check: check.value),
    )


@contextmanager
def suspend_shrink_time_limit() -> Iterator[None]:
    """Lift Hypothesis' wall-clock limit on shrinking (five minutes) for the block.

    A rank that reached the limit a moment before its peers would stop shrinking
    while they went on. Hypothesis has no setting for it; its engine reads the
    module constant each time it starts shrinking. The plugin lifts it around each
    property test's run on a rank (a process ``torchrun`` started for the suite) and
    restores it after, so no other test in the session shrinks without the limit.
    """
    from hypothesis.internal.conjecture import engine

    if not isinstance(getattr(engine, "MAX_SHRINKING_SECONDS", None), (int, float)):
        raise RuntimeError(
            "hypothesis.internal.conjecture.engine.MAX_SHRINKING_SECONDS is gone in this "
            "Hypothesis version: the ranks' shrinking time limit cannot be lifted"
        )
    saved = engine.MAX_SHRINKING_SECONDS
    engine.MAX_SHRINKING_SECONDS = math.inf  # type: ignore[assignment]
    try:
        yield
    finally:
        engine.MAX_SHRINKING_SECONDS = saved


class Lockstep:
    """One rank's side of the exchanges (see the module docstring).

    ``all_gather`` carries reports between the ranks (in the suite, an
    ``all_gather_object`` on the gloo control group); ``log`` is this rank's log;
    ``group`` describes the process group in messages (``"3 ranks, gloo"``).
    """

    def __init__(
        self,
        all_gather: AllGather,
        rank: int,
        world_size: int,
        log: TextIO,
        *,
        group: str,
        logs: str,
        timeout: float,
    ) -> None:
        self.rank, self.world_size = rank, world_size
        self._all_gather, self._log = all_gather, log
        self.group, self.logs, self.timeout = group, logs, timeout
        self.test = ""
        self._example = 0
        self._step = 0
        self._runs: list[PropertyRun] = []

    def start_test(self, nodeid: str) -> None:
        """The examples that follow belong to test ``nodeid``."""
        self.test, self._example = nodeid, 0

    def wrap(self, test: Callable[..., Any]) -> Callable[..., None]:
        """``test`` run as one example in lockstep (a Hypothesis test's inner test, or a
        plain test)."""

        @functools.wraps(test)
        def in_lockstep(*args: Any, **kwargs: Any) -> None:
            self.run_example(test, args, kwargs)

        return in_lockstep

    def run_example(self, test: Callable[..., Any], args: Any, kwargs: Any) -> None:
        """Run ``test`` once, exchange how it ended, and end it the way every rank does."""
        self._example += 1
        self._step = 0
        local: BaseException | None = None
        early: _Settled | None = None
        with recording_runs() as runs:
            self._runs = runs
            try:
                test(*args, **kwargs)
            except _Settled as settled:
                early = settled
            except (RealGroupAbort, KeyboardInterrupt):
                raise
            except BaseException as error:  # every other ending is exchanged
                local = error
        if early is not None:
            settlement, reports = early.settlement, early.reports
        else:
            if local is not None and not _is_control(local):
                self.log_local(local)
            ending = _status_of(local, runs)
            reports = self._exchange(Phase.EXAMPLE, **ending, digest=_digest(runs))
            settlement = settle(reports)
        self._log_example(settlement, reports, runs)
        self._conclude(settlement, reports, local, runs)

    def agree(self, phase: Phase, **fields: Any) -> tuple[Settlement, list[Report]]:
        """Exchange ``phase`` inside an example; every rank's reports and their settlement.

        A peer that ended the example with a failure unwinds this rank to the
        example's end (where the failure is raised); an abort is raised here.
        """
        reports = self._exchange(phase, **fields)
        settlement = settle(reports)
        if settlement.kind == "abort":
            self._log_example(settlement, reports, self._runs)
            raise self._abort(settlement, reports, self._runs)
        if settlement.kind == "fail":
            raise _Settled(settlement, reports)
        return settlement, reports

    def log_local(self, error: BaseException) -> None:
        """Write this rank's own exception to its log, before the ranks compare notes."""
        where = f"{self.test} example {self._example} step {self._step}"
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        self.log(f"LOCAL {_stamp()} rank {self.rank} {where} ({self._prop()}):\n{text.rstrip()}")

    def log(self, line: str) -> None:
        """Append ``line`` to this rank's log."""
        self._log.write(line + "\n")
        self._log.flush()

    def _prop(self) -> str:
        return self._runs[-1].prop if self._runs else ""

    def _exchange(self, phase: Phase, **fields: Any) -> list[Report]:
        self._step += 1
        mine = Report(
            self.rank,
            phase,
            self._step,
            prop=self._prop(),
            runs=len(self._runs),
            **fields,
        )
        try:
            reports = self._all_gather(mine)
        except Exception as error:  # the control group timed out or broke
            message = (
                f"rank {self.rank}: not every rank reached {phase.value} #{self._step} of "
                f"{self.test} example {self._example} ({self._prop() or 'no property'}) "
                f"within {self.timeout:g} s: a rank is stuck (in an op, or a collective "
                f"of its own) or died ({type(error).__name__}: {error}). Rank logs: {self.logs}"
            )
            self.log(f"ABORT {_stamp()} {message}")
            raise RealGroupAbort(message, self._record(None, self._runs)) from None
        if len(reports) != self.world_size:
            raise RealGroupAbort(
                f"rank {self.rank}: {len(reports)} reports from {self.world_size} ranks"
            )
        return reports

    def _conclude(
        self,
        settlement: Settlement,
        reports: Sequence[Report],
        local: BaseException | None,
        runs: list[PropertyRun],
    ) -> None:
        if settlement.kind == "proceed":
            return
        if settlement.kind == "reraise" and local is not None:
            raise local
        if settlement.kind == "fail":
            raise self._failure(settlement, runs)
        raise self._abort(settlement, reports, runs)

    def _failure(self, settlement: Settlement, runs: list[PropertyRun]) -> LockstepFailure:
        """The one failure every rank raises: what the lowest failing rank saw."""
        chosen = settlement.chosen
        assert chosen is not None  # a "fail" settlement names its failure
        seen = f"failed on rank(s) {list(settlement.ranks)} of {self.world_size} ({self.group})"
        if settlement.reason:
            seen += f"; {settlement.reason}"
        lines = [f"  {'ranks'.ljust(LABEL_WIDTH)}  {seen}"]
        if chosen.status is Status.VIOLATION:
            failure = LockstepFailure(chosen.headline, "\n".join([chosen.body, *lines]))
        else:
            trace = "\n".join(f"    {line}" for line in chosen.body.splitlines())
            raised = f"  {'raised'.ljust(LABEL_WIDTH)}  on rank {chosen.rank}:\n{trace}"
            failure = LockstepFailure(chosen.headline, "\n".join([raised, *lines]))
        record = self._record(chosen, runs, failure)
        if record is not None:
            setattr(failure, FAILURE_ATTRIBUTE, record)
        return failure

    def _abort(
        self, settlement: Settlement, reports: Sequence[Report], runs: list[PropertyRun]
    ) -> RealGroupAbort:
        message = (
            f"real process group ({self.group}) aborted in {self.test} example "
            f"{self._example}: {settlement.reason}. The group's collectives can no longer "
            f"be matched, so the session stops. Rank logs: {self.logs}"
        )
        self.log(f"ABORT {_stamp()} {message}")
        return RealGroupAbort(message, self._record(settlement.chosen, runs))

    def _record(
        self, chosen: Report | None, runs: list[PropertyRun], error: BaseException | None = None
    ) -> Any:
        """The failing property run, as a FailureRecord for its artifact, if this rank has it."""
        index = chosen.run_index if chosen is not None else None
        if index is None and chosen is not None and chosen.phase is not Phase.EXAMPLE:
            index = len(runs) - 1  # a fault inside an op: the run in progress
        if index is None or not 0 <= index < len(runs):
            return None
        run = runs[index]
        return run.failed(error if error is not None else RuntimeError(_chosen_text(chosen)))

    def _log_example(
        self, settlement: Settlement, reports: Sequence[Report], runs: list[PropertyRun]
    ) -> None:
        """One line, the same on every rank: the runs every rank made, and the outcome."""
        common = min(report.runs for report in reports)
        made = ", ".join(f"{run.prop}@{run.case.digest()[:12]}" for run in runs[:common])
        if settlement.kind == "fail" and settlement.chosen is not None:
            headline = settlement.chosen.headline.strip().splitlines()
            outcome = f"fail on rank(s) {list(settlement.ranks)}: {headline[0] if headline else ''}"
        elif settlement.kind == "reraise":
            outcome = f"stop ({reports[0].error_type})"
        else:
            outcome = {"proceed": "pass"}.get(settlement.kind, settlement.kind)
        self.log(
            f"EXAMPLE {self.test} #{self._example}: {made or '(no property run)'} -> {outcome}"
        )


def _chosen_text(chosen: Report | None) -> str:
    """The failure a report describes, in one block of text."""
    if chosen is None:
        return "the ranks fell out of step"
    return f"{chosen.headline}\n{chosen.body}".strip()


def _status_of(error: BaseException | None, runs: Sequence[PropertyRun]) -> dict[str, Any]:
    """The report fields that say how an example ended on this rank.

    ``run_index`` names the property run that raised (the last one), when the
    exception came out of :meth:`~tp_logprob.suite.property.SuiteProperty.run`.
    """
    if error is None:
        return {}
    if _is_control(error):
        return {"status": Status.CONTROL, "error_type": type(error).__qualname__}
    fields = error_fields(error)
    if isinstance(error, PropertyViolation):
        fields.update(status=Status.VIOLATION, headline=error.prop, body=error.report)
    if getattr(error, FAILURE_ATTRIBUTE, None) is not None:
        fields["run_index"] = len(runs) - 1
    return fields


def error_fields(error: BaseException) -> dict[str, Any]:
    """The report fields of an exception: its type, message and the end of its traceback."""
    lines = traceback.format_exception(type(error), error, error.__traceback__)
    return {
        "status": Status.ERROR,
        "error_type": type(error).__name__,
        "headline": f"{type(error).__name__}: {error}".splitlines()[0][:300],
        "body": "".join(lines[-12:]).rstrip(),
        "consequential": _is_consequential(error),
    }


def _is_control(error: BaseException) -> bool:
    """A skip (the harness's :class:`NotApplicable` or pytest's), an assumption rejected, a
    draw Hypothesis stopped: not a failure. ``pytest.fail()`` is a failure, though pytest
    raises it as a BaseException too; it can come only from a process that loaded pytest
    (this module, imported by the properties, must not import it: replay runs without it)."""
    pytest = sys.modules.get("pytest")
    if pytest is not None and isinstance(error, pytest.fail.Exception):
        return False
    if isinstance(error, (NotApplicable, HypothesisException)):
        return True
    return not isinstance(error, Exception)


def _is_consequential(error: BaseException) -> bool:
    """A collective that gave up because a peer never came (or the group broke)."""
    if isinstance(error, CollectiveError):
        return True
    names = {cls.__name__ for cls in type(error).__mro__}
    text = str(error).lower()
    return bool(names & {"DistBackendError", "DistNetworkError"}) or "timed out" in text


def _digest(runs: Sequence[PropertyRun]) -> str:
    """What the example ran: every property run's name, case and params."""
    hasher = hashlib.sha256()
    for run in runs:
        hasher.update(run.prop.encode())
        hasher.update(run.case.digest().encode())
        for key in sorted(run.params):
            value = run.params[key]
            hasher.update(key.encode())
            if isinstance(value, np.ndarray):
                hasher.update(value.dtype.str.encode() + value.tobytes())
            else:
                hasher.update(repr(value).encode())
    return hasher.hexdigest()


def _stamp() -> str:
    """When, for the log's LOCAL and ABORT lines (seconds since the epoch)."""
    return f"t={time.time():.3f}"


def log_file(directory: str | Path, rank: int) -> Path:
    """Where rank ``rank`` keeps its log under ``directory``."""
    return Path(directory) / f"rank{rank}.log"
