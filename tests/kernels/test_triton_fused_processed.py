"""triton_fused and triton_fused_exact_sum with a sampling support (replayed or recomputed): the
logits path's support and values on the same logits, gradients, chunk boundaries, ranks with
different chunk sizes, memory (CPU interpreter)."""

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
    PADDED,
    REAL,
    as_f64,
    fused_and_logits_contracts,
    fused_case,
)
from tests.helpers.native_cases import assert_same_bits, bits
from tests.helpers.processed_cases import PROCESSED_OUTPUTS, kept_targets, processed_report
from tests.helpers.support_cases import live_z32, reference_support
from tp_logprob.kernels import fused_chunks
from tp_logprob.suite.allocations import track_allocations

pytest.importorskip(
    "triton", reason="the Triton fused backends need triton (on CPU, its interpreter)"
)
from tp_logprob.kernels.builtin import (
    ROCM_FUSED_CAPABILITIES,
    TRITON_FUSED,
    TRITON_FUSED_EXACT_SUM,
)
from tp_logprob.kernels.triton.exact_sum import triton_exact_sum_logprob
from tp_logprob.kernels.triton.fused import triton_fused_logprob
from tp_logprob.kernels.triton.fused_exact_sum import triton_fused_exact_sum_logprob
from tp_logprob.kernels.triton.fused_logits import fused_logits
from tp_logprob.kernels.triton.online import triton_online_logprob

pytestmark = pytest.mark.triton

SIZE = 16
LAYOUTS = {
    "tp1": ((0, 24),),
    "tp2-padding-shard": ((0, 19), (19, 24)),
    "tp3-uneven": ((0, 10), (10, 11), (11, 24)),
}
MASK = np.array([True, True, False, True, True, True, True, False, True, True])
RULES = {"top_k": 5, "top_p": 0.8, "min_p": 0.01}
TEMPERATURE = 0.8
PAIRS = {
    "triton_fused": (triton_fused_logprob, triton_online_logprob),
    "triton_fused_exact_sum": (triton_fused_exact_sum_logprob, triton_exact_sum_logprob),
}
"""Each fused backend and the logits backend it runs the sums of."""


def full_logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """The fused kernels' fp32 logits (``fused_logits``: the forward's tiles), NaN padding."""
    out = torch.empty((len(hidden), REAL), dtype=torch.float32, device=DEVICE)
    fused_logits(
        hidden.to(DEVICE), weight.to(DEVICE), None if bias is None else bias.to(DEVICE), REAL, out
    )
    return torch.cat([out.cpu(), torch.full((len(hidden), PADDED - REAL), float("nan"))], dim=1)


def case(seed: int, rows: int = 10) -> tuple[Any, ...]:
    """fp32 hidden, weight, bias, the logits, the rules' support and a target inside it."""
    hidden, weight, biases, _ = fused_case("fp32", seed=seed, num_tokens=rows, size=SIZE, bias=True)
    logits = full_logits(hidden, weight, biases)
    keep = reference_support(live_z32(logits, TEMPERATURE), **RULES).keep  # type: ignore[arg-type]
    return hidden, weight, biases, logits, keep, kept_targets(keep, seed)


def supports(keep: np.ndarray) -> dict[str, tpl.SupportSpec]:
    """The support recomputed from ``RULES``, and the same support replayed."""
    return {"recomputed": tpl.SupportSpec(**RULES), "replayed": tpl.SupportSpec.from_mask(keep)}  # type: ignore[arg-type]


def contracts(
    bounds: tuple[tuple[int, int], ...], support: tpl.SupportSpec, rows: int, **fields: Any
) -> tuple[tpl.LogprobContract, tpl.LogprobContract]:
    """The fused contract and the logits path's on the same invocation."""
    return fused_and_logits_contracts(
        bounds, support, rows, size=SIZE, temperature=TEMPERATURE, **fields
    )


