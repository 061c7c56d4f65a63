"""The fused LM head in Triton (``triton_fused``): logits formed tile by tile in registers.

``logits_tile`` forms one fp32 ``[BLOCK_M, BLOCK]`` tile ``x = hidden @ W.T (+ bias)``
by a K-loop over the hidden size in ``BLOCK_K`` chunks: each chunk's operands are
widened to fp32 exactly (``widen``) and multiplied by ``tl.dot`` with
``input_precision="ieee"`` (fp32 products and sums, no TF32; under the
interpreter, ``DOT`` false, by elementwise products and ``tl.sum``), accumulating
into the tile; the bias is added once at the end. Rows past ``num_rows``, columns
past ``live_width`` (the padding rows of ``W``, whatever they hold) and hidden indices past
the hidden size are masked loads: never read.

``fused_partial_kernel``: one program per block of ``BLOCK_M`` rows walks the
rank's live columns in ``BLOCK``-wide tiles and folds each tile into the online
softmax partial of ``online_kernels.online_partial_kernel``: ``z = x / T``
(``div_rn``), per-lane sums rescaled to the running row max, the entropy moment
``q`` in the same pass, NaNs set aside and reported as ``m = NaN``, and the
owner's target ``z`` picked from the tile that holds it. It writes the fp32
``(m, s, t[, q])`` partial of ``merge.pack_partial``'s layout, so the logits
backends' merge serves it unchanged. With a support (``SUPPORT``, ``support_kernels``)
each tile's columns outside ``S`` count as ``-inf``: a threshold per row (4 bytes),
or the packed mask's words of the tile (``BLOCK / 8`` bytes per row); with
``SEPARATE`` the full vocabulary's ``(m, s, t)`` follows the support's fields, for
``lse``: one more sum a row (``row_update``: each tile's terms summed at once, fewer
registers than one a lane), and a second ``exp`` per logit, small beside the ``H``
multiply-adds that form it. Nothing ``[N, vocab]``-sized exists: per
row it reads ``H`` hidden elements once per column tile (cached), the rank's
live ``W`` rows once per row block, and writes 12 bytes (16 with entropy).

``fused_logits_kernel`` (backward): one program per ``(row block, column tile)``
stores the same fp32 ``x`` tile into a caller's chunk buffer, for the logits
backends' elementwise gradient kernel to turn into ``G = d out / d x`` in place.

Determinism: the tile shapes come from the launch table (platform only) and the
K loop runs in one fixed order. Batch invariance (and ``triton_fused_exact_sum``'s
cross-TP bits) rest on one more premise: an element of the ``tl.dot`` tile is a
function of its row of ``hidden`` and its column of ``W.T`` alone, wherever the
row and column sit in the tile. Where it holds:

- NVIDIA: an ``ieee`` fp32 ``tl.dot`` never reaches the tensor cores; Triton's FMA
  dot lowering gives each element one FMA chain over ``k`` in order, the same for
  every element and every chunk depth. Holds by construction.
- The interpreter (CPU): ``tl.dot`` is numpy's matmul, and BLAS micro-kernels give
  a row other bits at another position of a register block (OpenBLAS's Haswell
  kernels do). So there (``DOT`` false, ``launch.FUSED_DOT``) a chunk is the
  ``[BLOCK_M, BLOCK_K, BLOCK_N]`` fp32 products, one rounded product per element,
  summed over ``k`` by one numpy reduction (``tl.sum``), which runs the same loop
  for every element of the tile, then added to the accumulator elementwise. Holds
  by construction, for one chunk depth (all passes take the same one on CPU).
- ROCm: Triton lowers an fp32 ``tl.dot`` to MFMA instructions, whose per-element
  summation order AMD does not document. Not established: the fused Triton
  backends claim run-to-run bits only there (``kernels/builtin.py``).

Then a row's ``x`` and its partial do not depend on N, on the other rows of its
block, or on the run, and the backward recomputes the forward's ``x`` bit for
bit. The kernels never compute ``inf - inf`` or ``0 * inf`` (see ``common_kernels``).
"""

# triton ships no type hints, and Triton types kernel parameters itself:
# mypy: disable-error-code="untyped-decorator, no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl

from tp_logprob.kernels.triton.common_kernels import (
    entropy_term,
    row_temperature,
    scaled,
    widen,
)
from tp_logprob.kernels.triton.support_kernels import masked_row_tiles, row_threshold

__all__ = [
    "fused_logits_kernel",
    "fused_partial_kernel",
    "logits_tile",
    "online_update",
    "owned_targets",
    "picked_target",
    "row_update",
    "z_tile",
]


