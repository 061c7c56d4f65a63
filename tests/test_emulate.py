"""run_tp: shards, threads, error propagation without hangs, and the replication check."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

import tp_logprob as tpl
from tp_logprob.comm import CollectiveTimeoutError
from tp_logprob.emulate import ReplicationError, run_tp

BOUNDS = ((0, 3), (3, 4), (4, 9), (9, 12))


def contract4(num_tokens: int = 3) -> tpl.LogprobContract:
    return tpl.LogprobContract(
        role="infer",
        dtype="fp32",
        mask=tpl.MaskSpec(num_tokens),
        sharding=tpl.ShardingSpec(0, 4, BOUNDS, 10, 12),
        reduction=tpl.ReductionSpec("fixed_topology"),
    )


def gathering_op(
    logits: torch.Tensor, targets: torch.Tensor, contract: tpl.LogprobContract, group: Any = None
) -> tpl.LogprobResult:
    """A toy op that exchanges one value per rank and returns the same thing everywhere."""
    partials = group.all_gather(logits.sum(dim=1, keepdim=True).float())
    total = torch.cat(partials, dim=1).sum(dim=1)
    return tpl.LogprobResult(total, total.clone())


def test_each_rank_gets_a_view_of_its_columns_and_its_contract() -> None:
    logits = torch.arange(36, dtype=torch.float32).reshape(3, 12)
    seen: dict[int, tuple[torch.Tensor, tpl.LogprobContract]] = {}

    def op(local: torch.Tensor, targets: torch.Tensor, contract: Any, group: Any = None) -> Any:
        seen[group.rank] = (local, contract)
        return gathering_op(local, targets, contract, group)

    results = run_tp(op, logits, torch.zeros(3, dtype=torch.long), contract4())
    assert len(results) == 4
    for rank, (start, end) in enumerate(BOUNDS):
        local, contract = seen[rank]
        assert contract.sharding.tp_rank == rank
        assert local.data_ptr() == logits[:, start:end].data_ptr()  # a view, not a copy
        assert torch.equal(local, logits[:, start:end])
    assert torch.equal(results[3].selected_logp, logits.sum(dim=1))


def test_shards_given_one_per_rank_reach_their_ranks_as_they_are() -> None:
    logits = torch.arange(36, dtype=torch.float32).reshape(3, 12)
    shards = [logits[:, start:end].clone() for start, end in BOUNDS]
    seen: dict[int, torch.Tensor] = {}

    def op(local: torch.Tensor, targets: torch.Tensor, contract: Any, group: Any = None) -> Any:
        seen[group.rank] = local
        return gathering_op(local, targets, contract, group)

    results = run_tp(op, shards, torch.zeros(3, dtype=torch.long), contract4())
    assert all(seen[rank] is shard for rank, shard in enumerate(shards))
    assert torch.equal(results[1].selected_logp, logits.sum(dim=1))


@pytest.mark.parametrize(
    ("shards", "message"),
    [
        ([torch.zeros(3, 3)] * 3, r"3 shards for tp_world_size=4"),
        ([torch.zeros(3, 3), torch.zeros(3, 2), torch.zeros(3, 5), torch.zeros(3, 3)],
         r"logits\[1\]: width 2 != its shard's 1"),
        ([torch.zeros(3, 3), torch.zeros(3), torch.zeros(3, 5), torch.zeros(3, 3)],
         r"logits\[1\]: expected a 2-dim torch.Tensor shard"),
    ],
    ids=["too-few", "wrong-width", "one-dim"],
)  # fmt: skip
def test_bad_shards_are_refused(shards: list[torch.Tensor], message: str) -> None:
    with pytest.raises(tpl.LogprobContractError, match=message):
        run_tp(gathering_op, shards, torch.zeros(3), contract4())


def test_first_ranks_own_error_is_reraised_and_peers_do_not_wait() -> None:
    def op(local: torch.Tensor, targets: torch.Tensor, contract: Any, group: Any = None) -> Any:
        if group.rank == 2:
            raise ValueError("rank two is broken")
        return gathering_op(local, targets, contract, group)

    started = time.monotonic()
    with pytest.raises(ValueError, match="rank two is broken") as caught:
        run_tp(op, torch.zeros(3, 12), torch.zeros(3, dtype=torch.long), contract4(), timeout=30)
    assert time.monotonic() - started < 10.0, "peers waited for the timeout instead of aborting"
    notes = getattr(caught.value, "__notes__", ["(raised on emulated TP rank 2 of 4)"])
    assert "(raised on emulated TP rank 2 of 4)" in notes


def test_rank_that_skips_the_collective_times_out_instead_of_hanging() -> None:
    def op(local: torch.Tensor, targets: torch.Tensor, contract: Any, group: Any = None) -> Any:
        if group.rank == 1:
            zeros = torch.zeros(3)
            return tpl.LogprobResult(zeros, zeros)
        return gathering_op(local, targets, contract, group)

    started = time.monotonic()
    with pytest.raises(CollectiveTimeoutError, match=r"timed out after 0.5 s.*rank\(s\) \[1\]"):
        run_tp(op, torch.zeros(3, 12), torch.zeros(3, dtype=torch.long), contract4(), timeout=0.5)
    assert time.monotonic() - started < 5.0


def test_a_backends_own_collective_that_hangs_is_reported_with_its_rank() -> None:
    """Rank 3 waits on a collective of the backend's own that no peer ever joins."""
    never = threading.Event()

    def op(local: torch.Tensor, targets: torch.Tensor, contract: Any, group: Any = None) -> Any:
        if group.rank == 3:
            never.wait()
        return gathering_op(local, targets, contract, group)

    started = time.monotonic()
    with pytest.raises(CollectiveTimeoutError, match=r"rank\(s\) \[3\] never reached"):
        run_tp(op, torch.zeros(3, 12), torch.zeros(3, dtype=torch.long), contract4(), timeout=0.5)
    assert time.monotonic() - started < 5.0
    never.set()


