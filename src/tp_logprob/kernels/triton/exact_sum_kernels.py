"""Fixed-point sums that do not depend on the shard layout (``triton_exact_sum``).

Three kernels, with an all-gather after each of the first two:

``exact_max_kernel``: one program per row takes the max of ``z = x / T`` (IEEE
division, only when ``T != 1``) over the row's live columns (per-lane maxima in
``BLOCK``-wide tiles, NaNs set aside and reported as ``m = NaN``) and the owned
target's ``z``. Max is exact and order-free, so the
gathered global ``M`` is the same for every layout. Traffic per row:
``live_width * itemsize`` bytes read, 8 bytes written.

``exact_sum_kernel``: one program per row folds the gathered maxima into ``M``
and, when ``M`` is finite, turns each ``exp(x - M)`` (in ``[0, 1]``, elementwise
so identical whatever the shard) into an int64 with ``K`` fractional bits
(``floor(exp(x - M) * 2^K)``), and sums the integers. Integer addition is exact and
associative, so a rank's partial sum, and the total over ranks, are the same
integers for every split of the vocabulary. With entropy it also sums
``exp(d) d`` (``d = z - M``, in ``[-1/e, 0]``, 0 for ``d = -inf``) the same way,
truncated toward zero to ``K`` fractional bits: the entropy is bitwise layout
independent too. Traffic per row: ``live_width * itemsize`` bytes read (again),
8 bytes written (16 with entropy). Its per-tile step, ``fixed_point_fold``, is
shared with ``triton_fused_exact_sum`` (``fused_exact_sum_kernels``).

``exact_merge_kernel``: one program per block of rows adds the gathered int64
sums, converts once, ``S = S_int * 2^-K``, and writes ``LSE = M + log S`` (fp64,
rounded once), and with entropy ``Q = Q_int * 2^-K`` and
``entropy = log S - Q / S``. Traffic per row: ``16 R`` bytes read (``24 R`` with
entropy) plus target and flag.
"""

# triton ships no type hints, and Triton types kernel parameters itself:
# mypy: disable-error-code="untyped-decorator, no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl

from tp_logprob.kernels.triton.common_kernels import (
    entropy_term,
    gathered_max,
    owned_target_logit,
    owner_target_logit,
    row_temperature,
    scaled,
    store_entropy,
    store_lse,
    store_results,
    widen,
)
from tp_logprob.kernels.triton.portable_math import row_exp
from tp_logprob.kernels.triton.support_kernels import masked_tile, row_threshold, support_target

__all__ = [
    "FULL_STAGE_FIELDS",
    "STAGE_FIELDS",
    "exact_max_kernel",
    "exact_merge_kernel",
    "exact_sum_kernel",
    "fixed_point_add",
    "fixed_point_fold",
]

STAGE_FIELDS = tl.constexpr(2)  # (m_r, t_r) per row, gathered before the sums
FULL_STAGE_FIELDS = tl.constexpr(3)  # a support's (m_r, t_r) over S, then the full m_r


