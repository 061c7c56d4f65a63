"""Triton backends, backward: exact gradients at TP 1..8, zero on padding and inactive rows,
the native backend's special values, lse not differentiable (CPU interpreter)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.native_cases import LAYOUTS, REAL, as_float64, bits, make_contract, random_inputs
from tests.helpers.triton_cases import BACKENDS
from tp_logprob.emulate import run_tp
from tp_logprob.kernels.native import torch_native_logprob
from tp_logprob.oracle.exact import exact_logprob_grad

pytestmark = pytest.mark.triton

MASK = np.array([True, True, False, True, True, False, True, True])
# Relative bound per element: fp32 compute, then one rounding to the logits dtype.
GRAD_TOLERANCE = {"fp32": 2e-6, "bf16": 2.0**-8, "fp16": 2.0**-11}


def tp_grad(
    op: object, logits: torch.Tensor, targets: torch.Tensor, bounds: object, **contract_args: object
) -> torch.Tensor:
    """The gradient TP training computes: every rank backprops its own replicated loss."""
    leaf = logits.clone().requires_grad_(True)
    contract = make_contract(bounds, role="train", **contract_args)  # type: ignore[arg-type]
    results = run_tp(op, leaf, targets, contract)  # type: ignore[arg-type]
    weights = torch.linspace(0.5, 2.0, logits.shape[0])
    sum((result.selected_logp.float() * weights).sum() for result in results).backward()
    assert leaf.grad is not None
    return leaf.grad


@pytest.mark.parametrize("layout", ["tp1", "tp2-padding-shard", "tp3-uneven", "tp8-mixed"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_gradient_matches_exact_oracle(backend: str, dtype: str, layout: str) -> None:
    logits, targets = random_inputs(21, 8, dtype=dtype, active_mask=MASK, scale=2.0)
    logits[:, REAL:] = float("nan")  # padding contents must not leak into the gradient
    logits[2, 0] = float("nan")  # nor an inactive row's
    args = {"num_tokens": 8, "active_mask": MASK, "dtype": dtype}
    grad = tp_grad(BACKENDS[backend], logits, targets, LAYOUTS[layout], **args)
    assert grad.dtype == logits.dtype
    weights = torch.linspace(0.5, 2.0, 8).double().numpy()[:, None]
    want = weights * exact_logprob_grad(
        as_float64(logits), targets.numpy(), active_mask=MASK, real_vocab_size=REAL
    )
    got = grad.double().numpy()
    tolerance = GRAD_TOLERANCE[dtype] * np.maximum(np.abs(want), 2.0**-8)
    bad = np.argwhere(~(np.abs(got - want) <= tolerance))
    assert bad.size == 0, f"{len(bad)} grads off, first at {bad[0].tolist()}: " + (
        f"{got[tuple(bad[0])]!r} vs {want[tuple(bad[0])]!r}"
    )
    assert (bits(grad[:, REAL:]) == 0).all(), "padding columns must get exactly +0.0"
    assert (bits(grad[~torch.from_numpy(MASK)]) == 0).all(), "inactive rows must get +0.0"
    native = tp_grad(torch_native_logprob, logits, targets, LAYOUTS[layout], **args)
    assert torch.allclose(grad.double(), native.double(), rtol=2 * GRAD_TOLERANCE[dtype], atol=1e-7)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_special_rows_get_the_native_backends_gradient(backend: str) -> None:
    """NaN and infinities: the same NaN pattern and values as torch_native and the oracle."""
    nan, inf = float("nan"), float("inf")
    rows = [
        [0, 1, nan, 2, 0, 0, 0, 0],  # NaN row: every live column NaN
        [0, 1, 2, 3, 0, inf, 0, 0],  # +inf: selected_logp NaN, so every live column NaN
        [-inf] * 8,  # all -inf: NaN
        [0, 1, -inf, 3, 0, 2, 0, 0],  # -inf column: probability 0
        [-inf] * 7 + [5.0],  # one finite column, the target: gradient 0
    ]
    logits = torch.tensor([[*row, nan, inf] for row in rows])
    targets = torch.tensor([0, 1, 3, 2, 7])
    bounds = ((0, 4), (4, 10))
    got = tp_grad(BACKENDS[backend], logits, targets, bounds, num_tokens=5, real=8)
    want = tp_grad(torch_native_logprob, logits, targets, bounds, num_tokens=5, real=8)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    exact = exact_logprob_grad(logits[:, :8].numpy(), targets.numpy(), real_vocab_size=8)
    assert np.array_equal(np.isnan(exact), torch.isnan(got[:, :8]).numpy())
    finite = ~torch.isnan(want)
    assert torch.allclose(got[finite], want[finite], rtol=4e-6, atol=1e-7)
    assert (bits(got[:, 8:]) == 0).all()


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_half_output_gradients_flow_in_fp32(backend: str) -> None:
    """bf16 outputs: the incoming gradient is widened, the logits' gradient is fp32 math."""
    logits, targets = random_inputs(4, 3, scale=2.0)
    out = tp_grad(
        BACKENDS[backend], logits, targets, LAYOUTS["tp2-width1"], num_tokens=3, output_dtype="bf16"
    )
    ref = tp_grad(BACKENDS[backend], logits, targets, LAYOUTS["tp2-width1"], num_tokens=3)
    assert torch.allclose(out, ref, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_lse_is_not_differentiable_and_infer_builds_no_graph(backend: str) -> None:
    logits, targets = random_inputs(3, 2)
    leaf = logits.requires_grad_(True)
    train = BACKENDS[backend](leaf, targets, make_contract(role="train", num_tokens=2))
    assert train.selected_logp.requires_grad and not train.lse.requires_grad
    infer = BACKENDS[backend](leaf, targets, make_contract(role="infer", num_tokens=2))
    assert infer.selected_logp.grad_fn is None
    hidden = BACKENDS[backend](
        leaf, targets, make_contract(role="train", num_tokens=2, export_lse=False)
    )
    assert hidden.lse is None and hidden.selected_logp.requires_grad


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_each_rank_writes_only_its_own_columns(backend: str) -> None:
    bounds = LAYOUTS["tp3-uneven"]
    logits, targets = random_inputs(2, 4, scale=2.0)
    contract = make_contract(bounds, role="train", num_tokens=4)
    leaf = logits.clone().requires_grad_(True)
    results = run_tp(BACKENDS[backend], leaf, targets, contract)
    results[1].selected_logp.sum().backward()
    assert leaf.grad is not None
    outside = torch.cat((leaf.grad[:, : bounds[1][0]], leaf.grad[:, bounds[1][1] :]), dim=1)
    assert (outside == 0).all() and (leaf.grad[:, bounds[1][0] : bounds[1][1]] != 0).any()