def test_every_rank_in_its_own_wait_is_reported_not_awaited() -> None:
    barrier = threading.Barrier(5)  # one more party than ranks: never completes

    def op(local: torch.Tensor, targets: torch.Tensor, contract: Any, group: Any = None) -> Any:
        barrier.wait()
        return gathering_op(local, targets, contract, group)

    started = time.monotonic()
    with pytest.raises(CollectiveTimeoutError, match=r"rank\(s\) \[0, 1, 2, 3\] never reached"):
        run_tp(op, torch.zeros(3, 12), torch.zeros(3, dtype=torch.long), contract4(), timeout=0.5)
    assert time.monotonic() - started < 5.0
    barrier.abort()


def test_a_ranks_own_error_wins_over_a_peer_that_hangs() -> None:
    never = threading.Event()

    def op(local: torch.Tensor, targets: torch.Tensor, contract: Any, group: Any = None) -> Any:
        if group.rank == 0:
            raise ValueError("rank zero is broken")
        if group.rank == 1:
            never.wait()
        return gathering_op(local, targets, contract, group)

    with pytest.raises(ValueError, match="rank zero is broken") as caught:
        run_tp(op, torch.zeros(3, 12), torch.zeros(3, dtype=torch.long), contract4(), timeout=0.5)
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert "[1] never reached" in notes, notes
    never.set()


def test_slow_ranks_that_keep_exchanging_are_not_a_hang() -> None:
    def op(local: torch.Tensor, targets: torch.Tensor, contract: Any, group: Any = None) -> Any:
        for _ in range(4):  # 4 x 0.3 s in all, longer than the timeout, but never idle
            time.sleep(0.3)
            group.all_gather(torch.zeros(1))
        return gathering_op(local, targets, contract, group)

    results = run_tp(
        op, torch.ones(3, 12), torch.zeros(3, dtype=torch.long), contract4(), timeout=0.9
    )
    assert torch.equal(results[0].selected_logp, torch.full((3,), 12.0))


def _rank_dependent(values: dict[int, list[float]]) -> Any:
    def op(local: torch.Tensor, targets: torch.Tensor, contract: Any, group: Any = None) -> Any:
        group.all_gather(torch.zeros(1))
        out = torch.tensor(values.get(group.rank, values[0]))
        return tpl.LogprobResult(out, out.clone())

    return op


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({0: [1.0, 2.0, 3.0], 2: [1.0, 2.0, 3.5]}, r"rank 0 and rank 2: first at row 2"),
        ({0: [0.0, 0.0, 0.0], 3: [0.0, -0.0, 0.0]}, r"rank 3: first at row 1 .*0x0 vs 0x80000000"),
        ({0: [1.0, 1.0, 1.0], 1: [1.0, float("nan"), 1.0]}, r"rank 0 and rank 1: first at row 1"),
    ],
    ids=["value", "signed-zero", "nan-vs-number"],
)
def test_non_replicated_outputs_are_reported(values: dict[int, list[float]], message: str) -> None:
    with pytest.raises(ReplicationError, match=message):
        run_tp(_rank_dependent(values), torch.zeros(3, 12), torch.zeros(3), contract4())


def test_equal_nan_bits_count_as_replicated() -> None:
    nan_row = {0: [float("nan"), 0.0, float("inf")]}
    results = run_tp(_rank_dependent(nan_row), torch.zeros(3, 12), torch.zeros(3), contract4())
    assert all(torch.isnan(result.selected_logp[0]) for result in results)


def test_lse_none_on_one_rank_only_is_reported() -> None:
    def op(local: torch.Tensor, targets: torch.Tensor, contract: Any, group: Any = None) -> Any:
        out = torch.zeros(3)
        return tpl.LogprobResult(out, None if group.rank == 1 else out)

    with pytest.raises(ReplicationError, match="lse differs between rank 0 and rank 1"):
        run_tp(op, torch.zeros(3, 12), torch.zeros(3), contract4())


def test_op_returning_something_else_is_reported() -> None:
    with pytest.raises(ReplicationError, match="rank 0: op returned Tensor"):
        run_tp(lambda *a, **k: torch.zeros(3), torch.zeros(3, 12), torch.zeros(3), contract4())


@pytest.mark.parametrize(
    ("logits", "message"),
    [
        (torch.zeros(3, 11), r"width 11 != padded_vocab_size=12"),
        (torch.zeros(12), r"expected a 2-dim torch.Tensor"),
        ([[0.0] * 12] * 3, r"got list"),
    ],
    ids=["narrow", "one-dim", "list"],
)
def test_bad_full_logits_are_refused(logits: Any, message: str) -> None:
    with pytest.raises(tpl.LogprobContractError, match=message):
        run_tp(gathering_op, logits, torch.zeros(3), contract4())


def test_callers_grad_mode_reaches_every_rank() -> None:
    modes: dict[int, bool] = {}

    def op(local: torch.Tensor, targets: torch.Tensor, contract: Any, group: Any = None) -> Any:
        modes[group.rank] = torch.is_grad_enabled()
        return gathering_op(local, targets, contract, group)

    with torch.no_grad():
        run_tp(op, torch.zeros(3, 12), torch.zeros(3), contract4())
    assert modes == dict.fromkeys(range(4), False)
    run_tp(op, torch.zeros(3, 12), torch.zeros(3), contract4())
    assert modes == dict.fromkeys(range(4), True)
