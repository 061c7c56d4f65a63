"""torch_native_fused: the fused LM head against the exact oracle, torch_native, and itself."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import tp_logprob as tpl
from tests.helpers.fused_cases import (
    PADDED,
    REAL,
    as_f64,
    assert_within,
    fused_case,
    fused_contract,
    oracle,
)
from tp_logprob.kernels import fused_chunks
from tp_logprob.kernels.fused_chunks import logits_chunk
from tp_logprob.kernels.native import torch_native_logprob
from tp_logprob.kernels.native_fused import torch_native_fused_logprob
from tp_logprob.oracle import (
    exact_hidden_grads,
    exact_hidden_logits,
    tolerance,
)
from tp_logprob.suite.allocations import track_allocations

SIZE = 16
LAYOUTS = {
    "tp1": ((0, 24),),
    "tp2-padding-shard": ((0, 19), (19, 24)),
    "tp3-uneven": ((0, 10), (10, 11), (11, 24)),
}
DTYPES = ("fp32", "bf16", "fp16")
MASK = np.array([True, True, False, True, True, True])


def make_contract(bounds: tuple[tuple[int, int], ...], **fields: Any) -> tpl.LogprobContract:
    """:func:`~tests.helpers.fused_cases.fused_contract` at this module's hidden size."""
    return fused_contract(bounds, size=SIZE, **fields)


def run_fused(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    contract: tpl.LogprobContract,
    bias: torch.Tensor | None = None,
    op: Any = torch_native_fused_logprob,
) -> list[tpl.LogprobResult]:
    """Every rank of the contract's layout (``run_tp_hidden``), each with its weight rows.

    ``hidden`` is shared, so autograd sums the ranks' ``d hidden`` partials into
    ``hidden.grad``, which is the all-reduce a trainer performs.
    """
    return tpl.run_tp_hidden(op, hidden, weight, targets, contract, bias=bias)


