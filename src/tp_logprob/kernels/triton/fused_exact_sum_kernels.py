"""The fused LM head with layout-independent sums (``triton_fused_exact_sum``): two passes
over logits formed in registers, each running ``fused_kernels.logits_tile``.

``fused_exact_max_kernel``: one program per block of ``BLOCK_M`` rows walks the
rank's live columns in ``BLOCK``-wide tiles, forms ``z = (hidden @ W.T (+ bias)) / T``
(``fused_kernels.z_tile``: ``logits_tile``, then ``div_rn`` when ``T != 1``) and keeps each row's
max of ``z`` (NaNs set aside and reported as ``m = NaN``) and the owned target's
``z`` (``fused_kernels.picked_target``). It writes ``exact_sum_kernels``' stage
``(m_r, t_r)``, which is all-gathered as ``exact_sum``'s is.

``fused_exact_sum_kernel``: the same walk again (the matmul runs twice; nothing
``[N, vocab]``-sized is stored between the passes); per row the gathered maxima
give ``M`` (``gathered_max``), and each tile's ``d = z - M`` goes through
``exact_sum_kernels.fixed_point_fold``: int64 ``floor(exp(d) 2^K)`` (and the
entropy moment's truncated ``exp(d) d 2^K``) summed exactly. Rows whose ``M``
is not finite (a NaN, a ``+inf``, or no finite live logit, and rows past N) get
``d = -inf``, so every term is 0: their outputs come from ``M`` alone. The sums
are all-gathered and ``exact_sum_kernels.exact_merge_kernel`` finishes, unchanged.

Why the bits do not depend on the TP degree or the shard layout: ``logits_tile``'s
element ``x[t, v]`` is a function of hidden row ``t`` and weight row ``v`` only (the
K-loop runs over the hidden size in fixed ``BLOCK_K`` chunks in one order, the
tile shapes come from the launch table, and an element of an ``ieee`` fp32
``tl.dot`` is one FMA chain on NVIDIA; under the interpreter a chunk's products are
summed alike for every element; ``fused_kernels`` says where this premise holds, and
ROCm is not among those places); ``z``
is one IEEE division of it. So every ``z[t, v]`` has the same bits whichever
shard, tile or lane holds column ``v``; max is exact, so ``M`` is too; each
fixed-point term is a function of ``(z, M)``; and integer sums are exact and
associative, so the gathered total is the same integer for every split.
``test_triton_fused_exact_sum`` checks the outputs' bits across TP 1..4 layouts
under the interpreter, and ``tests/kernels/test_row_position.py`` a row at every
position of a batch; no GPU run has checked the per-element premise yet.

Traffic per row, with ``w`` the live columns, ``b`` the item size and ``B`` the
column tile: twice ``triton_fused``'s reads (``w H b / BLOCK_M + ceil(w / B) H b``
per pass) + 9 (target, active flag); written 8 (stage) and 8 (sums; 16 with
entropy); then the merge's ``16 R`` (``24 R``) bytes read.
"""

# triton ships no type hints, and Triton types kernel parameters itself:
# mypy: disable-error-code="untyped-decorator, no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl

from tp_logprob.kernels.triton.common_kernels import gathered_max
from tp_logprob.kernels.triton.exact_sum_kernels import fixed_point_fold
from tp_logprob.kernels.triton.fused_kernels import owned_targets, picked_target, z_tile
from tp_logprob.kernels.triton.support_kernels import masked_row_tiles, row_threshold

__all__ = ["fused_exact_max_kernel", "fused_exact_sum_kernel"]


@triton.jit
def fused_exact_max_kernel(
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
    stage_ptr,
    temperature_ptr,
    threshold_ptr,
    mask_ptr,
    mask_stride,
    SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SUPPORT: tl.constexpr,
    SEPARATE: tl.constexpr,
    STAGE: tl.constexpr,
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
    full_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    full_nans = tl.zeros([BLOCK_M], dtype=tl.int1)
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
            full_nan = z != z
            full_nans = full_nans | (tl.max(full_nan.to(tl.int32), axis=1) > 0)
            full_max = tl.maximum(full_max, tl.max(tl.where(full_nan, float("-inf"), z), axis=1))
        if SUPPORT != 0:  # outside S a column counts as padding does (its NaN, its target)
            z = masked_row_tiles(z, start, tau, mask_rows, live_width, SUPPORT, BLOCK)
        target = picked_target(z, cols, start, local, owned, target, BLOCK)
        is_nan = z != z
        row_nans = row_nans | (tl.max(is_nan.to(tl.int32), axis=1) > 0)
        running_max = tl.maximum(running_max, tl.max(tl.where(is_nan, float("-inf"), z), axis=1))
    base = stage_ptr + rows * STAGE
    tl.store(base, tl.where(row_nans, float("nan"), running_max), mask=row_mask)
    tl.store(base + 1, target, mask=row_mask)
    if SEPARATE:
        tl.store(base + 2, tl.where(full_nans, float("nan"), full_max), mask=row_mask)


@triton.jit
def fused_exact_sum_kernel(
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
    stage_ptr,
    num_ranks,
    sums_ptr,
    scale,
    temperature_ptr,
    threshold_ptr,
    mask_ptr,
    mask_stride,
    SCALE: tl.constexpr,
    ENTROPY: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SUM_FIELDS: tl.constexpr,
    SUPPORT: tl.constexpr,
    SEPARATE: tl.constexpr,
    STAGE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < num_rows
    maximum, has_nan = gathered_max(stage_ptr, rows, row_mask, num_ranks, num_rows, STAGE)
    finite = (maximum > float("-inf")) & (maximum < float("inf")) & ~has_nan
    shift = tl.where(finite, maximum, 0.0)
    tau = row_threshold(threshold_ptr, rows, row_mask, SUPPORT)
    mask_rows = mask_ptr + rows * mask_stride
    full_finite = finite
    full_shift = shift
    if SEPARATE:
        full_max, full_nan = gathered_max(stage_ptr + 2, rows, row_mask, num_ranks, num_rows, STAGE)
        full_finite = (full_max > float("-inf")) & (full_max < float("inf")) & ~full_nan
        full_shift = tl.where(full_finite, full_max, 0.0)
    units = tl.zeros([BLOCK_M], dtype=tl.int64)
    moment_units = tl.zeros([BLOCK_M], dtype=tl.int64)
    full_units = tl.zeros([BLOCK_M], dtype=tl.int64)
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
        # A finite M bounds every z of its row (the gathered max saw these same bits),
        # so d <= 0; other rows take d = -inf, i.e. terms of exactly 0.
        if SEPARATE:
            full_shifted = tl.where(full_finite[:, None], z - full_shift[:, None], float("-inf"))
            full_units += tl.sum((tl.exp(full_shifted) * scale).to(tl.int64), axis=1)
        if SUPPORT != 0:  # outside S a column counts as padding does
            z = masked_row_tiles(z, start, tau, mask_rows, live_width, SUPPORT, BLOCK)
        shifted = tl.where(finite[:, None], z - shift[:, None], float("-inf"))
        units, moment_units = fixed_point_fold(shifted, scale, units, moment_units, ENTROPY, 1)
    tl.store(sums_ptr + rows * SUM_FIELDS, units, mask=row_mask)
    if ENTROPY:
        tl.store(sums_ptr + rows * SUM_FIELDS + 1, moment_units, mask=row_mask)
    if SEPARATE:
        tl.store(sums_ptr + rows * SUM_FIELDS + (SUM_FIELDS - 1), full_units, mask=row_mask)
