"""triton_fused: the Triton fused LM head against the exact oracle, and its determinism.

On CPU the kernels run through the Triton interpreter (set before triton is
imported); shapes stay tiny. The oracle helpers are torch_native_fused's
(``test_native_fused``): the same exact values and the same fused extra bound.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from typing import Any

import numpy as np
import pytest

import tp_logprob as tpl
from tests.helpers.fused_cases import (
    DEVICE,
    DTYPES,
    FUSED_SIZE,
    GRAD_REL,
    MASK,
    PADDED,
    REAL,
    as_f64,
    assert_within,
    fused_case,
    fused_contract,
    oracle,
    same_bits,
)
from tp_logprob.kernels import fused_chunks
from tp_logprob.kernels.dtypes import TORCH_DTYPES
from tp_logprob.kernels.native_fused import torch_native_fused_logprob
from tp_logprob.oracle import exact_hidden_grads, exact_hidden_logits, tolerance
from tp_logprob.suite.allocations import track_allocations

pytest.importorskip("triton", reason="triton_fused needs triton (on CPU, its interpreter)")
from tp_logprob.kernels.builtin import register_fused_backends
from tp_logprob.kernels.triton.fused import triton_fused_logprob
from tp_logprob.kernels.triton.fused_logits import fused_logits

pytestmark = pytest.mark.triton

SIZE = FUSED_SIZE
LAYOUTS = {
    "tp1": ((0, 24),),
    "tp2-padding-shard": ((0, 19), (19, 24)),
    "tp3-uneven": ((0, 10), (10, 11), (11, 24)),
    "tp4-uneven": ((0, 3), (3, 17), (17, 20), (20, 24)),
}


def run_fused(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    contract: tpl.LogprobContract,
    bias: torch.Tensor | None = None,
    op: Any = None,
) -> list[tpl.LogprobResult]:
    """Every rank (``run_tp_hidden``) on ``DEVICE``; results back on the CPU.

    ``hidden`` is shared by the ranks, so autograd sums their ``d hidden`` partials.
    ``op`` defaults to ``triton_fused_logprob``.
    """
    on = [None if t is None else t.to(DEVICE) for t in (hidden, weight, targets, bias)]
    results = tpl.run_tp_hidden(
        op or triton_fused_logprob, on[0], on[1], on[2], contract, bias=on[3]
    )
    return [tpl.LogprobResult(*(None if t is None else t.cpu() for t in r)) for r in results]


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
    hidden, weight, biases, targets = fused_case(dtype, seed=7, bias=bias)
    hidden[2] = float("nan")  # an inactive row
    contract = fused_contract(
        LAYOUTS[layout],
        dtype=dtype,
        active_mask=MASK,
        temperature=temperature,
        export_entropy=entropy,
        has_bias=bias,
    )
    results = run_fused(hidden, weight, targets, contract, biases)
    for other in results[1:]:
        assert same_bits(other.selected_logp, results[0].selected_logp), "replicated"
    want = oracle(hidden, weight, biases, targets, temperature=temperature, active_mask=MASK)
    tol = tolerance(dtype, REAL, num_shards=len(LAYOUTS[layout]))
    lse_extra, selected_extra, entropy_extra = want["extra"]
    result, rows = results[0], MASK
    lse_bound = tol.lse_bound(want["lse"], row_max=want["row_max"]) + lse_extra
    assert_within(result.lse[rows], want["lse"][rows], lse_bound[rows], "lse")
    assert torch.isnan(result.lse[~rows]).all(), "an inactive row's lse is still its LSE (NaN)"
    selected_bound = tol.selected_bound(want["selected"], want["lse"], row_max=want["row_max"])
    assert_within(
        result.selected_logp[rows],
        want["selected"][rows],
        (selected_bound + selected_extra)[rows],
        "selected_logp",
    )
    assert same_bits(result.selected_logp[~rows], torch.zeros(1)), "inactive rows are +0.0"
    if entropy:
        entropy_bound = tol.entropy_bound(want["entropy"]) + entropy_extra
        assert_within(result.entropy[rows], want["entropy"][rows], entropy_bound[rows], "entropy")
        assert same_bits(result.entropy[~rows], torch.zeros(1))


def test_small_hidden_and_strided_weight_give_the_same_bits() -> None:
    """H = 16 (one K chunk) against the oracle; a transposed-storage ``W`` changes no bit."""
    hidden, weight, _, targets = fused_case("bf16", seed=9, size=16)
    contract = fused_contract(LAYOUTS["tp3-uneven"], dtype="bf16", size=16, export_entropy=True)
    plain = run_fused(hidden, weight, targets, contract)[0]
    strided = run_fused(hidden, weight.T.contiguous().T, targets, contract)[0]
    for name in ("selected_logp", "lse", "entropy"):
        assert same_bits(getattr(plain, name), getattr(strided, name)), name
    want = oracle(hidden, weight, None, targets)
    bound = tolerance("bf16", REAL, num_shards=3).lse_bound(want["lse"], row_max=want["row_max"])
    assert_within(plain.lse, want["lse"], bound + want["extra"][0], "lse")


def test_special_values_follow_the_logits_semantics() -> None:
    """The special-value classes of torch_native_fused on the same inputs
    (docs/semantics.md, "Special values")."""
    hidden, weight, _, targets = fused_case("fp32", seed=5)
    hidden[0, 0] = float("nan")  # NaN in every live column: lse and selected NaN
    hidden[1, 0] = float("inf")  # live columns +inf and -inf: lse +inf, selected NaN
    contract = fused_contract(LAYOUTS["tp3-uneven"], export_entropy=True)
    got = run_fused(hidden, weight, targets, contract)[0]
    want = tpl.run_tp_hidden(torch_native_fused_logprob, hidden, weight, targets, contract)[0]
    for name in ("selected_logp", "lse", "entropy"):
        a, b = getattr(got, name)[:2], getattr(want, name)[:2]
        assert torch.equal(torch.isnan(a), torch.isnan(b)), (name, a, b)
        assert torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)), (name, a, b)
    assert torch.isnan(got.lse[0]) and got.lse[1] == float("inf")


@pytest.mark.parametrize("layout", ["tp1", "tp2-padding-shard", "tp4-uneven"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_gradients_match_exact(layout: str, dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``hidden.grad`` (the ranks' partials summed), ``weight.grad`` and ``bias.grad``.

    The bound is test_native_fused's: ``GRAD_REL * (|G| + onehot) @ |operand|``.
    Chunks of 2 rows make the backward run several chunks, the last one padded.
    """
    monkeypatch.setattr(fused_chunks, "CHUNK_ELEMENTS", 2 * REAL)
    hidden, weight, biases, targets = fused_case(dtype, seed=11, bias=True)
    assert biases is not None
    hidden[2] = float("nan")  # an inactive row: must not reach weight.grad or bias.grad
    for leaf in (hidden, weight, biases):
        leaf.requires_grad_(True)
    contract = fused_contract(
        LAYOUTS[layout], dtype=dtype, role="train", active_mask=MASK, has_bias=True
    )
    results = run_fused(hidden, weight, targets, contract, biases)
    sum(result.selected_logp.float().sum() for result in results).backward()
    assert hidden.grad is not None and weight.grad is not None and biases.grad is not None
    h, w, b = as_f64(hidden), as_f64(weight), as_f64(biases)
    want_h, want_w = exact_hidden_grads(
        h, w, targets.numpy(), bias=b, active_mask=MASK, real_vocab_size=REAL
    )
    x = exact_hidden_logits(h[MASK], w[:REAL], b[:REAL])
    probs = np.exp(x - x.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    size_g = np.zeros((6, REAL))
    size_g[MASK] = probs
    size_g[np.arange(6), targets.numpy()] += 1.0
    size_g[~MASK] = 0.0
    h_bound = GRAD_REL[dtype] * (size_g @ np.abs(w[:REAL]))
    w_bound = GRAD_REL[dtype] * (size_g.T @ np.nan_to_num(np.abs(h), nan=0.0))
    got_h, got_w, got_b = as_f64(hidden.grad), as_f64(weight.grad), as_f64(biases.grad)
    assert (np.abs(got_h[MASK] - want_h[MASK]) <= h_bound[MASK]).all()
    assert (got_h[~MASK] == 0).all(), "inactive rows get exactly zero d hidden"
    assert (np.abs(got_w[:REAL] - want_w[:REAL]) <= w_bound).all()
    assert (got_w[REAL:] == 0).all() and (got_b[REAL:] == 0).all(), "padding rows get zero"
    onehot = np.zeros((6, REAL))
    onehot[np.arange(6), targets.numpy()] = 1.0
    want_b = (onehot[MASK] - probs).sum(axis=0)
    assert np.allclose(got_b[:REAL], want_b, rtol=0, atol=GRAD_REL[dtype] * 6)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_entropy_gradients_with_temperature_match_exact(dtype: str) -> None:
    """``d sum(entropy) / d hidden`` and ``/ d W`` at T = 0.7 against the exact ones."""
    hidden, weight, _, targets = fused_case(dtype, seed=13)
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    contract = fused_contract(
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


def _run_rows(
    rows: slice, dtype: str, inputs: tuple[torch.Tensor, ...]
) -> tuple[tpl.LogprobResult, torch.Tensor]:
    """Outputs and ``d hidden`` of ``rows`` alone (train role, T = 0.8, entropy, bias)."""
    hidden, weight, biases, targets = inputs
    part = hidden[rows].detach().clone().requires_grad_(True)
    contract = fused_contract(
        LAYOUTS["tp3-uneven"],
        num_tokens=part.shape[0],
        dtype=dtype,
        role="train",
        temperature=0.8,
        export_entropy=True,
        has_bias=True,
    )
    results = run_fused(part, weight, targets[rows], contract, biases)
    sum((r.selected_logp.float() + r.entropy.float()).sum() for r in results).backward()
    assert part.grad is not None
    return results[0], part.grad


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_bitwise_batch_invariant_and_reproducible(
    dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row's outputs and ``d hidden`` bits do not depend on N, its neighbours, or the run.

    Chunks of 3 rows: row 7 is alone in a chunk in the full batch, and slices move
    every row to other chunk positions and other row-block neighbours.
    """
    monkeypatch.setattr(fused_chunks, "CHUNK_ELEMENTS", 3 * REAL)
    inputs = fused_case(dtype, seed=2, num_tokens=8, bias=True)
    full, full_grad = _run_rows(slice(0, 8), dtype, inputs)
    again, again_grad = _run_rows(slice(0, 8), dtype, inputs)
    assert same_bits(full_grad, again_grad)
    for rows in (slice(0, 8), slice(0, 1), slice(2, 7), slice(7, 8)):
        part, grad = (again, again_grad) if rows == slice(0, 8) else _run_rows(rows, dtype, inputs)
        for name in ("selected_logp", "lse", "entropy"):
            assert same_bits(getattr(full, name)[rows], getattr(part, name)), (rows, name)
        assert same_bits(full_grad[rows], grad), (rows, "d hidden")


def test_never_materializes_the_whole_logits_in_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    """No fp32 tensor as wide as a shard's vocabulary has more than ``chunk_rows`` rows.

    Every aten op's fp32 output, forward (every rank's thread) and backward, is watched
    (``track_allocations``); the kernels' own registers are not tensors. H = 16 is no
    vocabulary width, so ``[N, H]`` tensors are not mistaken for logits.
    """
    monkeypatch.setattr(fused_chunks, "CHUNK_ELEMENTS", 2 * REAL)
    num_tokens = 8
    hidden, weight, _, targets = fused_case("bf16", seed=4, num_tokens=num_tokens, size=16)
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    contract = fused_contract(
        LAYOUTS["tp1"],
        num_tokens=num_tokens,
        dtype="bf16",
        size=16,
        role="train",
        export_entropy=True,
    )
    with track_allocations() as fused:
        result = run_fused(hidden, weight, targets, contract, op=fused.wrap(triton_fused_logprob))[
            0
        ]
        (result.selected_logp.float().sum() + result.entropy.float().sum()).backward()
    assert fused_chunks.chunk_rows(contract) == 2
    assert fused.max_rows(torch.float32, {REAL, PADDED}) == 2
    assert weight.grad is not None and weight.grad[:REAL].abs().sum() > 0


def test_input_checks_are_torch_native_fused_s() -> None:
    hidden, weight, _, targets = fused_case("bf16", seed=1)
    contract = fused_contract(LAYOUTS["tp1"], dtype="bf16")
    with pytest.raises(tpl.LogprobContractError, match=r"hidden\.shape"):
        triton_fused_logprob(hidden[:, :8], targets, contract, weight=weight)
    with pytest.raises(tpl.LogprobContractError, match="active target outside"):
        triton_fused_logprob(hidden, torch.full((6,), REAL), contract, weight=weight)


def logits_of(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    out = torch.empty((hidden.shape[0], weight.shape[0]), dtype=torch.float32, device=DEVICE)
    fused_logits(hidden.to(DEVICE), weight.to(DEVICE), bias.to(DEVICE), weight.shape[0], out)
    return out.cpu()


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_logit_bits_do_not_depend_on_the_shard_layout_or_the_rows(dtype: str) -> None:
    """Each fp32 ``x[t, v]`` has the same bits whatever the shard holding column v starts at
    and however wide it is, and whichever rows share its row block.

    This is the premise a cross-TP-bitwise fused variant would rest on (module
    docstring of ``kernels/triton/fused.py``); the sums would still need exact_sum's
    fixed-point construction.
    """
    gen = torch.Generator().manual_seed(3)
    hidden = (torch.randn(8, 40, generator=gen) * 3).to(TORCH_DTYPES[dtype])
    weight = torch.randn(40, 40, generator=gen).to(TORCH_DTYPES[dtype])
    bias = torch.randn(40, generator=gen).to(TORCH_DTYPES[dtype])
    whole = logits_of(hidden, weight, bias)
    for bounds in (((0, 1), (1, 17), (17, 40)), ((0, 7), (7, 9), (9, 33), (33, 40))):
        shards = [logits_of(hidden, weight[a:b], bias[a:b]) for a, b in bounds]
        assert same_bits(torch.cat(shards, dim=1), whole), bounds
    alone = torch.cat([logits_of(hidden[t : t + 1], weight, bias) for t in (0, 5, 7)])
    assert same_bits(alone, whole[[0, 5, 7]])


def test_registered_for_hidden_contracts_where_triton_runs() -> None:
    registry = tpl.KernelRegistry()
    register_fused_backends(registry)
    platform = DEVICE.type  # the interpreter registers it on the CPU
    chosen = registry.get_logprob_op(
        fused_contract(LAYOUTS["tp1"]), "triton_fused", platform=platform
    )
    assert chosen.op is triton_fused_logprob
    assert chosen.capability.determinism_scopes == {tpl.DeterminismScope.FIXED_TOPOLOGY}
    logits = tpl.LogprobContract(
        "infer",
        "fp32",
        tpl.MaskSpec(6),
        tpl.ShardingSpec(0, 1, LAYOUTS["tp1"], REAL, PADDED),
        tpl.ReductionSpec("fixed_topology"),
    )
    with pytest.raises(tpl.LogprobDispatchError, match="input_kind 'logits' not in"):
        registry.get_logprob_op(logits, "triton_fused", platform=platform)
