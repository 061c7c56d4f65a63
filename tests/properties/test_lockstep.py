"""Lockstep, one rank seen from inside: the peers are a fake transport that answers for them.

What a real group of processes does with it is tests/test_real_groups.py's; here each
rule is pinned without starting one: the agreed failure raised from one place
whichever rank failed, a peer's failure unwinding this rank from inside its example,
the local error logged before the exchange, and Hypothesis' clock switched off.
"""

from __future__ import annotations

import dataclasses
import io
import math
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tp_logprob.judging.violation import PropertyViolation
from tp_logprob.real_group.lockstep import (
    Lockstep,
    LockstepFailure,
    RealGroupAbort,
    lockstep_settings,
    suspend_shrink_time_limit,
)
from tp_logprob.real_group.verdicts import Phase, Report, Status
from tp_logprob.strategies import LogprobCase
from tp_logprob.suite.outcomes import NotApplicable
from tp_logprob.suite.property import FAILURE_ATTRIBUTE, SuiteProperty

from ..helpers.native_cases import make_contract

Peer = Callable[[Report], Report]


def passing(mine: Report) -> Report:
    """A peer at the same place as this rank, whose part went well."""
    return Report(1, mine.phase, mine.step, prop=mine.prop, runs=mine.runs, digest=mine.digest)


def violating(mine: Report) -> Report:
    """A peer that ended the example with a violation of the property this rank ran."""
    return Report(
        1, Phase.EXAMPLE, mine.step, Status.VIOLATION, "PropertyViolation",
        "probe: seen on rank 1 only", "  worst     row 0", prop="probe", runs=1, run_index=0,
    )  # fmt: skip


class Transport:
    """Rank 0's side of a 2-rank exchange; rank 1 answers with ``peer``."""

    def __init__(self, peer: Peer, log: io.StringIO) -> None:
        self.peer, self.log, self.seen, self.logged = peer, log, [], []

    def __call__(self, mine: Report) -> list[Report]:
        self.seen.append(mine)
        self.logged.append(self.log.getvalue())
        return [mine, self.peer(mine)]


def lockstep(peer: Peer) -> tuple[Lockstep, Transport, io.StringIO]:
    log = io.StringIO()
    transport = Transport(peer, log)
    step = Lockstep(transport, 0, 2, log, group="2 ranks, fake", logs="logs/", timeout=5.0)
    step.start_test("test_probe.py::test_probe")
    return step, transport, log


CASE = LogprobCase(make_contract(num_tokens=2), [[0.0] * 24] * 2, [1, 2])


FAILING = [False]
"""Whether the property ``probe`` fails: its last item (see the fixture ``probe``)."""


def _probe_body(backend: Any, case: Any, params: Any, **context: Any) -> None:
    if FAILING[-1]:
        raise PropertyViolation("probe: seen on rank 0", "  worst     row 1")


PROBE = SuiteProperty("probe", _probe_body)


@pytest.fixture
def probe() -> Iterator[list[bool]]:
    """The property ``probe``'s switch: it fails while the list's last item is True."""
    FAILING[:] = [False]
    yield FAILING
    FAILING[:] = [False]


def run_probe() -> None:
    PROBE.run("backend", CASE, {"seed": 3})


def raised_by(step: Lockstep) -> BaseException:
    with pytest.raises(BaseException) as caught:
        step.run_example(run_probe, (), {})
    return caught.value


def test_an_example_every_rank_passes_ends_quietly(probe: list[bool]) -> None:
    step, transport, log = lockstep(passing)
    step.run_example(run_probe, (), {})
    [report] = transport.seen
    assert (report.phase, report.status, report.runs) == (Phase.EXAMPLE, Status.OK, 1)
    assert log.getvalue().startswith("EXAMPLE test_probe.py::test_probe #1: probe@")
    assert log.getvalue().rstrip().endswith("-> pass")


def test_a_peers_violation_is_raised_here_with_this_ranks_case(probe: list[bool]) -> None:
    failure = raised_by(lockstep(violating)[0])
    assert isinstance(failure, LockstepFailure)
    assert failure.prop == "probe: seen on rank 1 only"
    assert "failed on rank(s) [1] of 2 (2 ranks, fake)" in failure.report
    record = getattr(failure, FAILURE_ATTRIBUTE)
    assert (record.prop, record.case, record.params) == ("probe", CASE, {"seed": 3})


