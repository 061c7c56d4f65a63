"""How the ranks of a real process group agree on what happened: one decision from all reports.

At every exchange (:mod:`tp_logprob.real_group.lockstep`) each rank sends a
:class:`Report` of where it is (its :class:`Phase` and step within the example) and
how its part went (its :class:`Status`); every rank receives all of them and
:func:`settle` turns that list into one :class:`Settlement`. The list is the same
on every rank, so is the settlement: the ranks proceed together, re-raise their
own exceptions together, fail the example together with one agreed failure, or
abort together.

The rules, in order:

- every rank at the same phase and step: an example's end passes when every rank
  passed and ran the same example; an op's end proceeds when every rank's op
  returned, and re-raises when every rank raised the same type of exception
  (none of them a collective that gave up waiting);
- some ranks ended the example with a failure while the others were still in it:
  those failures decide (a rank that failed leaves the example early);
- failures: property violations, on any ranks, settle as the failure of the
  lowest failing rank, which every rank raises; an exception that is not a
  violation fails the same way only when every rank raised its type, and is
  otherwise a rank-local fault;
- anything else (a rank-local fault, ranks at different places, different
  examples) aborts: the process group cannot be trusted once a collective was left
  unmatched.

Pure: no torch, no process group, no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Phase", "Report", "Settlement", "Status", "settle"]


class Phase(str, enum.Enum):
    """Where a rank is when it reports."""

    EXECUTE = "execute"
    """About to run the op on its shard of a case."""
    EXECUTED = "executed"
    """Its op returned or raised."""
    GATHER = "gather"
    """Sending its piece of a gradient."""
    EXAMPLE = "example"
    """At the end of an example (or of a test that is not a Hypothesis test)."""


class Status(str, enum.Enum):
    """How a rank's part went."""

    OK = "ok"
    VIOLATION = "violation"
    """A property violation: the property does not hold, as this rank sees it."""
    ERROR = "error"
    """An exception that is not a property violation."""
    CONTROL = "control"
    """Test control flow: a skip, a rejected assumption, Hypothesis stopping a draw."""


@dataclass(frozen=True)
class Report:
    """What one rank says at an exchange.

    ``headline`` and ``body`` describe a failure (a violation's headline and report,
    or an exception's type and message and its traceback); ``consequential`` marks a
    collective that gave up because a peer never came; ``prop`` is the property the
    rank is running, ``runs`` how many property runs the example has made so far and
    ``run_index`` the one that failed;
    ``digest`` identifies the example's content at its end; ``payload`` is data the
    exchange carries (outputs, a gradient piece).
    """

    rank: int
    phase: Phase
    step: int
    status: Status = Status.OK
    error_type: str = ""
    headline: str = ""
    body: str = ""
    consequential: bool = False
    prop: str = ""
    runs: int = 0
    run_index: int | None = None
    digest: str = ""
    payload: Any = None

    def where(self) -> str:
        """``rank 1 (property 'oracle')``, for messages."""
        return f"rank {self.rank}" + (f" (property {self.prop!r})" if self.prop else "")

    def describe(self) -> str:
        """One line: where the rank is and how its part went."""
        place = f"{self.phase.value} #{self.step}"
        if self.status is Status.OK:
            return f"{self.where()}: at {place}, ok"
        what = self.headline.splitlines()[0] if self.headline else self.error_type
        return f"{self.where()}: at {place}, {self.status.value} {what}"


@dataclass(frozen=True)
class Settlement:
    """What every rank does next.

    ``kind``: ``proceed``; ``reraise`` (each rank raises its own exception, of the
    same type everywhere); ``fail`` (every rank raises the failure ``chosen``
    reported, seen on ``ranks``); ``abort`` (``reason`` says why).
    """

    kind: str
    chosen: Report | None = None
    ranks: tuple[int, ...] = ()
    reason: str = ""


PROCEED = Settlement("proceed")
RERAISE = Settlement("reraise")


def settle(reports: Sequence[Report]) -> Settlement:
    """The one decision every rank takes from the same ``reports`` (rank order)."""
    if not reports:
        raise ValueError("reports=[]: expected one report per rank")
    first = reports[0]
    if all(r.phase is first.phase and r.step == first.step for r in reports):
        if first.phase is Phase.EXAMPLE:
            return _settle_example(reports)
        if first.phase is Phase.EXECUTED:
            return _settle_execution(reports)
        return PROCEED
    finished = [r for r in reports if r.phase is Phase.EXAMPLE]
    failed = [r for r in finished if r.status in (Status.VIOLATION, Status.ERROR)]
    if finished and failed == finished:
        running = [r.rank for r in reports if r.phase is not Phase.EXAMPLE]
        return _settle_failures(failed, len(reports), note=f"rank(s) {running} were still in it")
    return _abort("the ranks lost lockstep (they are at different places of one example)", reports)


def _settle_example(reports: Sequence[Report]) -> Settlement:
    statuses = {r.status for r in reports}
    if statuses == {Status.OK}:
        if len({r.digest for r in reports}) > 1:
            return _abort(
                "the ranks ran different examples (a strategy or setting depends on the "
                "process: its time, PID, rank or hash seed)",
                reports,
                digests=True,
            )
        return PROCEED
    if Status.CONTROL in statuses:
        if statuses == {Status.CONTROL} and len({r.error_type for r in reports}) == 1:
            return RERAISE
        return _abort("the ranks lost lockstep (not all of them stopped the same way)", reports)
    failed = [r for r in reports if r.status in (Status.VIOLATION, Status.ERROR)]
    return _settle_failures(failed, len(reports))


def _settle_failures(failed: Sequence[Report], world: int, note: str = "") -> Settlement:
    errors = [r for r in failed if r.status is Status.ERROR]
    if errors and (len(errors) < world or len({r.error_type for r in errors}) > 1):
        raised = ", ".join(f"{r.where()} raised {_first_line(r.headline)}" for r in errors)
        calm = sorted(set(range(world)) - {r.rank for r in failed})
        tail = f"; rank(s) {calm} did not raise" if calm else ""
        return Settlement("abort", errors[0], tuple(r.rank for r in errors), f"{raised}{tail}")
    chosen = min(failed, key=lambda r: r.rank)
    return Settlement("fail", chosen, tuple(sorted(r.rank for r in failed)), note)


def _settle_execution(reports: Sequence[Report]) -> Settlement:
    raised = [r for r in reports if r.status is not Status.OK]
    if not raised:
        return PROCEED
    same = len({r.error_type for r in raised}) == 1
    if len(raised) == len(reports) and same and not any(r.consequential for r in raised):
        return RERAISE
    primary = [r for r in raised if not r.consequential] or raised
    waited = [r.rank for r in raised if r.consequential and r not in primary]
    done = [r.rank for r in reports if r.status is Status.OK]
    parts = [f"{r.where()} raised {_first_line(r.headline)}" for r in primary]
    if waited:
        parts.append(f"rank(s) {waited} gave up waiting in a collective")
    if done:
        parts.append(f"rank(s) {done} returned")
    return Settlement("abort", primary[0], tuple(r.rank for r in primary), "; ".join(parts))


def _abort(reason: str, reports: Sequence[Report], *, digests: bool = False) -> Settlement:
    lines = [
        r.describe() + (f", example {r.digest[:16] or '(no property run)'}" if digests else "")
        for r in reports
    ]
    return Settlement("abort", None, (), reason + ": " + "; ".join(lines))


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""