def random_case(
    dtype: str, **fields: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """:func:`~tests.helpers.fused_cases.fused_case` at this module's hidden size."""
    return fused_case(dtype, size=SIZE, **fields)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize(
    ("temperature", "entropy", "bias"),
    [(1.0, False, False), (0.7, True, True)],
    ids=["plain", "T-entropy-bias"],
)
def test_matches_exact_oracle(
    layout: str, dtype: str, temperature: float, entropy: bool, bias: bool
) -> None:
    hidden, weight, biases, targets = random_case(dtype, seed=7, bias=bias)
    contract = make_contract(
        LAYOUTS[layout],
        dtype=dtype,
        active_mask=MASK,
        temperature=temperature,
        export_entropy=entropy,
        has_bias=bias,
    )
    results = run_fused(hidden, weight, targets, contract, biases)
    want = oracle(hidden, weight, biases, targets, temperature=temperature, active_mask=MASK)
    tol = tolerance(dtype, REAL, num_shards=len(LAYOUTS[layout]))
    lse_extra, selected_extra, entropy_extra = want["extra"]
    result = results[0]
    lse_bound = tol.lse_bound(want["lse"], row_max=want["row_max"]) + lse_extra
    assert_within(result.lse, want["lse"], lse_bound, "lse")
    selected_bound = tol.selected_bound(want["selected"], want["lse"], row_max=want["row_max"])
    assert_within(
        result.selected_logp[MASK],
        want["selected"][MASK],
        (selected_bound + selected_extra)[MASK],
        "selected_logp",
    )
    assert (result.selected_logp[~MASK] == 0).all()
    if entropy:
        entropy_bound = tol.entropy_bound(want["entropy"]) + entropy_extra
        assert_within(result.entropy, want["entropy"], entropy_bound, "entropy")


@pytest.mark.parametrize("layout", ["tp1", "tp3-uneven"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_bitwise_equal_to_torch_native_on_the_same_logits(layout: str, dtype: str) -> None:
    """The fused op is torch_native on the fp32 logits its matmul forms, bit for bit."""
    hidden, weight, biases, targets = random_case(dtype, seed=3, bias=True)
    bounds = LAYOUTS[layout]
    contract = make_contract(
        bounds, dtype=dtype, temperature=0.9, export_entropy=True, has_bias=True
    )
    fused = run_fused(hidden, weight, targets, contract, biases)
    assert biases is not None
    rows = fused_chunks.chunk_rows(contract)
    hidden32 = torch.cat([hidden.float(), hidden.new_zeros(rows - 6, SIZE).float()])
    columns = []
    for start, end in bounds:
        live = max(start, min(end, REAL))
        x = logits_chunk(hidden32, weight[start:live].float(), biases[start:live].float())
        columns += [x[:6], torch.full((6, end - live), float("nan"))]
    logits = torch.cat(columns, dim=1)
    plain = tpl.LogprobContract(
        "infer",
        "fp32",
        contract.mask,
        contract.sharding,
        contract.reduction,
        temperature=0.9,
        export_entropy=True,
    )
    native = tpl.run_tp(torch_native_logprob, logits, targets, plain)
    for name in ("selected_logp", "lse", "entropy"):
        a, b = getattr(fused[0], name), getattr(native[0], name)
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), name


GRAD_REL = {"fp32": 2.0**-14, "bf16": 2.0**-6, "fp16": 2.0**-9}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_gradients_match_exact(layout: str, dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``hidden.grad`` (the ranks' partials summed) and ``weight.grad`` against the exact ones.

    Bound per element: ``GRAD_REL * (|G| + onehot) @ |operand|``, which covers G's
    fp32 error (x off by the dot-product term), the fp32 matmuls and the final
    rounding (and, in low precision, the sum of per-rank partials in that dtype).
    Chunks of 2 rows make the backward run several chunks.
    """
    monkeypatch.setattr(fused_chunks, "CHUNK_ELEMENTS", 2 * REAL)
    hidden, weight, _, targets = random_case(dtype, seed=11)
    hidden[2] = float("nan")  # an inactive row: must not reach weight.grad
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    contract = make_contract(LAYOUTS[layout], dtype=dtype, role="train", active_mask=MASK)
    results = run_fused(hidden, weight, targets, contract)
    sum(result.selected_logp.float().sum() for result in results).backward()
    assert hidden.grad is not None and weight.grad is not None
    want_h, want_w = exact_hidden_grads(
        as_f64(hidden), as_f64(weight), targets.numpy(), active_mask=MASK, real_vocab_size=REAL
    )
    x = exact_hidden_logits(as_f64(hidden)[MASK], as_f64(weight)[:REAL])
    probs = np.exp(x - x.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    weight_g = np.zeros((6, REAL))
    weight_g[MASK] = probs
    weight_g[np.arange(6), targets.numpy()] += 1.0
    weight_g[~MASK] = 0.0
    h_bound = GRAD_REL[dtype] * (weight_g @ np.abs(as_f64(weight)[:REAL]))
    w_bound = GRAD_REL[dtype] * (weight_g.T @ np.nan_to_num(np.abs(as_f64(hidden)), nan=0.0))
    got_h, got_w = as_f64(hidden.grad), as_f64(weight.grad)
    assert (np.abs(got_h[MASK] - want_h[MASK]) <= h_bound[MASK]).all()
    assert (got_h[~MASK] == 0).all(), "inactive rows get exactly zero d hidden"
    assert (np.abs(got_w[:REAL] - want_w[:REAL]) <= w_bound).all()
    assert (got_w[REAL:] == 0).all(), "padding weight rows get exactly zero gradient"


def test_bias_gradient_is_the_column_sum_of_g() -> None:
    hidden, weight, biases, targets = random_case("fp32", seed=5, bias=True)
    assert biases is not None
    biases.requires_grad_(True)
    contract = make_contract(LAYOUTS["tp3-uneven"], role="train", has_bias=True)
    results = run_fused(hidden, weight, targets, contract, biases)
    sum(result.selected_logp.sum() for result in results).backward()
    assert biases.grad is not None
    x = exact_hidden_logits(as_f64(hidden), as_f64(weight)[:REAL], as_f64(biases)[:REAL])
    probs = np.exp(x - x.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    onehot = np.zeros_like(probs)
    onehot[np.arange(6), targets.numpy()] = 1.0
    want = (onehot - probs).sum(axis=0)
    assert np.allclose(as_f64(biases.grad)[:REAL], want, rtol=0, atol=1e-5)
    assert (as_f64(biases.grad)[REAL:] == 0).all()


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_batch_invariant_across_chunk_boundaries(
    dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row's bits do not depend on N or on where chunk boundaries (3 rows) fall."""
    monkeypatch.setattr(fused_chunks, "CHUNK_ELEMENTS", 3 * REAL)
    hidden, weight, biases, targets = random_case(dtype, seed=2, num_tokens=8, bias=True)
    bounds = LAYOUTS["tp3-uneven"]

    def run(rows: slice) -> tpl.LogprobResult:
        count = len(range(8)[rows])
        contract = make_contract(
            bounds, num_tokens=count, dtype=dtype, export_entropy=True, has_bias=True
        )
        return run_fused(hidden[rows], weight, targets[rows], contract, biases)[0]

    full = run(slice(0, 8))
    for rows in (slice(0, 1), slice(1, 8), slice(2, 7), slice(5, 8), slice(7, 8)):
        part = run(rows)
        for name in ("selected_logp", "lse", "entropy"):
            a, b = getattr(full, name)[rows], getattr(part, name)
            assert torch.equal(a.view(torch.int32), b.view(torch.int32)), (rows, name)


def test_never_materializes_the_whole_logits_in_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every aten op's fp32 output, forward (every rank's thread) and backward, is watched
    (``track_allocations``).

    Proves: no fp32 tensor as wide as a shard's live or padded vocabulary has more
    than ``chunk_rows`` rows, so no ``[N, local_vocab]`` fp32 logits exist at once
    (on the CPU, with torch's own ops; it says nothing of memory a BLAS call uses
    internally). The same watch over torch_native's logits path does see
    ``[N, vocab]`` fp32 tensors, so it can fail.
    """
    monkeypatch.setattr(fused_chunks, "CHUNK_ELEMENTS", 2 * REAL)
    num_tokens = 12
    hidden, weight, _, targets = random_case("bf16", seed=4, num_tokens=num_tokens)
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    contract = make_contract(
        LAYOUTS["tp1"], num_tokens=num_tokens, dtype="bf16", role="train", export_entropy=True
    )
    widths = {REAL, PADDED}
    with track_allocations() as fused:
        op = fused.wrap(torch_native_fused_logprob)
        results = run_fused(hidden, weight, targets, contract, op=op)
        (results[0].selected_logp.float().sum() + results[0].entropy.float().sum()).backward()
    assert fused.max_rows(torch.float32, widths) == fused_chunks.chunk_rows(contract) == 2
    logits = torch.randn(num_tokens, PADDED).bfloat16().requires_grad_(True)
    plain = tpl.LogprobContract(
        "train", "bf16", contract.mask, contract.sharding, contract.reduction
    )
    with track_allocations() as native:
        torch_native_logprob(logits, targets, plain).selected_logp.float().sum().backward()
    assert native.max_rows(torch.float32, widths) == num_tokens


def test_input_checks_run_before_any_work() -> None:
    hidden, weight, biases, targets = random_case("bf16", seed=1, bias=True)
    contract = make_contract(LAYOUTS["tp1"], dtype="bf16")
    op = torch_native_fused_logprob
    cases: list[tuple[dict[str, Any], str]] = [
        ({"hidden": hidden[:, :8]}, "hidden.shape"),
        ({"hidden": hidden.float()}, "hidden.dtype"),
        ({"weight": weight[:20]}, "weight.shape"),
        ({"weight": weight.half()}, "weight.dtype"),
        ({"bias": biases}, "has_bias=False"),
        ({"targets": torch.full((6,), REAL)}, "active target outside"),
        ({"hidden": "x"}, "hidden: expected a torch.Tensor"),
    ]
    for change, message in cases:
        args: dict[str, Any] = {"hidden": hidden, "weight": weight, "targets": targets}
        args.update(change)
        with pytest.raises(tpl.LogprobContractError, match=message):
            op(
                args["hidden"],
                args["targets"],
                contract,
                weight=args["weight"],
                **({"bias": change["bias"]} if "bias" in change else {}),
            )
    with pytest.raises(tpl.LogprobContractError, match="bias=None"):
        op(
            hidden,
            targets,
            make_contract(LAYOUTS["tp1"], dtype="bf16", has_bias=True),
            weight=weight,
        )
    logits_contract = tpl.LogprobContract(
        "infer", "bf16", contract.mask, contract.sharding, contract.reduction
    )
    with pytest.raises(tpl.LogprobContractError, match="input_kind='logits'"):
        op(hidden, targets, logits_contract, weight=weight)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_entropy_gradients_with_temperature_match_exact(dtype: str) -> None:
    """``d sum(entropy) / d hidden`` and ``/ d W`` at T = 0.7 against the exact ones."""
    hidden, weight, _, targets = random_case(dtype, seed=13)
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    contract = make_contract(
        LAYOUTS["tp3-uneven"], dtype=dtype, role="train", temperature=0.7, export_entropy=True
    )
    results = run_fused(hidden, weight, targets, contract)
    sum(result.entropy.float().sum() for result in results).backward()
    assert hidden.grad is not None and weight.grad is not None
    want_h, want_w = exact_hidden_grads(
        as_f64(hidden),
        as_f64(weight),
        targets.numpy(),
        real_vocab_size=REAL,
        temperature=0.7,
        of="entropy",
    )
    # |d entropy / d z_v| <= p_v (|log p_v| + H) / T <= (1 + 2 log n) / T per column.
    scale = (1.0 + 2.0 * np.log(REAL)) / 0.7
    h_bound = GRAD_REL[dtype] * scale * np.abs(as_f64(weight)[:REAL]).sum(axis=0)
    w_bound = GRAD_REL[dtype] * scale * np.abs(as_f64(hidden)).sum(axis=0)
    assert (np.abs(as_f64(hidden.grad) - want_h) <= h_bound).all()
    assert (np.abs(as_f64(weight.grad)[:REAL] - want_w[:REAL]) <= w_bound).all()
    assert (as_f64(weight.grad)[REAL:] == 0).all()
