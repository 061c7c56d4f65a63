"""torch_native's backward with a sampling support: the gradient of ``z_y - LSE_S`` (and of
the entropy over ``S``) with ``S`` fixed, exactly 0 outside ``S``; float64 gradcheck."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import tp_logprob as tpl
from tests.helpers.native_cases import LAYOUTS, NAN, REAL, as_float64, bits, random_inputs
from tests.helpers.support_cases import (
    live_z32,
    masked_logits,
    reference_support,
    support_contract,
)
from tests.kernels.test_native_processed import SPECIAL_LAYOUTS, special_contract, special_rows
from tp_logprob.emulate import run_tp
from tp_logprob.kernels.native import native_logprob, torch_native_logprob
from tp_logprob.oracle import exact_entropy_grad, exact_logprob_grad

MASK = np.array([True, True, False, True, True, True, False, True])
A = torch.tensor([1.0, -2.0, 0.5, -1.0, 4.0, 1.0, -0.5, 2.0])
B = torch.tensor([-1.0, 0.5, 2.0, 4.0, -0.25, -2.0, 1.0, -1.0])
RULES = {
    "min_p": {"min_p": 0.05},
    "top_k": {"top_k": 4},
    "top_p": {"top_p": 0.75},
    "all-three": {"min_p": 0.01, "top_k": 7, "top_p": 0.9},
}


def tp_grad(
    logits: torch.Tensor, targets: torch.Tensor, contract: tpl.LogprobContract
) -> tuple[torch.Tensor, tpl.LogprobResult]:
    """The gradient of ``sum(A selected + B entropy)`` that TP training computes."""
    leaf = logits.clone().requires_grad_(True)
    results = run_tp(torch_native_logprob, leaf, targets, contract)
    a, b = A[: len(logits)], B[: len(logits)]
    loss = sum((a * r.selected_logp).sum() for r in results)
    if contract.export_entropy:
        loss = loss + sum((b * r.entropy).sum() for r in results)
    loss.backward()  # type: ignore[union-attr]
    assert leaf.grad is not None
    return leaf.grad, results[0]


@pytest.mark.parametrize("rules", list(RULES.values()), ids=list(RULES))
@pytest.mark.parametrize("layout", ["tp1", "tp3-uneven", "tp8-mixed"])
def test_gradient_is_the_exact_one_on_the_support_and_zero_outside(
    layout: str, rules: dict[str, float]
) -> None:
    temperature = 0.8
    logits, targets = random_inputs(41, 8, active_mask=MASK, scale=2.0)
    logits[:, REAL:] = NAN
    keep = reference_support(live_z32(logits, temperature), **rules).keep  # type: ignore[arg-type]
    targets[1] = int(np.flatnonzero(~keep[1])[0])  # a target outside S: selected_logp -inf
    contract = support_contract(
        LAYOUTS[layout],
        tpl.SupportSpec(**rules),  # type: ignore[arg-type]
        num_tokens=8,
        active_mask=MASK,
        role="train",
        temperature=temperature,
        entropy=True,
    )
    grad, result = tp_grad(logits, targets, contract)
    assert result.selected_logp[1] == float("-inf")
    masked = as_float64(masked_logits(logits, keep))
    args = {"active_mask": MASK, "real_vocab_size": REAL, "temperature": temperature}
    want = A.double().numpy()[:, None] * exact_logprob_grad(masked, targets.numpy(), **args)
    want += B.double().numpy()[:, None] * exact_entropy_grad(masked, **args)
    got = grad.double().numpy()
    inside = np.zeros_like(got, dtype=bool)
    inside[:, :REAL] = keep & MASK[:, None]
    # The entropy term p (z - LSE + H) loses a few ulp of |z - LSE| and |H| (a few units).
    bound = 2e-5 * np.maximum(np.abs(want), 2.0**-8)
    bad = np.argwhere(inside & ~(np.abs(got - want) <= bound))
    assert bad.size == 0, (
        f"first at {bad[0].tolist()}: {got[tuple(bad[0])]} vs {want[tuple(bad[0])]}"
    )
    assert (got[~inside] == 0).all(), "outside S (the target's column too), padding, inactive rows"


def test_all_rules_off_gradient_is_bitwise_the_raw_one() -> None:
    logits, targets, active = special_rows()
    leaf_raw = logits.clone().requires_grad_(True)
    leaf_off = logits.clone().requires_grad_(True)
    for layout, bounds in SPECIAL_LAYOUTS.items():
        for leaf, support in ((leaf_raw, None), (leaf_off, tpl.SupportSpec(top_p=1.0))):
            contract = special_contract(bounds, support, active, role="train")
            leaf.grad = None
            results = run_tp(torch_native_logprob, leaf, targets, contract)
            loss = sum((r.selected_logp - 0.5 * r.entropy).sum() for r in results)
            loss.backward()  # type: ignore[union-attr]
        assert leaf_raw.grad is not None and leaf_off.grad is not None
        assert torch.equal(bits(leaf_off.grad), bits(leaf_raw.grad)), layout


def test_replayed_mask_gradient_equals_the_recomputed_one() -> None:
    logits, _ = random_inputs(43, 8, active_mask=MASK, scale=3.0)
    rules = {"top_k": 6, "top_p": 0.85}
    keep = reference_support(live_z32(logits), **rules).keep  # type: ignore[arg-type]
    targets = torch.tensor([int(np.flatnonzero(row)[-1]) for row in keep])
    grads = []
    for support in (tpl.SupportSpec(**rules), tpl.SupportSpec.from_mask(keep)):  # type: ignore[arg-type]
        contract = support_contract(
            LAYOUTS["tp3-uneven"], support, num_tokens=8, role="train", entropy=True
        )
        grads.append(tp_grad(logits, targets, contract)[0])
    assert torch.equal(bits(grads[0]), bits(grads[1]))


def test_undefined_rows_get_nan_on_every_live_column() -> None:
    logits, targets = random_inputs(47, 3)
    logits[0, 4], logits[1, 9] = NAN, float("inf")
    logits[:, REAL:] = NAN
    contract = support_contract(
        LAYOUTS["tp3-uneven"], tpl.SupportSpec(top_k=3), num_tokens=3, role="train"
    )
    grad, _ = tp_grad(logits, targets, contract)
    assert torch.isnan(grad[:2, :REAL]).all() and (grad[:, REAL:] == 0).all()
    assert torch.isfinite(grad[2]).all() and (grad[2, :REAL] != 0).sum() == 3


def test_support_outputs_are_not_differentiable() -> None:
    logits, targets = random_inputs(3, 2)
    leaf = logits.requires_grad_(True)
    contract = support_contract(
        LAYOUTS["tp1"], tpl.SupportSpec(top_k=2), num_tokens=2, role="train"
    )
    result = torch_native_logprob(leaf, targets, contract)
    assert result.selected_logp.requires_grad
    for name in ("lse", "support_lse", "support_size", "support_threshold"):
        assert not getattr(result, name).requires_grad, name


def _float64_op(
    logits: torch.Tensor, targets: torch.Tensor, contract: Any, group: Any = None
) -> tpl.LogprobResult:
    """The real op path without the contract's dtype check, computing in float64."""
    return native_logprob(logits, targets, contract, group, output_dtype=torch.float64)


