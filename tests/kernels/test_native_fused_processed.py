"""torch_native_fused with a sampling support (replayed or recomputed): torch_native's bits on
the same logits, gradients, chunk boundaries, ranks with different chunk sizes, memory."""

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
    fused_and_logits_contracts,
    fused_case,
)
from tests.helpers.native_cases import bits
from tests.helpers.support_cases import live_z32, reference_support
from tp_logprob.kernels import fused_chunks
from tp_logprob.kernels.fused_chunks import logits_chunk
from tp_logprob.kernels.native import torch_native_logprob
from tp_logprob.kernels.native_fused import torch_native_fused_logprob
from tp_logprob.suite.allocations import track_allocations

SIZE = 16
LAYOUTS = {
    "tp1": ((0, 24),),
    "tp2-padding-shard": ((0, 19), (19, 24)),
    "tp3-uneven": ((0, 10), (10, 11), (11, 24)),
}
MASK = np.array([True, True, False, True, True, True, True, False, True, True])
RULES = {"top_k": 5, "top_p": 0.8, "min_p": 0.01}
OUTPUTS = ("selected_logp", "lse", "entropy", "support_lse", "support_size", "support_threshold")


def full_logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """The fused op's fp32 logits (one matrix-vector product per row), NaN padding."""
    x = logits_chunk(
        hidden.float(), weight[:REAL].float(), None if bias is None else bias[:REAL].float()
    )
    return torch.cat([x, torch.full((len(hidden), PADDED - REAL), float("nan"))], dim=1)


def layout_logits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    bounds: tuple[tuple[int, int], ...],
) -> torch.Tensor:
    """The logits as the fused op forms them under ``bounds``: each rank's product over its
    own weight rows. A BLAS matrix-vector product may round a row of the matrix by where it
    sits in the call (its micro-kernel's edge blocks), so the product over a shard need not
    have the bits of the same rows inside the whole matrix's product."""
    pieces = [
        logits_chunk(hidden.float(), weight[lo:end].float(), bias[lo:end].float())
        for lo, hi in bounds
        if lo < (end := min(hi, REAL))
    ]
    x = torch.cat(pieces, dim=1)
    return torch.cat([x, torch.full((len(hidden), PADDED - REAL), float("nan"))], dim=1)


TEMPERATURE = 0.8


def rules_keep(logits: torch.Tensor) -> np.ndarray:
    """The rules' support of every row at ``TEMPERATURE`` (float64 reference)."""
    z = live_z32(logits, TEMPERATURE)
    return reference_support(z, **RULES).keep  # type: ignore[arg-type]


def supports(logits: torch.Tensor) -> dict[str, tpl.SupportSpec]:
    """The support recomputed from ``RULES``, and the same support replayed."""
    replayed = tpl.SupportSpec.from_mask(rules_keep(logits))
    return {"recomputed": tpl.SupportSpec(**RULES), "replayed": replayed}  # type: ignore[arg-type]


def case(seed: int, rows: int = 10) -> tuple[Any, ...]:
    """fp32 hidden, weight, bias, a target inside each row's support, and the logits."""
    hidden, weight, biases, _ = fused_case("fp32", seed=seed, num_tokens=rows, size=SIZE, bias=True)
    assert biases is not None
    logits = full_logits(hidden, weight, biases)
    targets = torch.tensor([int(np.flatnonzero(row)[-1]) for row in rules_keep(logits)])
    return hidden, weight, biases, targets, logits


def contracts(
    bounds: tuple[tuple[int, int], ...], support: tpl.SupportSpec, rows: int, **fields: Any
) -> tuple[tpl.LogprobContract, tpl.LogprobContract]:
    """The fused contract and torch_native's on the same invocation."""
    return fused_and_logits_contracts(
        bounds, support, rows, size=SIZE, temperature=TEMPERATURE, **fields
    )


