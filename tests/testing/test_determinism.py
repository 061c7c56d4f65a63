"""``assert_batch_invariant`` and ``assert_bitwise_across_tp``: built-in backends that claim the
scope pass; ops made to depend on the batch or the TP degree fail naming rows and positions."""

from __future__ import annotations

import os
from typing import Any

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest

from tests.testing.helpers import batch
from tp_logprob.contract import LogprobContract
from tp_logprob.errors import LogprobContractError
from tp_logprob.kernels.native import torch_native_logprob
from tp_logprob.result import LogprobResult
from tp_logprob.testing import assert_batch_invariant, assert_bitwise_across_tp

B = batch(rows=5, width=64)


def first_row_leaks(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """selected_logp, plus a trace of the batch's first row: right only where that row is."""
    logp = torch.log_softmax(logits.float(), dim=-1).gather(1, targets[:, None])[:, 0]
    return logp + logits[0, 0].float() * 2.0**-20


def tp_shifted(
    local_logits: torch.Tensor, targets: torch.Tensor, contract: LogprobContract, group: Any = None
) -> LogprobResult:
    """triton_exact_sum, then a shift that only a TP degree above 2 sees (in rows 1 and 3)."""
    from tp_logprob.kernels.triton.exact_sum import triton_exact_sum_logprob

    result = triton_exact_sum_logprob(local_logits, targets, contract, group=group)
    world = contract.sharding.tp_world_size
    shift = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0]) * 2.0**-18 * (world > 2)
    return LogprobResult(result.selected_logp + shift, result.lse)


interpreted = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="runs the Triton kernels (interpreted on CPU)",
)


def test_torch_native_is_batch_invariant() -> None:
    assert_batch_invariant("torch_native", B.logits, B.targets)
    assert_batch_invariant(torch_native_logprob, B.logits, B.targets, active_mask=[True] * 5)


def test_an_op_that_reads_another_row_is_caught_naming_rows_and_positions() -> None:
    with pytest.raises(AssertionError) as failure:
        assert_batch_invariant(first_row_leaks, B.logits, B.targets)
    text = str(failure.value)
    # Reversed, row 4 comes first: every other row then sees row 4's logit, not row 0's.
    assert text.startswith(
        "assert_batch_invariant: a row's bits depend on the rest of the batch (the batch reversed)"
    )
    assert "op            first_row_leaks" in text
    assert "batch         rows [4, 3, 2, 1, 0] (the batch reversed) against the whole batch" in text
    assert "differ        rows [4, 3, 2, 1, 0] at positions [0, 1, 2, 3, 4] (5 of 5)" in text
    assert "in the batch  row 4: " in text and "(f32 bits 0x" in text


@pytest.mark.triton
@interpreted
def test_triton_exact_sum_is_bitwise_across_tp() -> None:
    pytest.importorskip("triton")
    from tp_logprob.kernels.triton.exact_sum import triton_exact_sum_logprob

    b = batch(rows=3, width=24)
    assert_bitwise_across_tp(triton_exact_sum_logprob, b.logits, b.targets, tp_degrees=(1, 2, 3))


@pytest.mark.triton
@interpreted
def test_an_op_that_changes_with_the_tp_degree_is_caught() -> None:
    pytest.importorskip("triton")
    with pytest.raises(AssertionError) as failure:
        assert_bitwise_across_tp(tp_shifted, B.logits, B.targets, tp_degrees=(1, 2, 4))
    text = str(failure.value)
    assert text.startswith(
        "assert_bitwise_across_tp: layouts tp=1 [(0, 64)] and tp=4 "
        "[(0, 16), (16, 32), (32, 48), (48, 64)] give other bits"
    )
    assert "op      tp_shifted" in text
    assert "output  selected_logp" in text
    assert "differ  rows [1, 3] at positions [1, 3] (2 of 5)" in text
    assert "tp=1    row 1: " in text and "tp=4    row 1: " in text


def test_fixed_topology_sums_are_caught_across_tp() -> None:
    """torch_native's per-shard fp32 sums change with the layout: the raw op is caught."""
    with pytest.raises(AssertionError, match=r"layouts tp=1 \[\(0, 64\)\] and tp=\d .*give other"):
        assert_bitwise_across_tp(torch_native_logprob, B.logits, B.targets, tp_degrees=(1, 2, 4))


def test_a_backend_without_the_scope_is_refused_by_dispatch() -> None:
    from tp_logprob.errors import LogprobDispatchError

    with pytest.raises(LogprobDispatchError, match=r"'cross_tp_bitwise' not met"):
        assert_bitwise_across_tp("torch_native", B.logits, B.targets)


def test_a_plain_op_cannot_be_sharded_and_tp_degrees_are_checked() -> None:
    with pytest.raises(LogprobContractError, match=r"takes \(logits, targets\); across TP"):
        assert_bitwise_across_tp(first_row_leaks, B.logits, B.targets)
    with pytest.raises(LogprobContractError, match=r"tp_degrees=\(1,\): expected two or more"):
        assert_bitwise_across_tp(tp_shifted, B.logits, B.targets, tp_degrees=(1,))
    with pytest.raises(LogprobContractError, match=r"targets\[0\]=64: outside"):
        assert_batch_invariant(first_row_leaks, B.logits, np.full(5, 64))
