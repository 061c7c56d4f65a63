"""The allocation tracker: what it records, live and peak bytes, threads, use on the fused op."""

from __future__ import annotations

import threading

import pytest
import torch

import tp_logprob as tpl
from tp_logprob.kernels import fused_chunks
from tp_logprob.kernels.native import torch_native_logprob
from tp_logprob.kernels.native_fused import torch_native_fused_logprob
from tp_logprob.suite.allocations import AllocationTracker, track_allocations

F32, F64 = 4, 8


def test_a_known_allocation_is_seen_with_its_shape_dtype_and_bytes() -> None:
    hidden, weight = torch.randn(6, 3), torch.randn(11, 3)
    with track_allocations() as seen:
        logits = hidden @ weight.T
    assert [(a.shape, a.dtype, a.nbytes) for a in seen.allocations] == [
        ((6, 11), torch.float32, 6 * 11 * F32)
    ]
    assert seen.largest is not None and seen.largest.op == "aten.mm.default"
    assert seen.peak_live_bytes == seen.live_bytes == 6 * 11 * F32
    del logits


def test_views_in_place_ops_and_preexisting_storage_are_not_counted() -> None:
    base = torch.randn(8, 5)
    with track_allocations() as seen:
        views = [base.T, base[2:], base.view(5, 8), base.unsqueeze(0), base.detach()]
        base.add_(1.0).mul_(2.0)
        torch.exp(base, out=base)
    assert seen.allocations == ()
    assert seen.peak_live_bytes == 0
    assert len(views) == 5


def test_a_freed_tensor_lowers_live_bytes_and_a_view_keeps_it_alive() -> None:
    with track_allocations() as seen:
        first = torch.empty(100)
        second = torch.empty(50, dtype=torch.float64)
        assert seen.live_bytes == 100 * F32 + 50 * F64
        tail = first[90:]
        del first
        assert seen.live_bytes == 100 * F32 + 50 * F64  # the view holds the storage
        del tail
        assert seen.live_bytes == 50 * F64
        del second
        assert seen.live_bytes == 0
    assert seen.peak_live_bytes == 100 * F32 + 50 * F64


def test_peak_of_a_sequence_is_the_hand_computed_one() -> None:
    with track_allocations() as seen:
        a = torch.zeros(1000)  # 4000 live
        b = torch.zeros(500, dtype=torch.float64)  # 8000 live
        del a  # 4000 live
        c = torch.zeros(3000)  # 16000 live: the peak
        del b  # 12000 live
        d = c.to(torch.float64)  # 36000 live: the new peak
        del c, d  # 0 live
        e = torch.zeros(10)  # 40 live
    assert seen.peak_live_bytes == 36000
    assert seen.live_bytes == 40
    assert seen.total_bytes == 4000 + 4000 + 12000 + 24000 + 40
    largest = seen.largest
    assert largest is not None and (largest.shape, largest.nbytes) == ((3000,), 24000)
    del e


def test_reset_peak_starts_from_the_bytes_live_now() -> None:
    with track_allocations() as seen:
        big = torch.zeros(1000)
        del big
        small = torch.zeros(10)
        seen.reset_peak()
        assert seen.peak_live_bytes == 40
        other = torch.zeros(20)
    assert seen.peak_live_bytes == 120
    del small, other


def test_every_new_output_of_a_multi_output_op_is_counted() -> None:
    values = torch.randn(4, 7)
    with track_allocations() as seen:
        top, index = values.max(dim=1)
    found = [(a.shape, a.dtype, a.nbytes) for a in seen.allocations]
    assert len(found) == 2
    assert set(found) == {((4,), torch.float32, 4 * F32), ((4,), torch.int64, 4 * 8)}
    del top, index


def test_backward_ops_are_seen() -> None:
    leaf = torch.randn(9, 13, requires_grad=True)
    with track_allocations() as seen:
        (leaf * 3.0).sum().backward()
    shapes = [a.shape for a in seen.allocations if a.dtype == torch.float32]
    assert shapes.count((9, 13)) >= 2  # the forward product and the gradient


def test_figures_freeze_when_the_block_ends() -> None:
    with track_allocations() as seen:
        kept = torch.zeros(25)
    del kept
    assert seen.live_bytes == 25 * F32
    with seen.watch():
        torch.zeros(3)  # a closed tracker records nothing new
    assert len(seen.allocations) == 1