@triton.jit
def exact_max_kernel(
    logits_ptr,
    row_stride,
    width,
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
    SUPPORT: tl.constexpr,
    SEPARATE: tl.constexpr,
    STAGE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * row_stride
    temperature = row_temperature(temperature_ptr, row, row >= 0, SCALE)
    tau = row_threshold(threshold_ptr, row, row >= 0, SUPPORT)
    mask_row_ptr = mask_ptr + row * mask_stride
    offsets = tl.arange(0, BLOCK)
    lane_max = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    lane_nans = tl.zeros([BLOCK], dtype=tl.int1)
    full_max = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    full_nans = tl.zeros([BLOCK], dtype=tl.int32)  # int32: int1 lanes fill AMD scalar registers
    for start in range(0, live_width, BLOCK):
        cols = start + offsets
        x = widen(tl.load(row_ptr + cols, mask=cols < live_width, other=float("-inf")))
        x = scaled(x, temperature, SCALE)
        if SEPARATE:
            full_nans = full_nans | (x != x).to(tl.int32)
            full_max = tl.maximum(full_max, x)
        if SUPPORT != 0:  # outside S a column counts as padding does (its NaN too)
            x = masked_tile(x, start, tau, mask_row_ptr, live_width, SUPPORT, BLOCK)
        lane_nans = lane_nans | (x != x)
        lane_max = tl.maximum(lane_max, x)  # NaN-ignoring (maxnum), so the max is NaN-free
    has_nan = tl.max(lane_nans.to(tl.int32), axis=0) > 0
    base = stage_ptr + row * STAGE
    tl.store(base, tl.where(has_nan, float("nan"), tl.max(lane_max, axis=0)))
    target = owned_target_logit(
        row_ptr, targets_ptr, active_ptr, row, col_start, width, temperature, SCALE
    )
    if SUPPORT != 0:
        target = support_target(
            target, targets_ptr, active_ptr, row, col_start, live_width, tau, mask_row_ptr, SUPPORT
        )
    tl.store(base + 1, target)
    if SEPARATE:
        full_has_nan = tl.max(full_nans, axis=0) > 0
        tl.store(base + 2, tl.where(full_has_nan, float("nan"), tl.max(full_max, axis=0)))


@triton.jit
def exact_sum_kernel(
    logits_ptr,
    row_stride,
    live_width,
    stage_ptr,
    num_ranks,
    num_rows,
    sums_ptr,
    scale,
    temperature_ptr,
    threshold_ptr,
    mask_ptr,
    mask_stride,
    SCALE: tl.constexpr,
    ENTROPY: tl.constexpr,
    SUM_FIELDS: tl.constexpr,
    SUPPORT: tl.constexpr,
    SEPARATE: tl.constexpr,
    STAGE: tl.constexpr,
    PORTABLE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * row_stride
    temperature = row_temperature(temperature_ptr, row, row >= 0, SCALE)
    offsets = tl.arange(0, BLOCK)
    maximum, has_nan = gathered_max(stage_ptr, row, row < num_rows, num_ranks, num_rows, STAGE)
    finite = (maximum > float("-inf")) & (maximum < float("inf")) & ~has_nan
    shift = tl.where(finite, maximum, 0.0)
    # Rows whose M is not finite get their LSE from M alone: skip the pass.
    limit = tl.where(finite, live_width, 0)
    tau = row_threshold(threshold_ptr, row, row >= 0, SUPPORT)
    mask_row_ptr = mask_ptr + row * mask_stride
    full_finite = finite
    full_shift = shift
    if SEPARATE:
        full_max, full_nan = gathered_max(
            stage_ptr + 2, row, row < num_rows, num_ranks, num_rows, STAGE
        )
        full_finite = (full_max > float("-inf")) & (full_max < float("inf")) & ~full_nan
        full_shift = tl.where(full_finite, full_max, 0.0)
        limit = tl.where(finite | full_finite, live_width, 0)
    # S's maximum is the full one wherever S holds the row's largest value (always, for a
    # threshold's upper set): S's terms are then the full terms on S, with no second exp.
    shared = finite & full_finite & (full_shift == shift)
    # One int64 per row, not per lane: integer sums are exact in any order, and 16
    # int64 lanes (32 with entropy) per thread spilled on sm_80.
    units = tl.zeros([], dtype=tl.int64)
    moment_units = tl.zeros([], dtype=tl.int64)
    full_units = tl.zeros([], dtype=tl.int64)
    for start in range(0, limit, BLOCK):
        cols = start + offsets
        x = widen(tl.load(row_ptr + cols, mask=cols < live_width, other=float("-inf")))
        z = scaled(x, temperature, SCALE)
        if SEPARATE:
            full_shifted = tl.where(full_finite, z - full_shift, float("-inf"))
            full_weights = row_exp(full_shifted, PORTABLE)
            full_units += tl.sum((full_weights * scale).to(tl.int64), axis=0)
            z = masked_tile(z, start, tau, mask_row_ptr, live_width, SUPPORT, BLOCK)
            if shared:  # the same terms as the else branch's, with no second exp
                in_support = z > float("-inf")
                shifted = tl.where(in_support, full_shifted, float("-inf"))
                weights = tl.where(in_support, full_weights, 0.0)
            else:
                shifted = tl.where(finite, z - shift, float("-inf"))
                weights = row_exp(shifted, PORTABLE)
            units, moment_units = fixed_point_add(
                weights, shifted, scale, units, moment_units, ENTROPY, 0
            )
        else:
            z = masked_tile(z, start, tau, mask_row_ptr, live_width, SUPPORT, BLOCK)
            shifted = z - shift
            units, moment_units = fixed_point_add(
                row_exp(shifted, PORTABLE), shifted, scale, units, moment_units, ENTROPY, 0
            )
    tl.store(sums_ptr + row * SUM_FIELDS, units)
    if ENTROPY:
        tl.store(sums_ptr + row * SUM_FIELDS + 1, moment_units)
    if SEPARATE:
        tl.store(sums_ptr + row * SUM_FIELDS + (SUM_FIELDS - 1), full_units)


@triton.jit
def fixed_point_fold(
    shifted, scale, units, moment_units, ENTROPY: tl.constexpr, AXIS: tl.constexpr
):
    """``units`` (and ``moment_units``) plus a tile's fixed-point terms summed along ``AXIS``.

    ``shifted`` holds ``d = z - M`` (``<= 0`` or ``-inf``), ``scale`` is ``2^K``. Each
    term depends on its own ``d`` only: ``floor(exp(d) 2^K)``, and with entropy
    ``exp(d) d 2^K`` truncated toward zero.
    """
    return fixed_point_add(tl.exp(shifted), shifted, scale, units, moment_units, ENTROPY, AXIS)


@triton.jit
def fixed_point_add(
    weights, shifted, scale, units, moment_units, ENTROPY: tl.constexpr, AXIS: tl.constexpr
):
    """:func:`fixed_point_fold` given ``weights = exp(shifted)``."""
    # scale = 2^K: the product is exact, and the conversion truncates, i.e. floors.
    units += tl.sum((weights * scale).to(tl.int64), axis=AXIS)
    if ENTROPY:
        # exp(d) d lies in [-1/e, 0]: truncation toward zero, exact sums again.
        moment_units += tl.sum((entropy_term(weights, shifted) * scale).to(tl.int64), axis=AXIS)
    return units, moment_units


@triton.jit
def exact_merge_kernel(
    stage_ptr,
    sums_ptr,
    boundaries_ptr,
    num_ranks,
    num_rows,
    targets_ptr,
    active_ptr,
    selected_ptr,
    lse_ptr,
    lse32_ptr,
    entropy_ptr,
    entropy32_ptr,
    inv_scale,
    full_lse_ptr,
    STORE_LSE: tl.constexpr,
    ENTROPY: tl.constexpr,
    STORE_ENTROPY: tl.constexpr,
    SUM_FIELDS: tl.constexpr,
    SEPARATE: tl.constexpr,
    STAGE: tl.constexpr,
    PORTABLE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = rows < num_rows
    active = tl.load(active_ptr + rows, mask=in_range, other=0) != 0
    target = tl.load(targets_ptr + rows, mask=in_range & active, other=-1).to(tl.int64)
    maximum, has_nan = gathered_max(stage_ptr, rows, in_range, num_ranks, num_rows, STAGE)
    units = tl.zeros([BLOCK], dtype=tl.int64)
    moment_units = tl.zeros([BLOCK], dtype=tl.int64)
    full_units = tl.zeros([BLOCK], dtype=tl.int64)
    for rank in range(num_ranks):
        base = sums_ptr + (rank * num_rows + rows) * SUM_FIELDS
        units += tl.load(base, mask=in_range, other=0)
        if ENTROPY:
            moment_units += tl.load(base + 1, mask=in_range, other=0)
        if SEPARATE:
            full_units += tl.load(base + (SUM_FIELDS - 1), mask=in_range, other=0)
    # inv_scale = 2^-K: exact; the int64 -> fp64 conversion is the only rounding.
    total = units.to(tl.float64) * inv_scale
    if ENTROPY:
        store_entropy(
            rows,
            in_range,
            active,
            maximum,
            has_nan,
            total,
            moment_units.to(tl.float64) * inv_scale,
            entropy_ptr,
            entropy32_ptr,
            STORE_ENTROPY,
            PORTABLE,
        )
    target_logit = owner_target_logit(
        stage_ptr, boundaries_ptr, rows, in_range, target, num_ranks, num_rows, STAGE, 1
    )
    store_results(
        rows,
        in_range,
        active,
        maximum,
        has_nan,
        total,
        target_logit,
        selected_ptr,
        lse_ptr,
        lse32_ptr,
        STORE_LSE,
        PORTABLE,
    )
    if SEPARATE:
        # The full vocabulary's maximum and sum follow the support's: the op's lse.
        full_max, full_nan = gathered_max(stage_ptr + 2, rows, in_range, num_ranks, num_rows, STAGE)
        full_total = full_units.to(tl.float64) * inv_scale
        store_lse(rows, in_range, full_max, full_nan, full_total, full_lse_ptr, PORTABLE)