@pytest.mark.parametrize("mode", ["recomputed", "replayed"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_bitwise_equal_to_torch_native_on_the_same_logits(
    layout: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of a few rows (39 elements): with a replayed mask a narrower shard takes more
    rows per chunk; recomputed supports walk the widest shard's chunks on every rank."""
    monkeypatch.setattr(fused_chunks, "CHUNK_ELEMENTS", 3 * 13)
    hidden, weight, biases, targets, _ = case(3)
    logits = layout_logits(hidden, weight, biases, LAYOUTS[layout])
    fused, plain = contracts(LAYOUTS[layout], supports(logits)[mode], 10, active_mask=MASK)
    got = tpl.run_tp_hidden(torch_native_fused_logprob, hidden, weight, targets, fused, bias=biases)
    want = tpl.run_tp(torch_native_logprob, logits, targets, plain)
    for name in OUTPUTS:
        a, b = getattr(got[0], name), getattr(want[0], name)
        if a is None or b is None:
            assert a is b is None and mode == "replayed", name
            continue
        assert torch.equal(bits(a), bits(b)), name


@pytest.mark.parametrize("mode", ["recomputed", "replayed"])
def test_gradients_are_torch_natives_through_the_lm_head(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``d hidden`` and ``d W`` equal ``G W`` and ``G^T h`` with ``G`` torch_native's logits
    gradient on the same logits (zero outside ``S``); weight rows no row keeps get 0."""
    monkeypatch.setattr(fused_chunks, "CHUNK_ELEMENTS", 4 * 19)
    hidden, weight, biases, targets, logits = case(5)
    support = supports(logits)[mode]
    fused, plain = contracts(LAYOUTS["tp3-uneven"], support, 10, active_mask=MASK, role="train")
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    results = tpl.run_tp_hidden(
        torch_native_fused_logprob, hidden, weight, targets, fused, bias=biases
    )
    sum((r.selected_logp - 0.5 * r.entropy).sum() for r in results).backward()  # type: ignore[union-attr]
    leaf = logits.clone().requires_grad_(True)
    native = tpl.run_tp(torch_native_logprob, leaf, targets, plain)
    sum((r.selected_logp - 0.5 * r.entropy).sum() for r in native).backward()  # type: ignore[union-attr]
    assert hidden.grad is not None and weight.grad is not None and leaf.grad is not None
    g = as_f64(leaf.grad)[:, :REAL]
    w, h = as_f64(weight)[:REAL], as_f64(hidden)
    np.testing.assert_allclose(as_f64(hidden.grad), g @ w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(as_f64(weight.grad)[:REAL], g.T @ h, rtol=1e-5, atol=1e-6)
    never_kept = ~(g != 0).any(axis=0)
    assert never_kept.any() and (as_f64(weight.grad)[:REAL][never_kept] == 0).all()
    assert (as_f64(weight.grad)[REAL:] == 0).all()


def test_batch_invariant_across_chunk_boundaries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused_chunks, "CHUNK_ELEMENTS", 3 * 19)
    hidden, weight, biases, targets, _ = case(7)
    support = tpl.SupportSpec(**RULES)  # type: ignore[arg-type]

    def run(rows: slice) -> tpl.LogprobResult:
        count = len(range(10)[rows])
        fused, _ = contracts(LAYOUTS["tp3-uneven"], support, count)
        return tpl.run_tp_hidden(
            torch_native_fused_logprob, hidden[rows], weight, targets[rows], fused, bias=biases
        )[0]

    full = run(slice(0, 10))
    for rows in (slice(0, 1), slice(1, 10), slice(2, 7), slice(7, 10)):
        part = run(rows)
        for name in OUTPUTS:
            assert torch.equal(bits(getattr(full, name)[rows]), bits(getattr(part, name))), name


@pytest.mark.parametrize("mode", ["recomputed", "replayed"])
def test_never_materializes_the_whole_logits_in_fp32(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fused_chunks, "CHUNK_ELEMENTS", 2 * REAL)
    hidden, weight, biases, targets, logits = case(9, rows=12)
    fused, _ = contracts(LAYOUTS["tp1"], supports(logits)[mode], 12, role="train")
    hidden.requires_grad_(True)
    with track_allocations() as seen:
        op = seen.wrap(torch_native_fused_logprob)
        result = tpl.run_tp_hidden(op, hidden, weight, targets, fused, bias=biases)[0]
        (result.selected_logp.sum() + result.entropy.sum()).backward()
    widths = {REAL, PADDED}
    assert seen.max_rows(torch.float32, widths) == fused_chunks.chunk_rows(fused) == 2
    assert seen.max_rows(torch.int64, widths) <= 2
    assert seen.max_rows(torch.bool, widths) <= 2


@pytest.mark.parametrize(
    "support",
    [tpl.SupportSpec(**RULES), tpl.SupportSpec.from_kept_lists([])],  # type: ignore[arg-type]
    ids=["recomputed", "replayed"],
)
def test_no_rows(support: tpl.SupportSpec) -> None:
    hidden, weight, biases, _, _ = case(1)
    fused, _ = contracts(LAYOUTS["tp3-uneven"], support, 0)
    no_targets = torch.zeros(0, dtype=torch.int64)
    result = tpl.run_tp_hidden(
        torch_native_fused_logprob, hidden[:0], weight, no_targets, fused, bias=biases
    )[0]
    assert result.selected_logp.shape == result.support_size.shape == (0,)
