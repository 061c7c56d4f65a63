"""triton_fused_exact_sum: the fused LM head with the same bits for every TP degree and
shard layout, against the exact oracle, and its gradients (CPU: the Triton interpreter)."""

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
from tp_logprob.kernels.native_fused import torch_native_fused_logprob
from tp_logprob.oracle import (
    exact_entropy_grad,
    exact_hidden_grads,
    exact_hidden_logits,
    exact_logprob_grad,
    tolerance,
)

pytest.importorskip(
    "triton", reason="triton_fused_exact_sum needs triton (on CPU, its interpreter)"
)
from tp_logprob.kernels.builtin import register_fused_backends
from tp_logprob.kernels.triton.exact_sum import triton_exact_sum_logprob
from tp_logprob.kernels.triton.fused_exact_sum import triton_fused_exact_sum_logprob
from tp_logprob.kernels.triton.fused_logits import fused_logits

pytestmark = pytest.mark.triton

LAYOUTS = {
    "tp1": ((0, 24),),
    "tp2-padding-shard": ((0, 19), (19, 24)),
    "tp3-uneven": ((0, 10), (10, 11), (11, 24)),
    "tp4-uneven": ((0, 3), (3, 17), (17, 20), (20, 24)),
    "tp4-two-padding-shards": ((0, 5), (5, 19), (19, 20), (20, 24)),
}
OUTPUTS = ("selected_logp", "lse", "entropy")
VARIANTS = {"plain": (1.0, False, False), "T-entropy-bias": (0.7, True, True)}


def run_exact(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    contract: tpl.LogprobContract,
    bias: torch.Tensor | None = None,
) -> list[tpl.LogprobResult]:
    """Every rank (``run_tp_hidden``, which checks replication) on ``DEVICE``; results on CPU."""
    on = [None if t is None else t.to(DEVICE) for t in (hidden, weight, targets, bias)]
    results = tpl.run_tp_hidden(
        triton_fused_exact_sum_logprob, on[0], on[1], on[2], contract, bias=on[3]
    )
    return [tpl.LogprobResult(*(None if t is None else t.cpu() for t in r)) for r in results]


def assert_same_outputs(got: tpl.LogprobResult, want: tpl.LogprobResult, what: str) -> None:
    for name in OUTPUTS:
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), (what, name)
        if a is not None:
            assert same_bits(a, b), (what, name, a, b)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_same_bits_for_every_layout_and_within_the_oracle(dtype: str, variant: str) -> None:
    """TP 1..4, uneven and padding-only shards: the outputs' bits never change, and they
    are within the oracle's bounds (the fused tolerance, as ``triton_fused``'s)."""
    temperature, entropy, bias = VARIANTS[variant]
    hidden, weight, biases, targets = fused_case(dtype, seed=7, bias=bias)
    hidden[2] = float("nan")  # an inactive row
    hidden[4] = hidden[5]  # a row equal to another, and near ties from a scaled copy
    hidden[3] = hidden[5] * 1.0009765625
    fields = {"temperature": temperature, "export_entropy": entropy, "has_bias": bias}
    reference = None
    for name, bounds in LAYOUTS.items():
        contract = fused_contract(bounds, dtype=dtype, active_mask=MASK, **fields)
        result = run_exact(hidden, weight, targets, contract, biases)[0]
        if reference is None:
            reference = result
        assert_same_outputs(result, reference, f"layout {name} against tp1")
    assert reference is not None
    want = oracle(hidden, weight, biases, targets, temperature=temperature, active_mask=MASK)
    tol = tolerance(dtype, REAL, num_shards=1)
    lse_extra, selected_extra, entropy_extra = want["extra"]
    rows = MASK
    lse_bound = tol.lse_bound(want["lse"], row_max=want["row_max"]) + lse_extra
    assert_within(reference.lse[rows], want["lse"][rows], lse_bound[rows], "lse")
    assert torch.isnan(reference.lse[~rows]).all(), "an inactive row's lse is its LSE (NaN)"
    selected_bound = tol.selected_bound(want["selected"], want["lse"], row_max=want["row_max"])
    assert_within(
        reference.selected_logp[rows],
        want["selected"][rows],
        (selected_bound + selected_extra)[rows],
        "selected_logp",
    )
    assert same_bits(reference.selected_logp[~rows], torch.zeros(1)), "inactive rows are +0.0"
    if entropy:
        entropy_bound = tol.entropy_bound(want["entropy"]) + entropy_extra
        assert_within(
            reference.entropy[rows], want["entropy"][rows], entropy_bound[rows], "entropy"
        )
        assert same_bits(reference.entropy[~rows], torch.zeros(1))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_same_bits_as_triton_exact_sum_on_the_fused_logits(variant: str) -> None:
    """One construction: on the fp32 logits ``fused_logits`` forms (the same bits as the
    fused passes), ``triton_exact_sum`` gives the same outputs bit for bit, and
    other garbage in the padding rows of ``W`` and the bias changes nothing."""
    temperature, entropy, bias = VARIANTS[variant]
    hidden, weight, biases, targets = fused_case("fp32", seed=21, bias=bias)
    fields = {"temperature": temperature, "export_entropy": entropy, "has_bias": bias}
    bounds = LAYOUTS["tp3-uneven"]
    fused = run_exact(hidden, weight, targets, fused_contract(bounds, **fields), biases)[0]
    logits = torch.full((hidden.shape[0], PADDED), float("nan"), device=DEVICE)
    live = torch.empty((hidden.shape[0], REAL), device=DEVICE)
    on_bias = None if biases is None else biases.to(DEVICE)
    fused_logits(hidden.to(DEVICE), weight.to(DEVICE), on_bias, REAL, live)
    logits[:, :REAL] = live
    contract = tpl.LogprobContract(
        "infer",
        "fp32",
        tpl.MaskSpec(hidden.shape[0]),
        tpl.ShardingSpec(0, len(bounds), bounds, REAL, PADDED),
        tpl.ReductionSpec("cross_tp_bitwise"),
        temperature=temperature,
        export_entropy=entropy,
    )
    on_logits = tpl.run_tp(triton_exact_sum_logprob, logits, targets.to(DEVICE), contract)[0]
    on_cpu = tpl.LogprobResult(*(None if t is None else t.cpu() for t in on_logits))
    assert_same_outputs(fused, on_cpu, "logits")
    weight[REAL:] = 2.0**100
    if biases is not None:
        biases[REAL:] = float("nan")
    garbage = run_exact(hidden, weight, targets, fused_contract(bounds, **fields), biases)[0]
    assert_same_outputs(garbage, fused, "other padding garbage")