@triton.jit
def logits_tile(
    hidden_ptr,
    hidden_strides,
    weight_ptr,
    weight_strides,
    bias_ptr,
    rows,
    cols,
    row_mask,
    col_mask,
    size,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT: tl.constexpr,
):
    """fp32 ``x[rows, cols] = hidden @ W.T (+ bias)``; masked rows and columns read nothing.

    ``*_strides`` are ``(row stride, column stride)`` pairs of element counts.
    """
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    depth = tl.arange(0, BLOCK_K)
    hidden_rows = hidden_ptr + rows[:, None] * hidden_strides[0]
    weight_cols = weight_ptr + cols[None, :] * weight_strides[0]
    for k_start in range(0, size, BLOCK_K):
        ks = k_start + depth
        in_k = ks < size
        a = tl.load(
            hidden_rows + ks[None, :] * hidden_strides[1],
            mask=row_mask[:, None] & in_k[None, :],
            other=0.0,
        )
        b = tl.load(
            weight_cols + ks[:, None] * weight_strides[1],
            mask=in_k[:, None] & col_mask[None, :],
            other=0.0,
        )
        if DOT:
            acc = tl.dot(widen(a), widen(b), acc, input_precision="ieee")
        else:
            acc += tl.sum(widen(a)[:, :, None] * widen(b)[None, :, :], axis=1)
    if HAS_BIAS:
        acc += widen(tl.load(bias_ptr + cols, mask=col_mask, other=0.0))[None, :]
    return acc


@triton.jit
def online_update(z, running_max, lane_sums, lane_moments, ENTROPY: tl.constexpr):
    """Fold a NaN-free ``z`` tile into the per-row max and per-lane sums (and moments).

    A row whose new max is not finite (all ``-inf`` so far, or ``+inf``) gets
    ``rescale = 1`` and all-zero weights, so its sums pass through unchanged, and
    no lane evaluates ``inf - inf``: the block-of-rows form of the online kernel's
    uniform branch.
    """
    new_max = tl.maximum(running_max, tl.max(z, axis=1))
    finite = (new_max > float("-inf")) & (new_max < float("inf"))
    shift = tl.where(finite, new_max, 0.0)
    gap = tl.where(finite, running_max - shift, 0.0)
    rescale = tl.exp(gap)
    shifted = tl.where(finite[:, None], z - shift[:, None], float("-inf"))
    weights = tl.exp(shifted)
    if ENTROPY:
        # Where the old sums are dropped (m_old = -inf, or the rescale underflowed) a
        # gap of 0 keeps gap * s from overflowing into 0 * -inf.
        kept_gap = tl.where(rescale > 0.0, gap, 0.0)
        lane_moments = rescale[:, None] * (
            lane_moments + kept_gap[:, None] * lane_sums
        ) + entropy_term(weights, shifted)
    lane_sums = lane_sums * rescale[:, None] + weights
    return new_max, lane_sums, lane_moments


@triton.jit
def row_update(z, running_max, row_sums):
    """:func:`online_update` with one sum a row instead of one a lane: each tile's terms
    are summed at once (fewer registers, another summation order)."""
    new_max = tl.maximum(running_max, tl.max(z, axis=1))
    finite = (new_max > float("-inf")) & (new_max < float("inf"))
    shift = tl.where(finite, new_max, 0.0)
    rescale = tl.exp(tl.where(finite, running_max - shift, 0.0))
    weights = tl.exp(tl.where(finite[:, None], z - shift[:, None], float("-inf")))
    return new_max, row_sums * rescale + tl.sum(weights, axis=1)


@triton.jit
def z_tile(
    hidden_ptr,
    hidden_strides,
    weight_ptr,
    weight_strides,
    bias_ptr,
    rows,
    cols,
    row_mask,
    col_mask,
    size,
    temperature_ptr,
    SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT: tl.constexpr,
):
    """fp32 ``z = x / T`` of ``logits_tile``'s ``x``, each row by its own ``T``; ``-inf`` in
    columns past the live width."""
    x = logits_tile(
        hidden_ptr,
        hidden_strides,
        weight_ptr,
        weight_strides,
        bias_ptr,
        rows,
        cols,
        row_mask,
        col_mask,
        size,
        HAS_BIAS,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        DOT,
    )
    z = tl.where(col_mask[None, :], x, float("-inf"))
    if SCALE:
        divisors = row_temperature(temperature_ptr, rows, row_mask, SCALE)
        return scaled(z, divisors[:, None], SCALE)
    else:
        return z


@triton.jit
def owned_targets(targets_ptr, active_ptr, rows, row_mask, col_start, live_width):
    """Each row's target as a local column and whether this rank owns it (active rows only:
    an inactive row's target is never read)."""
    active = tl.load(active_ptr + rows, mask=row_mask, other=0) != 0
    local = tl.load(targets_ptr + rows, mask=active, other=-1).to(tl.int64) - col_start
    return local, active & (local >= 0) & (local < live_width)