def test_the_agreed_failure_comes_from_one_place_whichever_rank_failed(probe: list[bool]) -> None:
    """Hypothesis tells failures apart by type, place and context: all three must agree."""
    from_peer = raised_by(lockstep(violating)[0])
    probe.append(True)
    from_here = raised_by(lockstep(passing)[0])
    assert isinstance(from_here, LockstepFailure)
    assert "failed on rank(s) [0] of 2" in from_here.report
    places = [traceback.extract_tb(e.__traceback__)[-1][:3] for e in (from_peer, from_here)]
    assert places[0] == places[1]
    assert from_peer.__context__ is None and from_here.__context__ is None


def test_a_peer_that_failed_unwinds_this_rank_from_inside_the_example() -> None:
    step, transport, _ = lockstep(violating)
    reached = []

    def body() -> None:
        step.agree(Phase.EXECUTE)
        reached.append("after the exchange")

    with pytest.raises(LockstepFailure, match="seen on rank 1 only"):
        step.run_example(body, (), {})
    assert not reached
    assert [report.phase for report in transport.seen] == [Phase.EXECUTE]


def test_this_ranks_own_error_is_logged_before_the_exchange() -> None:
    step, transport, log = lockstep(passing)

    def body() -> None:
        raise ValueError("only here")

    with pytest.raises(RealGroupAbort, match=r"rank 0 raised ValueError: only here"):
        step.run_example(body, (), {})
    assert "LOCAL t=" in transport.logged[0] and "ValueError: only here" in transport.logged[0]
    assert "ABORT t=" in log.getvalue()


def test_a_skip_on_every_rank_is_reraised() -> None:
    def skipped(mine: Report) -> Report:
        return dataclasses.replace(mine, rank=1)

    step, _, _ = lockstep(skipped)

    def body() -> None:
        pytest.skip("nothing to check")

    with pytest.raises(pytest.skip.Exception, match="nothing to check"):
        step.run_example(body, (), {})


def test_the_harness_not_applicable_on_every_rank_is_reraised() -> None:
    """The harness's own skip (no pytest in it) is control flow, as pytest's is."""
    step, _, log = lockstep(lambda mine: dataclasses.replace(mine, rank=1))

    def body() -> None:
        raise NotApplicable("serves no tp_world_size=2 contract")

    with pytest.raises(NotApplicable, match="tp_world_size=2"):
        step.run_example(body, (), {})
    assert "LOCAL" not in log.getvalue()


def test_pytest_fail_is_a_failure_not_a_skip() -> None:
    """pytest raises ``fail()`` as a BaseException, as it does a skip: it still fails."""
    step, transport, _ = lockstep(passing)

    def body() -> None:
        pytest.fail("broken on this rank")

    with pytest.raises(RealGroupAbort, match=r"rank 0 raised Failed: broken on this rank"):
        step.run_example(body, (), {})
    assert "LOCAL t=" in transport.logged[0]


def test_a_silent_peer_aborts_naming_where() -> None:
    def broken(mine: Report) -> Report:
        raise RuntimeError("Timed out waiting 20000ms")

    step, _, _ = lockstep(broken)
    with pytest.raises(RealGroupAbort) as caught:
        step.run_example(lambda: None, (), {})
    message = str(caught.value)
    assert "rank 0: not every rank reached example #1 of test_probe.py::test_probe" in message
    assert "within 5 s" in message and "Rank logs: logs/" in message


def test_lockstep_settings_leave_nothing_to_the_clock_or_the_process() -> None:
    base = settings(max_examples=7, deadline=200, report_multiple_bugs=True)
    chosen = lockstep_settings(base)
    assert (chosen.max_examples, chosen.database, chosen.deadline) == (7, None, None)
    assert not chosen.report_multiple_bugs
    assert HealthCheck.too_slow in chosen.suppress_health_check


def test_the_shrinking_time_limit_is_lifted_only_inside() -> None:
    from hypothesis.internal.conjecture import engine

    before = engine.MAX_SHRINKING_SECONDS
    with suspend_shrink_time_limit():
        inside = engine.MAX_SHRINKING_SECONDS
    after = engine.MAX_SHRINKING_SECONDS
    assert (inside, after) == (math.inf, before)