def _special_cases() -> dict[str, tuple[torch.Tensor, ...]]:
    """The special rows of docs/semantics.md: NaN and +inf logits, a -inf target logit, and a
    batch whose live logits are all -inf (through the bias)."""
    hidden, weight, biases, targets = fused_case("fp32", seed=5, bias=True)
    assert biases is not None
    special = hidden.clone()
    special[0, 0] = float("nan")  # NaN in every live column: lse and selected NaN
    special[1, 0] = float("inf")  # live columns +inf and -inf: lse +inf, selected NaN
    minus_inf_target = biases.clone()
    minus_inf_target[3] = float("-inf")
    aimed = targets.clone()
    aimed[4] = 3
    all_minus_inf = biases.clone()
    all_minus_inf[:REAL] = float("-inf")
    return {
        "nan-and-inf": (special, weight, biases, targets),
        "minus-inf-target": (hidden, weight, minus_inf_target, aimed),
        "all-minus-inf": (hidden, weight, all_minus_inf, targets),
    }


@pytest.mark.parametrize("case", ["nan-and-inf", "minus-inf-target", "all-minus-inf"])
def test_special_values_follow_the_logits_semantics_in_every_layout(case: str) -> None:
    """The special-value classes of torch_native_fused on the same inputs, with the same
    bits in every layout."""
    hidden, weight, biases, targets = _special_cases()[case]
    got = None
    for name, bounds in LAYOUTS.items():
        layout = fused_contract(bounds, export_entropy=True, has_bias=True)
        result = run_exact(hidden, weight, targets, layout, biases)[0]
        got = result if got is None else got
        assert_same_outputs(result, got, f"layout {name} against tp1")
    assert got is not None
    contract = fused_contract(LAYOUTS["tp1"], export_entropy=True, has_bias=True)
    want = tpl.run_tp_hidden(
        torch_native_fused_logprob, hidden, weight, targets, contract, bias=biases
    )[0]
    for name in OUTPUTS:
        a, b = getattr(got, name), getattr(want, name)
        assert torch.equal(torch.isnan(a), torch.isnan(b)), (name, a, b)
        assert torch.allclose(a.nan_to_num(0.0), b.nan_to_num(0.0), rtol=1e-5, atol=1e-6), name
    if case == "nan-and-inf":
        assert torch.isnan(got.lse[0]) and got.lse[1] == float("inf")
        assert torch.isnan(got.selected_logp[:2]).all()
    elif case == "minus-inf-target":
        assert got.selected_logp[4] == float("-inf") and torch.isfinite(got.lse).all()
    else:
        assert (got.lse == float("-inf")).all()
        assert torch.isnan(got.selected_logp).all() and torch.isnan(got.entropy).all()


