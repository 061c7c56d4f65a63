"""The Triton backends' backward with a sampling support: torch_native's gradient of
``z_y - LSE_S`` (and of the entropy over ``S``) with ``S`` fixed, exactly 0 outside ``S``
(the target's column too), the raw gradient's bits with every rule off, NaN conventions
(CPU interpreter)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tp_logprob as tpl
from tests.helpers.native_cases import LAYOUTS, NAN, REAL, bits, random_inputs
from tests.helpers.processed_cases import kept_targets, scattered_keep
from tests.helpers.support_cases import live_z32, reference_support, support_contract
from tests.helpers.triton_cases import BACKENDS
from tests.kernels.test_native_processed import SPECIAL_LAYOUTS, special_contract, special_rows
from tp_logprob.emulate import run_tp
from tp_logprob.kernels.native import torch_native_logprob

pytestmark = pytest.mark.triton

MASK = np.array([True, True, False, True, True, True, False, True])
A = torch.tensor([1.0, -2.0, 0.5, -1.0, 4.0, 1.0, -0.5, 2.0])
B = torch.tensor([-1.0, 0.5, 2.0, 4.0, -0.25, -2.0, 1.0, -1.0])
RULES = {"top_k": 4, "top_p": 0.75, "min_p": 0.01}
TEMPERATURE = 0.8
GRAD_REL = 2e-5
"""Room beside torch_native's gradient: ``p (z - LSE + H)`` loses a few ulp of its terms."""


def tp_grad(
    op: object, logits: torch.Tensor, targets: torch.Tensor, contract: tpl.LogprobContract
) -> tuple[torch.Tensor, tpl.LogprobResult]:
    """The gradient of ``sum(A selected + B entropy)`` that TP training computes."""
    leaf = logits.clone().requires_grad_(True)
    results = run_tp(op, leaf, targets, contract)
    a, b = A[: len(logits)], B[: len(logits)]
    loss = sum((a * r.selected_logp).sum() for r in results)
    if contract.export_entropy:
        loss = loss + sum((b * r.entropy).sum() for r in results)
    loss.backward()  # type: ignore[union-attr]
    assert leaf.grad is not None
    return leaf.grad, results[0]


def train_contract(layout: str, support: tpl.SupportSpec, **fields: object) -> tpl.LogprobContract:
    return support_contract(
        LAYOUTS[layout],
        support,
        num_tokens=8,
        active_mask=MASK,
        role="train",
        temperature=TEMPERATURE,
        entropy=True,
        **fields,
    )


@pytest.mark.parametrize("mode", ["recomputed", "scattered"])
@pytest.mark.parametrize("layout", ["tp1", "tp3-uneven", "tp4-width1-padding"])
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_gradient_is_torch_natives_and_zero_outside_the_support(
    backend: str, layout: str, mode: str
) -> None:
    logits, _ = random_inputs(41, 8, active_mask=MASK, scale=2.0)
    logits[:, REAL:] = NAN
    if mode == "recomputed":
        support = tpl.SupportSpec(**RULES)  # type: ignore[arg-type]
        keep = reference_support(live_z32(logits, TEMPERATURE), **RULES).keep  # type: ignore[arg-type]
        targets = kept_targets(keep, 3, MASK)
        targets[1] = int(np.flatnonzero(~keep[1])[0])  # a target outside S: selected -inf
    else:
        keep = scattered_keep(8, 8)
        support = tpl.SupportSpec.from_mask(keep)
        targets = kept_targets(keep, 3, MASK)
    contract = train_contract(layout, support)
    got, result = tp_grad(BACKENDS[backend], logits, targets, contract)
    want, _ = tp_grad(torch_native_logprob, logits, targets, contract)
    if mode == "recomputed":
        assert result.selected_logp[1] == float("-inf")
    inside = torch.zeros_like(got, dtype=torch.bool)
    inside[:, :REAL] = torch.from_numpy(keep & MASK[:, None])
    assert (got[~inside] == 0).all(), "outside S (the target's column too), padding, inactive"
    bound = GRAD_REL * torch.clamp(want.abs(), min=2.0**-8)
    bad = torch.nonzero(inside & ~((got - want).abs() <= bound))
    assert bad.numel() == 0, (
        f"first at {bad[0].tolist()}: {got[tuple(bad[0])]} vs {want[tuple(bad[0])]}"
    )


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_all_rules_off_gradient_is_bitwise_the_raw_one(backend: str) -> None:
    logits, targets, active = special_rows()
    op = BACKENDS[backend]
    for layout, bounds in SPECIAL_LAYOUTS.items():
        grads = []
        for support in (None, tpl.SupportSpec(top_p=1.0)):
            leaf = logits.clone().requires_grad_(True)
            contract = special_contract(bounds, support, active, role="train")
            results = run_tp(op, leaf, targets, contract)
            sum((r.selected_logp - 0.5 * r.entropy).sum() for r in results).backward()  # type: ignore[union-attr]
            assert leaf.grad is not None
            grads.append(leaf.grad)
        assert torch.equal(bits(grads[1]), bits(grads[0])), layout


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_replayed_mask_gradient_equals_the_recomputed_one(backend: str) -> None:
    logits, _ = random_inputs(43, 8, active_mask=MASK, scale=3.0)
    keep = reference_support(live_z32(logits, TEMPERATURE), **RULES).keep  # type: ignore[arg-type]
    targets = kept_targets(keep, 5, MASK)
    grads = []
    for support in (tpl.SupportSpec(**RULES), tpl.SupportSpec.from_mask(keep)):  # type: ignore[arg-type]
        grads.append(
            tp_grad(BACKENDS[backend], logits, targets, train_contract("tp3-uneven", support))[0]
        )
    assert torch.equal(bits(grads[0]), bits(grads[1]))


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_undefined_rows_get_nan_on_every_live_column(backend: str) -> None:
    logits, targets = random_inputs(47, 3)
    logits[0, 4], logits[1, 9] = NAN, float("inf")
    logits[:, REAL:] = NAN
    contract = support_contract(
        LAYOUTS["tp3-uneven"], tpl.SupportSpec(top_k=3), num_tokens=3, role="train"
    )
    grad, _ = tp_grad(BACKENDS[backend], logits, targets, contract)
    assert torch.isnan(grad[:2, :REAL]).all() and (grad[:, REAL:] == 0).all()
    assert torch.isfinite(grad[2]).all() and (grad[2, :REAL] != 0).sum() == 3


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_non_finite_support_lse_gives_nan_on_the_support_only(backend: str) -> None:
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
    grad, _ = tp_grad(BACKENDS[backend], logits, targets, contract)
    inside = torch.zeros_like(grad, dtype=torch.bool)
    inside[:, :REAL] = torch.from_numpy(keep)
    assert torch.isnan(grad[:3][inside[:3]]).all()
    assert (grad[~inside] == 0).all()
    assert torch.isfinite(grad[3]).all() and grad[3, 3] != 0


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_support_outputs_are_not_differentiable(backend: str) -> None:
    logits, targets = random_inputs(3, 2)
    leaf = logits.requires_grad_(True)
    for support in (tpl.SupportSpec(top_k=2), tpl.SupportSpec.from_mask(np.ones((2, REAL), bool))):
        contract = support_contract(LAYOUTS["tp1"], support, num_tokens=2, role="train")
        result = BACKENDS[backend](leaf, targets, contract)
        assert result.selected_logp.requires_grad
        for name in ("lse", "support_lse", "support_size", "support_threshold"):
            value = getattr(result, name)
            assert value is None or not value.requires_grad, name