@triton.jit
def picked_target(z, cols, start, local, owned, target, BLOCK: tl.constexpr):
    """``target`` with each owned row's ``z`` at its local target column ``local`` taken
    from the tile of columns ``cols`` (``start`` to ``start + BLOCK``) when the tile holds it."""
    # Adding -0.0 is exact for every z (NaN and -0.0 included): the sum is the target's z.
    picked = tl.sum(tl.where(cols[None, :] == local[:, None], z, -0.0), axis=1)
    return tl.where(owned & (local >= start) & (local < start + BLOCK), picked, target)


@triton.jit
def fused_partial_kernel(
    hidden_ptr,
    hidden_row_stride,
    hidden_col_stride,
    weight_ptr,
    weight_row_stride,
    weight_col_stride,
    bias_ptr,
    num_rows,
    size,
    live_width,
    col_start,
    targets_ptr,
    active_ptr,
    partial_ptr,
    temperature_ptr,
    threshold_ptr,
    mask_ptr,
    mask_stride,
    SCALE: tl.constexpr,
    ENTROPY: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    FIELDS: tl.constexpr,
    SUPPORT: tl.constexpr,
    SEPARATE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < num_rows
    local, owned = owned_targets(targets_ptr, active_ptr, rows, row_mask, col_start, live_width)
    tau = row_threshold(threshold_ptr, rows, row_mask, SUPPORT)
    mask_rows = mask_ptr + rows * mask_stride
    running_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_nans = tl.zeros([BLOCK_M], dtype=tl.int1)
    target = tl.zeros([BLOCK_M], dtype=tl.float32)
    lane_sums = tl.zeros([BLOCK_M, BLOCK], dtype=tl.float32)
    lane_moments = tl.zeros([BLOCK_M, BLOCK], dtype=tl.float32)
    full_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    full_nans = tl.zeros([BLOCK_M], dtype=tl.int1)
    full_target = tl.zeros([BLOCK_M], dtype=tl.float32)
    full_sums = tl.zeros([BLOCK_M], dtype=tl.float32)
    offsets = tl.arange(0, BLOCK)
    for start in range(0, live_width, BLOCK):
        cols = start + offsets
        z = z_tile(
            hidden_ptr,
            (hidden_row_stride, hidden_col_stride),
            weight_ptr,
            (weight_row_stride, weight_col_stride),
            bias_ptr,
            rows,
            cols,
            row_mask,
            cols < live_width,
            size,
            temperature_ptr,
            SCALE,
            HAS_BIAS,
            BLOCK_M,
            BLOCK,
            BLOCK_K,
            DOT,
        )
        if SEPARATE:
            # The full vocabulary's (m, s, t), for lse, with one sum a row (registers).
            full_target = picked_target(z, cols, start, local, owned, full_target, BLOCK)
            full_nan = z != z
            full_nans = full_nans | (tl.max(full_nan.to(tl.int32), axis=1) > 0)
            clean = tl.where(full_nan, float("-inf"), z)
            full_max, full_sums = row_update(clean, full_max, full_sums)
        if SUPPORT != 0:  # outside S a column counts as padding does (its NaN, its target)
            z = masked_row_tiles(z, start, tau, mask_rows, live_width, SUPPORT, BLOCK)
        target = picked_target(z, cols, start, local, owned, target, BLOCK)
        is_nan = z != z
        row_nans = row_nans | (tl.max(is_nan.to(tl.int32), axis=1) > 0)
        running_max, lane_sums, lane_moments = online_update(
            tl.where(is_nan, float("-inf"), z), running_max, lane_sums, lane_moments, ENTROPY
        )
    base = partial_ptr + rows * FIELDS
    tl.store(base, tl.where(row_nans, float("nan"), running_max), mask=row_mask)
    tl.store(base + 1, tl.sum(lane_sums, axis=1), mask=row_mask)
    tl.store(base + 2, target, mask=row_mask)
    if ENTROPY:
        tl.store(base + 3, tl.sum(lane_moments, axis=1), mask=row_mask)
    if SEPARATE:
        full = base + (FIELDS - 3)
        tl.store(full, tl.where(full_nans, float("nan"), full_max), mask=row_mask)
        tl.store(full + 1, full_sums, mask=row_mask)
        tl.store(full + 2, full_target, mask=row_mask)


@triton.jit
def fused_logits_kernel(
    hidden_ptr,
    hidden_row_stride,
    hidden_col_stride,
    weight_ptr,
    weight_row_stride,
    weight_col_stride,
    bias_ptr,
    num_rows,
    size,
    live_width,
    out_ptr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    row_mask = rows < num_rows
    col_mask = cols < live_width
    x = logits_tile(
        hidden_ptr,
        (hidden_row_stride, hidden_col_stride),
        weight_ptr,
        (weight_row_stride, weight_col_stride),
        bias_ptr,
        rows,
        cols,
        row_mask,
        col_mask,
        size,
        HAS_BIAS,
        BLOCK_M,
        BLOCK,
        BLOCK_K,
        DOT,
    )
    out = out_ptr + rows[:, None] * live_width + cols[None, :]
    tl.store(out, x, mask=row_mask[:, None] & col_mask[None, :])