def test_largest_2d_and_max_rows_filter_by_dtype_and_width() -> None:
    with track_allocations() as seen:
        kept = [
            torch.zeros(30, 7),
            torch.zeros(50, 7, dtype=torch.bfloat16),
            torch.zeros(90, 8),
            torch.zeros(4, 30, 7),
            torch.zeros(12, 9),
        ]
    assert seen.max_rows(torch.float32, {7, 9}) == 30
    assert seen.max_rows(torch.bfloat16, {7}) == 50
    assert seen.max_rows(torch.float32, {11}) == 0
    found = seen.largest_2d(torch.float32, {9})
    assert found is not None and (found.shape, found.nbytes) == ((12, 9), 12 * 9 * F32)
    assert seen.largest_2d(torch.float64, {7}) is None
    assert len(kept) == 5


def test_a_mode_entered_in_one_thread_does_not_see_another_thread_unless_wrapped() -> None:
    """Dispatch modes are thread-local: the reason ``wrap`` and ``watch`` exist."""

    def allocate() -> None:
        torch.zeros(64, 3)

    def in_thread(target: object) -> None:
        thread = threading.Thread(target=target, name="worker")  # type: ignore[arg-type]
        thread.start()
        thread.join()

    with track_allocations() as seen:
        in_thread(allocate)
        assert seen.allocations == ()
        in_thread(seen.wrap(allocate))
    assert [(a.shape, a.thread) for a in seen.allocations] == [((64, 3), "worker")]
    assert seen.live_bytes == 0  # freed in the worker, counted by the shared tracker


def test_watchers_in_several_threads_feed_one_tracker() -> None:
    tracker = AllocationTracker()
    barrier = threading.Barrier(3)
    kept: list[torch.Tensor] = []

    def allocate(rows: int) -> None:
        with tracker.watch():
            kept.append(torch.zeros(rows, 10))
            barrier.wait()  # all three alive at once

    threads = [threading.Thread(target=allocate, args=(rows,)) for rows in (1, 2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert tracker.peak_live_bytes == 6 * 10 * F32
    kept.clear()
    assert tracker.live_bytes == 0
    tracker.close()


REAL, PADDED, SIZE, ROWS = 19, 24, 16, 12


def hidden_contract(role: str, world: int) -> tpl.LogprobContract:
    bounds = ((0, 24),) if world == 1 else ((0, 12), (12, 24))
    return tpl.LogprobContract(
        role=role,
        dtype="bf16",
        mask=tpl.MaskSpec(ROWS),
        sharding=tpl.ShardingSpec(0, world, bounds, REAL, PADDED),
        reduction=tpl.ReductionSpec("fixed_topology"),
        input_kind="hidden",
        hidden_size=SIZE,
    )


@pytest.mark.parametrize("world", [1, 2])
def test_fused_ranks_in_threads_never_hold_full_fp32_logits(
    world: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank threads of ``run_tp_hidden``, forward and backward: chunks only; logits path: N rows."""
    monkeypatch.setattr(fused_chunks, "CHUNK_ELEMENTS", 3 * REAL)
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(ROWS, SIZE, generator=gen).bfloat16().requires_grad_(True)
    weight = torch.randn(PADDED, SIZE, generator=gen).bfloat16().requires_grad_(True)
    targets = torch.randint(0, REAL, (ROWS,), generator=gen)
    contract = hidden_contract("train", world)
    widths = {REAL, PADDED, 12, 7}  # padded and live widths of every layout
    with track_allocations() as seen:
        results = tpl.run_tp_hidden(
            seen.wrap(torch_native_fused_logprob), hidden, weight, targets, contract
        )
        forward = seen.max_rows(torch.float32, widths)
        sum(r.selected_logp.float().sum() for r in results).backward()
    assert {a.thread for a in seen.allocations} >= {f"tp-rank-{r}" for r in range(world)}
    chunk = max(fused_chunks.chunk_rows(contract.with_rank(r)) for r in range(world))
    assert chunk < ROWS
    assert forward == seen.max_rows(torch.float32, widths) == chunk
    logits = (hidden.detach().float() @ weight.detach().float().T).bfloat16().requires_grad_(True)
    plain = tpl.LogprobContract(
        "train", "bf16", contract.mask, hidden_contract("train", 1).sharding, contract.reduction
    )
    with track_allocations() as native:
        torch_native_logprob(logits, targets, plain).selected_logp.float().sum().backward()
    assert native.max_rows(torch.float32, widths) == ROWS