def _grads(
    layout: str, dtype: str, inputs: tuple[Any, ...]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``d (sum selected + sum entropy)`` by ``hidden``, ``weight``, ``bias`` at T = 0.7."""
    hidden, weight, biases, targets = (t.detach().clone() for t in inputs)
    for leaf in (hidden, weight, biases):
        leaf.requires_grad_(True)
    contract = fused_contract(
        LAYOUTS[layout],
        dtype=dtype,
        role="train",
        active_mask=MASK,
        has_bias=True,
        temperature=0.7,
        export_entropy=True,
    )
    results = run_exact(hidden, weight, targets, contract, biases)
    sum((r.selected_logp.float() + r.entropy.float()).sum() for r in results).backward()
    assert hidden.grad is not None and weight.grad is not None and biases.grad is not None
    return hidden.grad, weight.grad, biases.grad


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_gradients_match_exact(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``hidden.grad`` (the ranks' partials summed), ``weight.grad`` and ``bias.grad`` of
    ``selected + entropy`` at T = 0.7 in two layouts, within test_triton_fused's bound
    ``GRAD_REL * (|G| + onehot / T) @ |operand|``; exactly 0 on inactive and padding rows.
    Chunks of 2 rows: the backward runs several chunks, the last one padded."""
    monkeypatch.setattr(fused_chunks, "CHUNK_ELEMENTS", 2 * REAL)
    inputs = fused_case(dtype, seed=11, bias=True)
    inputs[0][2] = float("nan")  # an inactive row: must not reach weight.grad or bias.grad
    h, w, b = (as_f64(t) for t in inputs[:3])
    targets = inputs[3].numpy()
    args: dict[str, Any] = {"active_mask": MASK, "real_vocab_size": REAL, "temperature": 0.7}
    selected_h, selected_w = exact_hidden_grads(h, w, targets, bias=b, **args)
    entropy_h, entropy_w = exact_hidden_grads(h, w, targets, bias=b, of="entropy", **args)
    want_h, want_w = selected_h + entropy_h, selected_w + entropy_w
    x32 = exact_hidden_logits(h, w[:REAL], b[:REAL]).astype(np.float32).astype(np.float64)
    grad_selected = exact_logprob_grad(x32, targets, **args)
    grad_entropy = exact_entropy_grad(x32, **args)
    want_b = (grad_selected + grad_entropy).sum(axis=0)
    onehot = np.zeros((6, REAL))
    onehot[np.arange(6)[MASK], targets[MASK]] = 1.0 / 0.7
    size_g = np.abs(grad_selected) + np.abs(grad_entropy) + onehot
    rel = GRAD_REL[dtype]
    h_bound = rel * (size_g @ np.abs(w[:REAL]))
    w_bound = rel * (size_g.T @ np.nan_to_num(np.abs(h), nan=0.0))
    b_bound = rel * size_g.sum(axis=0)
    for layout in ("tp1", "tp4-two-padding-shards"):
        got_h, got_w, got_b = (as_f64(t) for t in _grads(layout, dtype, inputs))
        assert (np.abs(got_h[MASK] - want_h[MASK]) <= h_bound[MASK]).all(), layout
        assert (got_h[~MASK] == 0).all(), "inactive rows get exactly zero d hidden"
        assert (np.abs(got_w[:REAL] - want_w[:REAL]) <= w_bound).all(), layout
        assert (np.abs(got_b[:REAL] - want_b) <= b_bound).all(), layout
        assert (got_w[REAL:] == 0).all() and (got_b[REAL:] == 0).all(), "padding rows get 0"


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_bitwise_batch_invariant_and_reproducible(
    dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row's outputs and ``d hidden`` bits do not depend on N, its neighbours, or the run."""
    monkeypatch.setattr(fused_chunks, "CHUNK_ELEMENTS", 3 * REAL)
    hidden, weight, biases, targets = fused_case(dtype, seed=2, num_tokens=8, bias=True)

    def run_rows(rows: slice) -> tuple[tpl.LogprobResult, torch.Tensor]:
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
        results = run_exact(part, weight, targets[rows], contract, biases)
        sum((r.selected_logp.float() + r.entropy.float()).sum() for r in results).backward()
        assert part.grad is not None
        return results[0], part.grad

    full, full_grad = run_rows(slice(0, 8))
    again, again_grad = run_rows(slice(0, 8))
    assert_same_outputs(again, full, "second run")
    assert same_bits(full_grad, again_grad)
    for rows in (slice(0, 1), slice(2, 7), slice(7, 8)):
        part, grad = run_rows(rows)
        for name in OUTPUTS:
            assert same_bits(getattr(full, name)[rows], getattr(part, name)), (rows, name)
        assert same_bits(full_grad[rows], grad), (rows, "d hidden")


def test_registered_cross_tp_bitwise_for_hidden_contracts() -> None:
    registry = tpl.KernelRegistry()
    register_fused_backends(registry)
    bounds = LAYOUTS["tp3-uneven"]
    contract = tpl.LogprobContract(
        "infer",
        "bf16",
        tpl.MaskSpec(6),
        tpl.ShardingSpec(0, 3, bounds, REAL, PADDED),
        tpl.ReductionSpec("cross_tp_bitwise"),
        input_kind="hidden",
        hidden_size=24,
    )
    chosen = registry.get_logprob_op(contract, "triton_fused_exact_sum", platform=DEVICE.type)
    assert chosen.op is triton_fused_exact_sum_logprob
    capability = chosen.capability
    assert capability.determinism_scopes == {tpl.DeterminismScope.CROSS_TP_BITWISE}
    assert capability.input_kinds == {tpl.LogprobInputKind.HIDDEN}
    with pytest.raises(tpl.LogprobDispatchError):
        registry.get_logprob_op(contract, "triton_fused", platform=DEVICE.type)
