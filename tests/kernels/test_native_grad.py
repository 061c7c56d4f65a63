"""torch_native backward: exact gradients, per-rank slices, float64 gradcheck, no graph in infer."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers.native_cases import LAYOUTS, REAL, as_float64, make_contract, random_inputs
from tp_logprob.emulate import run_tp
from tp_logprob.kernels.native import native_logprob, torch_native_logprob
from tp_logprob.oracle import exact_logprob_grad

MASK = np.array([True, True, False, True, True, False, True, True])
GRAD_TOLERANCE = {"fp32": 2e-6, "bf16": 2.0**-8, "fp16": 2.0**-11}


def tp_grad(
    logits: torch.Tensor, targets: torch.Tensor, layout: str, **contract_args: object
) -> tuple[torch.Tensor, list[Any]]:
    """The gradient TP training computes: every rank backprops its own replicated loss."""
    leaf = logits.clone().requires_grad_(True)
    contract = make_contract(LAYOUTS[layout], role="train", **contract_args)  # type: ignore[arg-type]
    results = run_tp(torch_native_logprob, leaf, targets, contract)
    sum(result.selected_logp.float().sum() for result in results).backward()
    assert leaf.grad is not None
    return leaf.grad, results


@pytest.mark.parametrize("layout", ["tp1", "tp2-padding-shard", "tp3-uneven", "tp8-mixed"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_gradient_matches_exact_oracle(layout: str, dtype: str) -> None:
    logits, targets = random_inputs(21, 8, dtype=dtype, active_mask=MASK, scale=2.0)
    logits[:, REAL:] = float("nan")  # padding contents must not leak into the gradient
    grad, _ = tp_grad(logits, targets, layout, num_tokens=8, active_mask=MASK, dtype=dtype)
    assert grad.dtype == logits.dtype
    want = exact_logprob_grad(
        as_float64(logits), targets.numpy(), active_mask=MASK, real_vocab_size=REAL
    )
    got = grad.double().numpy()
    tolerance = GRAD_TOLERANCE[dtype] * np.maximum(np.abs(want), 2.0**-8)
    bad = np.argwhere(~(np.abs(got - want) <= tolerance))
    assert bad.size == 0, f"{len(bad)} grads off, first at {bad[0].tolist()}: " + (
        f"{got[tuple(bad[0])]!r} vs {want[tuple(bad[0])]!r}"
    )
    assert (got[:, REAL:] == 0).all(), "padding columns must get exactly zero gradient"
    assert (got[~MASK] == 0).all(), "inactive rows must get exactly zero gradient"


def test_each_rank_writes_only_its_own_columns() -> None:
    bounds = LAYOUTS["tp3-uneven"]
    logits, targets = random_inputs(2, 4, scale=2.0)
    full, _ = tp_grad(logits, targets, "tp3-uneven", num_tokens=4)
    contract = make_contract(bounds, role="train", num_tokens=4)
    for rank, (start, end) in enumerate(bounds):
        leaf = logits.clone().requires_grad_(True)
        results = run_tp(torch_native_logprob, leaf, targets, contract)
        results[rank].selected_logp.sum().backward()
        assert leaf.grad is not None
        assert torch.equal(leaf.grad[:, start:end], full[:, start:end])
        outside = torch.cat((leaf.grad[:, :start], leaf.grad[:, end:]), dim=1)
        assert (outside == 0).all(), f"rank {rank}'s graph reached another rank's columns"


def test_lse_is_not_differentiable() -> None:
    logits, targets = random_inputs(3, 2)
    leaf = logits.requires_grad_(True)
    result = torch_native_logprob(leaf, targets, make_contract(role="train", num_tokens=2))
    assert result.selected_logp.requires_grad
    assert not result.lse.requires_grad


def test_infer_role_builds_no_graph() -> None:
    logits, targets = random_inputs(3, 2)
    leaf = logits.requires_grad_(True)
    result = torch_native_logprob(leaf, targets, make_contract(role="infer", num_tokens=2))
    assert not result.selected_logp.requires_grad and result.selected_logp.grad_fn is None


def test_gradcheck_float64_single_rank() -> None:
    mask = np.array([True, False, True, True])
    contract = make_contract(role="train", num_tokens=4, active_mask=mask)
    logits, targets = random_inputs(8, 4, active_mask=mask, scale=1.5)
    leaf = logits.double().requires_grad_(True)

    def selected(x: torch.Tensor) -> torch.Tensor:
        result = native_logprob(x, targets, contract, output_dtype=torch.float64)
        return result.selected_logp

    assert torch.autograd.gradcheck(selected, (leaf,), eps=1e-6, atol=1e-7)


def _float64_op(
    logits: torch.Tensor, targets: torch.Tensor, contract: object, group: object = None
) -> object:
    """The real op path without the contract's dtype check, computing and returning float64."""
    return native_logprob(logits, targets, contract, group, output_dtype=torch.float64)  # type: ignore[arg-type]


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_gradcheck_float64_one_rank_of_three(rank: int) -> None:
    """Rank r's output as a function of rank r's columns (the others fixed): TP's Jacobian."""
    bounds = LAYOUTS["tp3-uneven"]  # rank 1 is one column wide, rank 2 holds the padding
    contract = make_contract(bounds, role="train", num_tokens=3)
    logits, targets = random_inputs(4, 3, scale=1.5)
    full = logits.double()
    start, end = bounds[rank]
    local = full[:, start:end].clone().requires_grad_(True)

    def rank_output(x: torch.Tensor) -> torch.Tensor:
        joined = torch.cat((full[:, :start], x, full[:, end:]), dim=1)
        return run_tp(_float64_op, joined, targets, contract)[rank].selected_logp

    assert torch.autograd.gradcheck(rank_output, (local,), eps=1e-6, atol=1e-7)