def run_fused(
    op: Any,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    contract: tpl.LogprobContract,
    bias: torch.Tensor,
) -> list[tpl.LogprobResult]:
    on = [t.to(DEVICE) for t in (hidden, weight, targets, bias)]
    results = tpl.run_tp_hidden(op, on[0], on[1], on[2], contract, bias=on[3])
    return [_to_cpu(result) for result in results]


def _to_cpu(result: tpl.LogprobResult) -> tpl.LogprobResult:
    def cpu(value: Any) -> Any:
        return None if value is None else value.cpu()

    return tpl.LogprobResult(
        *(cpu(t) for t in result),
        support_lse=cpu(result.support_lse),
        support_size=cpu(result.support_size),
        support_threshold=cpu(result.support_threshold),
    )


@pytest.mark.parametrize("mode", ["recomputed", "replayed"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("backend", list(PAIRS))
def test_the_logits_paths_support_and_values_on_the_same_logits(
    backend: str, layout: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of a few rows (39 elements): a recomputed support's thresholds are found per
    chunk of the widest shard's rows on every rank. The support is the same bits;
    triton_fused_exact_sum's outputs are triton_exact_sum's bits (a logit's bits and the
    fixed-point sums do not depend on the tiles), triton_fused's lie within tolerance."""
    monkeypatch.setattr(fused_chunks, "CHUNK_ELEMENTS", 3 * 13)
    hidden, weight, biases, logits, keep, targets = case(3)
    fused, plain = contracts(LAYOUTS[layout], supports(keep)[mode], 10, active_mask=MASK)
    fused_op, logits_op = PAIRS[backend]
    got = run_fused(fused_op, hidden, weight, targets, fused, biases)[0]
    want = tpl.run_tp(logits_op, logits, targets, plain)[0]
    assert got.support_size.tolist() == keep.sum(axis=1).tolist()
    if backend == "triton_fused_exact_sum":
        for name in PROCESSED_OUTPUTS:
            a, b = getattr(got, name), getattr(want, name)
            if a is None or b is None:
                assert a is b is None and mode == "replayed", name
                continue
            assert_same_bits(a, b, name)
    else:
        assert processed_report(backend, got, want, plain) is None


@pytest.mark.parametrize("mode", ["recomputed", "replayed"])
@pytest.mark.parametrize("backend", list(PAIRS))
def test_gradients_are_the_logits_paths_through_the_lm_head(
    backend: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``d hidden`` and ``d W`` equal ``G W`` and ``G^T h`` with ``G`` the logits path's
    gradient on the same logits (zero outside ``S``); weight rows no row keeps get 0."""
    monkeypatch.setattr(fused_chunks, "CHUNK_ELEMENTS", 4 * 19)
    hidden, weight, biases, logits, keep, targets = case(5)
    fused, plain = contracts(
        LAYOUTS["tp3-uneven"], supports(keep)[mode], 10, active_mask=MASK, role="train"
    )
    fused_op, logits_op = PAIRS[backend]
    on = [t.to(DEVICE).requires_grad_(True) for t in (hidden, weight)]
    results = tpl.run_tp_hidden(
        fused_op, on[0], on[1], targets.to(DEVICE), fused, bias=biases.to(DEVICE)
    )
    sum((r.selected_logp - 0.5 * r.entropy).sum() for r in results).backward()  # type: ignore[union-attr]
    leaf = logits.clone().requires_grad_(True)
    native = tpl.run_tp(logits_op, leaf, targets, plain)
    sum((r.selected_logp - 0.5 * r.entropy).sum() for r in native).backward()  # type: ignore[union-attr]
    assert on[0].grad is not None and on[1].grad is not None and leaf.grad is not None
    g = as_f64(leaf.grad)[:, :REAL]
    assert (g[~keep] == 0).all()
    w, h = as_f64(weight)[:REAL], as_f64(hidden)
    d_hidden, d_weight = as_f64(on[0].grad.cpu()), as_f64(on[1].grad.cpu())
    np.testing.assert_allclose(d_hidden, g @ w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(d_weight[:REAL], g.T @ h, rtol=1e-5, atol=1e-6)
    never_kept = ~(g != 0).any(axis=0)
    assert never_kept.any() and (d_weight[:REAL][never_kept] == 0).all()
    assert (d_weight[REAL:] == 0).all()


@pytest.mark.parametrize("backend", list(PAIRS))
def test_batch_invariant_across_chunk_boundaries(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fused_chunks, "CHUNK_ELEMENTS", 3 * 19)
    hidden, weight, biases, _, _, targets = case(7)
    support = tpl.SupportSpec(**RULES)  # type: ignore[arg-type]

    def run(rows: slice) -> tpl.LogprobResult:
        count = len(range(10)[rows])
        fused, _ = contracts(LAYOUTS["tp3-uneven"], support, count)
        return run_fused(PAIRS[backend][0], hidden[rows], weight, targets[rows], fused, biases)[0]

    full = run(slice(0, 10))
    for rows in (slice(0, 1), slice(2, 7), slice(7, 10)):
        part = run(rows)
        for name in PROCESSED_OUTPUTS:
            assert torch.equal(bits(getattr(full, name)[rows]), bits(getattr(part, name))), name


@pytest.mark.parametrize("mode", ["recomputed", "replayed"])
def test_never_materializes_the_whole_logits_in_fp32(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The threshold's chunks and the backward's chunk are the only ``[*, live]`` fp32
    tensors; a replayed mask travels as one int32 word per 32 columns."""
    monkeypatch.setattr(fused_chunks, "CHUNK_ELEMENTS", 2 * REAL)
    hidden, weight, biases, _, keep, targets = case(9, rows=12)
    fused, _ = contracts(LAYOUTS["tp1"], supports(keep)[mode], 12, role="train")
    hidden = hidden.to(DEVICE).requires_grad_(True)
    with track_allocations() as seen:
        op = seen.wrap(triton_fused_logprob)
        result = tpl.run_tp_hidden(
            op, hidden, weight.to(DEVICE), targets.to(DEVICE), fused, bias=biases.to(DEVICE)
        )[0]
        (result.selected_logp.sum() + result.entropy.sum()).backward()
    widths = {REAL, PADDED}
    assert fused_chunks.chunk_rows(fused) == fused_chunks.shared_chunk_rows(fused) == 2
    assert seen.max_rows(torch.float32, widths) == 2
    assert seen.max_rows(torch.bool, widths) <= 2
    assert seen.max_rows(torch.int64, widths) <= 2


@pytest.mark.parametrize(
    "support",
    [tpl.SupportSpec(**RULES), tpl.SupportSpec.from_kept_lists([])],  # type: ignore[arg-type]
    ids=["recomputed", "replayed"],
)
@pytest.mark.parametrize("backend", list(PAIRS))
def test_no_rows(backend: str, support: tpl.SupportSpec) -> None:
    hidden, weight, biases, _, _, _ = case(1)
    fused, _ = contracts(LAYOUTS["tp3-uneven"], support, 0)
    no_targets = torch.zeros(0, dtype=torch.int64)
    result = run_fused(PAIRS[backend][0], hidden[:0], weight, no_targets, fused, biases)[0]
    assert result.selected_logp.shape == result.support_size.shape == (0,)


CAPABILITIES = {
    "triton_fused": TRITON_FUSED,
    "triton_fused_exact_sum": TRITON_FUSED_EXACT_SUM,
    **{f"{backend}-rocm": capability for backend, capability in ROCM_FUSED_CAPABILITIES.items()},
}


@pytest.mark.parametrize("name", list(CAPABILITIES))
def test_fused_backends_serve_every_support_mode(name: str) -> None:
    assert CAPABILITIES[name].served_values("support_mode") == set(tpl.SupportMode)
