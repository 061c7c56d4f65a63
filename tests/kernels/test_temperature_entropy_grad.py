"""Temperature and entropy, backward, on all three backends: the gradient of
``a * selected_logp + b * entropy`` against the exact oracle at TP 1..3, special rows,
per-rank columns, the ``T = 2^k`` identity, float64 gradcheck (Triton on the CPU interpreter)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import tp_logprob as tpl
from tests.helpers.native_cases import INF, LAYOUTS, NAN, REAL, as_float64, bits, random_inputs
from tests.helpers.rl_cases import (
    BACKEND_PARAMS,
    OPS,
    backend_table,
    exact_outputs,
    live_z,
    rl_contract,
    z_row_max,
)
from tp_logprob.emulate import run_tp
from tp_logprob.kernels.native import native_logprob
from tp_logprob.oracle import exact_entropy_grad, exact_logprob_grad

MASK = np.array([True, True, False, True, True, False, True, True])
# Signed powers of two per row: the weighted gradients are exact scalings.
A = np.array([1.0, -2.0, 0.5, -1.0, 4.0, 1.0, -0.5, 2.0])
B = np.array([-1.0, 0.5, 2.0, 4.0, -0.25, -2.0, 1.0, -1.0])
U = 2.0**-24
# Unit roundoff of the gradient's final rounding to the logits dtype.
OUTPUT_UNIT = {"fp32": 2.0**-24, "bf16": 2.0**-8, "fp16": 2.0**-11}


def tp_grad(
    op: Any,
    logits: torch.Tensor,
    targets: torch.Tensor,
    contract: tpl.LogprobContract,
    a: Any,
    b: Any,
) -> torch.Tensor:
    """The gradient TP training computes: every rank backprops its own replicated loss."""
    leaf = logits.clone().requires_grad_(True)
    results = run_tp(op, leaf, targets, contract)
    wa, wb = torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32)
    loss = sum((wa * r.selected_logp.float()).sum() for r in results)
    if contract.export_entropy:
        loss = loss + sum((wb * r.entropy.float()).sum() for r in results)
    loss.backward()
    assert leaf.grad is not None
    return leaf.grad


def exact_grad(
    logits: torch.Tensor,
    targets: torch.Tensor,
    contract: tpl.LogprobContract,
    a: np.ndarray,
    b: np.ndarray,
    real: int = REAL,
) -> np.ndarray:
    x, mask, t = as_float64(logits), contract.mask.dense(), contract.temperature
    selected = exact_logprob_grad(
        x, targets.numpy(), active_mask=mask, real_vocab_size=real, temperature=t
    )
    entropy = exact_entropy_grad(x, active_mask=mask, real_vocab_size=real, temperature=t)
    return a[:, None] * selected + b[:, None] * entropy


def grad_bound(
    backend: str,
    logits: torch.Tensor,
    targets: torch.Tensor,
    contract: tpl.LogprobContract,
    a: np.ndarray,
    b: np.ndarray,
    want: np.ndarray,
    real: int = REAL,
) -> np.ndarray:
    """A bound on ``|grad_kernel - grad_exact|`` on the live columns of finite rows.

    The kernel forms ``(a ([v == t] - p) - b p (c + H)) / T`` in fp32 with
    ``c = fl(z - lse_k)`` and ``p = exp(c)``, from its own ``lse_k`` and ``H_k``
    (each within the forward tolerance ``e_l``, ``e_h``). So ``|c - (z - lse)| <=
    e_l + u |z - lse|``, ``p`` is off by ``p (that + 8u)`` (exp within 3 ulp, plus
    the products), ``c + H`` by ``that + e_h + 2u (|c| + |H|)``; then one division by
    ``T`` and the rounding to the logits dtype. Doubled for the bound's own slack.
    """
    _, lse, entropy = exact_outputs(logits, targets, contract, real)
    z = live_z(logits, contract.temperature, real)
    table = backend_table(backend, contract, real)
    # Inactive rows must be exactly 0, and NaN rows NaN: no slack for either.
    finite = np.isfinite(lse) & np.isfinite(entropy) & contract.mask.dense()
    lse_f, h = np.where(finite, lse, 0.0)[:, None], np.where(finite, entropy, 0.0)[:, None]
    row_max = np.where(finite, z_row_max(z), 0.0)
    e_l = table.lse_bound(lse_f[:, 0], row_max=row_max)[:, None]
    e_h = table.entropy_bound(h[:, 0], lse=lse_f[:, 0], row_max=row_max)[:, None]
    with np.errstate(invalid="ignore", over="ignore"):
        centred = np.where(np.isfinite(z), z - lse_f, -np.inf)
        p = np.exp(centred)
        c = np.where(p > 0, np.abs(centred), 0.0)
        d_centred = e_l + U * c
        d_p = p * (d_centred + 8 * U)
        d_sum = d_centred + e_h + 2 * U * (c + np.abs(h))
        spread = np.where(p > 0, np.abs(centred + h), 0.0)
    error = np.abs(a)[:, None] * d_p + np.abs(b)[:, None] * (d_p * spread + p * d_sum)
    error[~finite] = 0.0
    bound = np.zeros_like(want)
    unit = OUTPUT_UNIT[contract.dtype.value]
    live = error / contract.temperature_fp32 * (1 + 4 * U) + unit * np.abs(want[:, :real])
    bound[:, :real] = 2.0 * live + 2.0**-140
    return bound


def assert_close(got: torch.Tensor, want: np.ndarray, bound: np.ndarray, what: str) -> None:
    g = got.double().numpy()
    ok = np.isnan(want) & np.isnan(g) | (np.abs(g - want) <= bound)
    bad = np.argwhere(~ok)
    assert bad.size == 0, f"{what}: {len(bad)} grads off, first at {bad[0].tolist()}: " + (
        f"{g[tuple(bad[0])]!r} vs {want[tuple(bad[0])]!r} (bound {bound[tuple(bad[0])]!r})"
    )


@pytest.mark.parametrize(
    ("layout", "dtype", "temperature"),
    [
        ("tp1", "fp32", 0.7),
        ("tp2-padding-shard", "bf16", 1.0),
        ("tp2-padding-shard", "fp32", 2.5),
        ("tp3-uneven", "fp16", 2.5),
        ("tp3-uneven", "bf16", 0.7),
    ],
)
@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_gradient_matches_exact_oracle(
    backend: str, layout: str, dtype: str, temperature: float
) -> None:
    logits, targets = random_inputs(21, 8, dtype=dtype, active_mask=MASK, scale=2.0)
    logits[:, REAL:] = NAN  # padding contents must not leak into the gradient
    logits[2, 0] = NAN  # nor an inactive row's
    logits[4, 1:3] = -INF  # -inf logits: p = 0, dH/dz = 0, never 0 * -inf
    contract = rl_contract(
        LAYOUTS[layout],
        temperature=temperature,
        role="train",
        num_tokens=8,
        active_mask=MASK,
        dtype=dtype,
    )
    grad = tp_grad(OPS[backend], logits, targets, contract, A, B)
    assert grad.dtype == logits.dtype
    want = exact_grad(logits, targets, contract, A, B)
    assert np.isfinite(want).all()
    bound = grad_bound(backend, logits, targets, contract, A, B, want)
    assert_close(grad, want, bound, backend)
    assert (bits(grad[:, REAL:]) == 0).all(), "padding columns must get exactly +0.0"
    assert (bits(grad[~torch.from_numpy(MASK)]) == 0).all(), "inactive rows must get +0.0"


SPECIAL_ROWS = {
    # name: 8 live logits, target, active
    "minus-inf-columns": ([0.0, 1.0, -INF, 3.0, -INF, 2.0, 0.5, -INF], 3, True),
    "one-shard-all-minus-inf": ([-INF] * 4 + [1.0, 2.0, 3.0, 4.0], 6, True),
    "one-finite-column": ([-INF] * 7 + [5.0], 7, True),
    "minus-inf-target": ([0.0, 1.0, 2.0, -INF, 0.0, 1.0, 2.0, 3.0], 3, True),
    "nan-row": ([0.0, 1.0, NAN, 2.0, 0.0, 0.0, 0.0, 0.0], 0, True),
    "plus-inf-row": ([0.0, 1.0, 2.0, 3.0, 0.0, INF, 0.0, 0.0], 1, True),
    "all-minus-inf": ([-INF] * 8, 3, True),
    "inactive-nan-row": ([0.0, NAN, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], -100, False),
    "inactive-all-minus-inf": ([-INF] * 8, -100, False),
}


@pytest.mark.parametrize(
    ("bounds", "temperature"),
    [(((0, 10),), 1.0), (((0, 4), (4, 10)), 0.5), (((0, 1), (1, 4), (4, 8), (8, 10)), 3.0)],
    ids=["tp1", "tp2", "tp4-padding-shard"],
)
@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_special_rows_gradient(
    backend: str, bounds: tuple[tuple[int, int], ...], temperature: float
) -> None:
    """-inf logits and padding garbage: finite wherever the exact gradient is finite, NaN
    exactly on the NaN rows (as the oracle and torch's log_softmax backward), 0 on padding
    and inactive rows."""
    rows = list(SPECIAL_ROWS.values())
    logits = torch.tensor([[*row, NAN, INF] for row, _, _ in rows], dtype=torch.float32)
    targets = torch.tensor([target for _, target, _ in rows])
    mask = np.array([active for _, _, active in rows])
    a = np.resize(A, len(rows))
    b = np.resize(B, len(rows))
    contract = rl_contract(
        bounds,
        temperature=temperature,
        role="train",
        num_tokens=len(rows),
        active_mask=mask,
        real=8,
    )
    grad = tp_grad(OPS[backend], logits, targets, contract, a, b)
    want = exact_grad(logits, targets, contract, a, b, real=8)
    got = grad.double().numpy()
    for index, name in enumerate(SPECIAL_ROWS):
        nan = np.isnan(want[index])
        assert np.array_equal(np.isnan(got[index]), nan), f"{name}: {got[index]} vs {want[index]}"
        assert np.isfinite(got[index][~nan]).all(), f"{name}: {got[index]}"
    finite_rows = ~np.isnan(want).any(axis=1)
    bound = grad_bound(backend, logits, targets, contract, a, b, np.nan_to_num(want), real=8)
    assert_close(grad[finite_rows], want[finite_rows], bound[finite_rows], backend)
    assert (bits(grad[:, 8:]) == 0).all(), "padding columns must get exactly +0.0"
    assert (bits(grad[~torch.from_numpy(mask)]) == 0).all(), "inactive rows must get +0.0"
    one_finite = list(SPECIAL_ROWS).index("one-finite-column")
    assert (got[one_finite] == 0).all(), "one finite live value: entropy and logprob are constant"


@pytest.mark.parametrize("rank", [1, 2])
@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_each_rank_writes_only_its_own_columns(backend: str, rank: int) -> None:
    """Rank 1 holds one column, rank 2 the rest and the padding: each rank's entropy
    backward reaches its own columns only, with the exact values there."""
    bounds = LAYOUTS["tp3-uneven"]
    logits, targets = random_inputs(2, 4, scale=2.0)
    contract = rl_contract(bounds, temperature=0.8, role="train", num_tokens=4)
    leaf = logits.clone().requires_grad_(True)
    results = run_tp(OPS[backend], leaf, targets, contract)
    results[rank].entropy.sum().backward()
    assert leaf.grad is not None
    start, end = bounds[rank]
    outside = torch.cat((leaf.grad[:, :start], leaf.grad[:, end:]), dim=1)
    assert (bits(outside) == 0).all(), f"rank {rank}'s graph reached another rank's columns"
    ones, zeros = np.ones(4), np.zeros(4)
    want = exact_grad(logits, targets, contract, zeros, ones)
    bound = grad_bound(backend, logits, targets, contract, zeros, ones, want)
    mine = slice(start, end)
    assert_close(leaf.grad[:, mine], want[:, mine], bound[:, mine], f"{backend} rank {rank}")
    assert (leaf.grad[:, start : min(end, REAL)] != 0).all()


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_a_loss_without_one_output_gets_the_other_outputs_gradient(backend: str) -> None:
    """Entropy alone, and selected_logp alone with entropy exported (the unused output's
    gradient is zero), match the oracle; the latter equals the gradient without entropy."""
    bounds = LAYOUTS["tp2-width1"]
    logits, targets = random_inputs(6, 4, scale=3.0)
    ones, zeros = np.ones(4), np.zeros(4)
    contract = rl_contract(bounds, temperature=1.5, role="train", num_tokens=4)
    leaf = logits.clone().requires_grad_(True)
    sum(r.entropy.sum() for r in run_tp(OPS[backend], leaf, targets, contract)).backward()
    assert leaf.grad is not None
    want = exact_grad(logits, targets, contract, zeros, ones)
    assert_close(
        leaf.grad, want, grad_bound(backend, logits, targets, contract, zeros, ones, want), "H"
    )
    leaf = logits.clone().requires_grad_(True)
    sum(r.selected_logp.sum() for r in run_tp(OPS[backend], leaf, targets, contract)).backward()
    plain = rl_contract(bounds, temperature=1.5, entropy=False, role="train", num_tokens=4)
    without = tp_grad(OPS[backend], logits, targets, plain, ones, zeros)
    assert leaf.grad is not None and torch.equal(leaf.grad, without)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_power_of_two_temperature_chains_exactly(backend: str, dtype: str) -> None:
    """d/dx at ``T = 4`` is exactly ``1/4`` of d/dx' at ``T = 1`` with ``x' = x / 4``."""
    bounds = LAYOUTS["tp2-padding-shard"]
    logits, targets = random_inputs(9, 8, dtype=dtype, scale=5.0)
    logits[3, 2:5] = -INF
    scaled = logits / 4
    assert torch.equal(scaled.float() * 4, logits.float())
    hot = rl_contract(bounds, temperature=4.0, role="train", num_tokens=8, dtype=dtype)
    cold = rl_contract(bounds, temperature=1.0, role="train", num_tokens=8, dtype=dtype)
    divided = tp_grad(OPS[backend], logits, targets, hot, A, B)
    prescaled = tp_grad(OPS[backend], scaled, targets, cold, A, B)
    assert torch.equal(bits(divided), bits(prescaled / 4))


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_entropy_is_differentiable_only_for_the_train_role(backend: str) -> None:
    logits, targets = random_inputs(3, 2)
    leaf = logits.requires_grad_(True)
    train = OPS[backend](leaf, targets, rl_contract(LAYOUTS["tp1"], role="train", num_tokens=2))
    assert train.entropy.requires_grad and train.selected_logp.requires_grad
    assert not train.lse.requires_grad
    infer = OPS[backend](leaf, targets, rl_contract(LAYOUTS["tp1"], role="infer", num_tokens=2))
    assert infer.entropy.grad_fn is None and infer.selected_logp.grad_fn is None


def _float64_entropy(contract: tpl.LogprobContract, targets: torch.Tensor) -> Any:
    def entropy(x: torch.Tensor, group: Any = None) -> torch.Tensor:
        return native_logprob(x, targets, contract, group, output_dtype=torch.float64).entropy

    return entropy


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_native_entropy_gradcheck_float64(temperature: float) -> None:
    mask = np.array([True, False, True, True])
    contract = rl_contract(
        LAYOUTS["tp1"], temperature=temperature, role="train", num_tokens=4, active_mask=mask
    )
    logits, targets = random_inputs(8, 4, active_mask=mask, scale=1.5)
    leaf = logits.double().requires_grad_(True)
    assert torch.autograd.gradcheck(
        _float64_entropy(contract, targets), (leaf,), eps=1e-6, atol=1e-7
    )


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_native_entropy_gradcheck_float64_one_rank_of_three(rank: int) -> None:
    """Rank r's entropy as a function of rank r's columns: TP's Jacobian, through ``1/T``."""
    bounds = LAYOUTS["tp3-uneven"]
    contract = rl_contract(bounds, temperature=0.6, role="train", num_tokens=3)
    logits, targets = random_inputs(4, 3, scale=1.5)
    full = logits.double()
    start, end = bounds[rank]
    local = full[:, start:end].clone().requires_grad_(True)

    def op(x: torch.Tensor, t: torch.Tensor, c: tpl.LogprobContract, group: Any = None) -> Any:
        return native_logprob(x, t, c, group, output_dtype=torch.float64)

    def rank_entropy(x: torch.Tensor) -> torch.Tensor:
        joined = torch.cat((full[:, :start], x, full[:, end:]), dim=1)
        return run_tp(op, joined, targets, contract)[rank].entropy

    assert torch.autograd.gradcheck(rank_entropy, (local,), eps=1e-6, atol=1e-7)
