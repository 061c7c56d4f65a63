"""settle(): the one decision every rank of a real group takes from the same reports."""

from __future__ import annotations

import pytest

from tp_logprob.real_group.verdicts import Phase, Report, Status, settle

EXAMPLE, EXECUTE, EXECUTED = Phase.EXAMPLE, Phase.EXECUTE, Phase.EXECUTED


def ok(rank: int, phase: Phase = EXAMPLE, step: int = 1, digest: str = "d") -> Report:
    return Report(rank, phase, step, digest=digest, prop="oracle")


def violated(rank: int, headline: str = "oracle agreement: off") -> Report:
    return Report(
        rank, EXAMPLE, 1, Status.VIOLATION, "PropertyViolation", headline, "  worst  row 0",
        prop="oracle", run_index=0,
    )  # fmt: skip


def raised(
    rank: int, error: str = "RuntimeError", phase: Phase = EXAMPLE, consequential: bool = False
) -> Report:
    return Report(
        rank, phase, 1, Status.ERROR, error, f"{error}: boom on rank {rank}", "Traceback ...",
        consequential=consequential, prop="oracle",
    )  # fmt: skip


def stopped(rank: int, kind: str = "Skipped") -> Report:
    return Report(rank, EXAMPLE, 1, Status.CONTROL, kind)


def test_every_rank_passing_the_same_example_proceeds() -> None:
    assert settle([ok(0), ok(1), ok(2)]).kind == "proceed"


def test_ranks_that_ran_different_examples_abort() -> None:
    settlement = settle([ok(0, digest="a" * 64), ok(1, digest="b" * 64)])
    assert settlement.kind == "abort"
    assert "different examples" in settlement.reason
    assert "aaaaaaaaaaaaaaaa" in settlement.reason and "bbbbbbbbbbbbbbbb" in settlement.reason


def test_a_violation_on_the_last_rank_fails_every_rank_with_it() -> None:
    settlement = settle([ok(0), ok(1), violated(2)])
    assert settlement.kind == "fail"
    assert settlement.chosen is not None and settlement.chosen.rank == 2
    assert settlement.ranks == (2,)


def test_violations_on_several_ranks_settle_as_the_lowest_ranks() -> None:
    settlement = settle([ok(0), violated(1, "first"), violated(2, "second")])
    assert settlement.kind == "fail"
    assert settlement.chosen is not None and settlement.chosen.headline == "first"
    assert settlement.ranks == (1, 2)


def test_an_exception_on_one_rank_only_aborts_naming_the_rank_and_property() -> None:
    settlement = settle([ok(0), raised(1), ok(2)])
    assert settlement.kind == "abort"
    assert "rank 1 (property 'oracle') raised RuntimeError: boom on rank 1" in settlement.reason
    assert "rank(s) [0, 2] did not raise" in settlement.reason


def test_the_same_exception_on_every_rank_is_a_failure() -> None:
    settlement = settle([raised(0), raised(1)])
    assert settlement.kind == "fail"
    assert settlement.chosen is not None and settlement.chosen.rank == 0
    assert settlement.ranks == (0, 1)


def test_different_exceptions_abort() -> None:
    assert settle([raised(0, "ValueError"), raised(1, "KeyError")]).kind == "abort"


def test_every_rank_stopping_the_same_way_reraises() -> None:
    assert settle([stopped(0), stopped(1)]).kind == "reraise"
    assert settle([stopped(0), stopped(1, "StopTest")]).kind == "abort"
    assert settle([stopped(0), ok(1)]).kind == "abort"


def test_an_op_that_returned_everywhere_proceeds() -> None:
    assert settle([ok(0, EXECUTED), ok(1, EXECUTED)]).kind == "proceed"


def test_an_op_that_raised_the_same_type_everywhere_reraises() -> None:
    reports = [
        raised(0, "LogprobContractError", EXECUTED),
        raised(1, "LogprobContractError", EXECUTED),
    ]
    assert settle(reports).kind == "reraise"


def test_a_rank_that_raised_while_its_peers_timed_out_aborts_naming_it() -> None:
    reports = [
        raised(0, "CollectiveTimeoutError", EXECUTED, consequential=True),
        raised(1, "RuntimeError", EXECUTED),
    ]
    settlement = settle(reports)
    assert settlement.kind == "abort"
    assert settlement.chosen is not None and settlement.chosen.rank == 1
    assert "rank 1 (property 'oracle') raised RuntimeError: boom on rank 1" in settlement.reason
    assert "rank(s) [0] gave up waiting in a collective" in settlement.reason


def test_every_rank_timing_out_aborts() -> None:
    reports = [raised(rank, "CollectiveTimeoutError", EXECUTED, True) for rank in range(2)]
    settlement = settle(reports)
    assert settlement.kind == "abort"
    assert "rank 0 (property 'oracle') raised" in settlement.reason


def test_a_rank_that_failed_early_settles_its_peers_still_in_the_example() -> None:
    settlement = settle([ok(0, EXECUTE, step=3), violated(1), ok(2, EXECUTE, step=3)])
    assert settlement.kind == "fail"
    assert settlement.chosen is not None and settlement.chosen.rank == 1
    assert "rank(s) [0, 2] were still in it" in settlement.reason


def test_a_rank_that_passed_while_its_peers_are_still_running_lost_lockstep() -> None:
    settlement = settle([ok(0, EXECUTE, step=2), ok(1)])
    assert settlement.kind == "abort"
    assert "lost lockstep" in settlement.reason
    assert "rank 0 (property 'oracle'): at execute #2, ok" in settlement.reason


def test_a_rank_local_exception_outside_the_op_aborts_even_when_early() -> None:
    assert settle([ok(0, EXECUTE, step=2), raised(1)]).kind == "abort"


def test_ranks_at_different_steps_abort() -> None:
    assert settle([ok(0, EXECUTE, step=2), ok(1, EXECUTE, step=3)]).kind == "abort"


def test_no_report_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"reports=\[\]"):
        settle([])