def well_separated(seed: int, rows: int, rules: dict[str, float]) -> tuple[torch.Tensor, Any]:
    """float64 logits whose support does not move under gradcheck's perturbations, and a
    target inside each row's support."""
    logits, _ = random_inputs(seed, rows, scale=2.0)
    want = reference_support(live_z32(logits), **rules)  # type: ignore[arg-type]
    assert (want.margin > 1e-4).all()  # eps = 1e-6 moves a mass by ~1e-6 of itself
    targets = torch.tensor([int(np.flatnonzero(row)[0]) for row in want.keep])
    return logits.double(), targets


@pytest.mark.parametrize("replayed", [False, True], ids=["recomputed", "replayed"])
def test_gradcheck_float64_single_rank(replayed: bool) -> None:
    rules = {"min_p": 0.02, "top_k": 8, "top_p": 0.9}
    logits, targets = well_separated(53, 4, rules)
    support = tpl.SupportSpec(**rules)  # type: ignore[arg-type]
    if replayed:
        keep = reference_support(live_z32(logits.float()), **rules).keep  # type: ignore[arg-type]
        support = tpl.SupportSpec.from_mask(keep)
    mask = np.array([True, False, True, True])
    contract = support_contract(
        LAYOUTS["tp1"],
        support,
        num_tokens=4,
        role="train",
        active_mask=mask,
        temperature=0.9,
        entropy=True,
    )
    leaf = logits.requires_grad_(True)

    def outputs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        result = _float64_op(x, targets, contract)
        return result.selected_logp, result.entropy

    assert torch.autograd.gradcheck(outputs, (leaf,), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_gradcheck_float64_one_rank_of_three(rank: int) -> None:
    """Rank r's outputs as a function of rank r's columns (the others fixed)."""
    rules = {"top_k": 6, "top_p": 0.8}
    bounds = LAYOUTS["tp3-uneven"]
    logits, targets = well_separated(59, 3, rules)
    contract = support_contract(
        bounds,
        tpl.SupportSpec(**rules),
        num_tokens=3,
        role="train",
        entropy=True,  # type: ignore[arg-type]
    )
    start, end = bounds[rank]
    local = logits[:, start:end].clone().requires_grad_(True)

    def rank_outputs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        joined = torch.cat((logits[:, :start], x, logits[:, end:]), dim=1)
        result = run_tp(_float64_op, joined, targets, contract)[rank]
        return result.selected_logp, result.entropy

    assert torch.autograd.gradcheck(rank_outputs, (local,), eps=1e-6, atol=1e-7)


def test_a_non_finite_support_lse_gives_nan_on_the_support_only() -> None:
    """A NaN or +inf inside a replayed S (or S all -inf): NaN on S's columns, 0 elsewhere;
    a NaN outside S changes nothing."""
    logits, _ = random_inputs(61, 4)
    keep = np.zeros((4, REAL), dtype=bool)
    keep[:, 2:9] = True
    logits[0, 4], logits[1, 7], logits[2, 2:9] = NAN, float("inf"), float("-inf")
    logits[3, 12] = NAN  # outside S
    targets = torch.tensor([3, 3, 3, 3])
    contract = support_contract(
        LAYOUTS["tp3-uneven"], tpl.SupportSpec.from_mask(keep), num_tokens=4, role="train"
    )
    grad, _ = tp_grad(logits, targets, contract)
    inside = torch.zeros_like(grad, dtype=torch.bool)
    inside[:, :REAL] = torch.from_numpy(keep)
    assert torch.isnan(grad[:3][inside[:3]]).all()
    assert (grad[~inside] == 0).all()
    assert torch.isfinite(grad[3]).all() and grad[3, 3] != 0
