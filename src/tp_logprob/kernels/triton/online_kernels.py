"""Online-softmax partials over a rank's columns, and their ordered merge (``triton_online``).

``online_partial_kernel``: one program per row walks the row's live columns in
fixed ``BLOCK``-wide tiles. Per tile it forms ``z = x / T`` (IEEE division, only
when ``T != 1``), takes the tile max, raises the running max ``m`` and rescales
per-lane fp32 sums by ``exp(m_old - m_new)``, so each column is read once and
converted to fp32 in registers (no fp32 copy of the logits). With entropy a
second per-lane accumulator carries ``q = sum exp(z - m)(z - m)``, rescaled as
``q <- exp(m_old - m_new) (q + (m_old - m_new) s)``: same single pass, no second
read of the logits. Lanes are summed once at the end. NaNs are set aside and reported by
returning ``m = NaN``; while ``m`` is ``-inf`` the sum stays 0, and once ``m = +inf``
it stops changing (the merge reports ``lse = +inf`` from ``m`` alone), so no lane
ever computes ``inf - inf``; a shard without a live column yields the identity
``(-inf, 0)``.
Padding columns are never loaded. Traffic per row: ``live_width * itemsize``
bytes read (plus one element for an owned target), 12 bytes written (16 with
entropy).

``online_merge_kernel``: one program per block of rows folds the gathered
``[R, N, 3]`` partials (``[R, N, 4]`` with entropy) in rank order: ``M = max m_r``,
``S = sum_r s_r * exp(m_r - M)`` in fp64 over shards with a live column, then
``LSE = M + log S``; with entropy ``Q = sum_r exp(m_r - M) (q_r + (m_r - M) s_r)``
and ``entropy = log S - Q / S``. Traffic per row: ``12 R`` bytes read (``16 R``
with entropy), plus the target and the active flag; 4 bytes (fp32 LSE; 8 with
the fp32 entropy) plus the outputs written.

Both are batch invariant: one program per row (or an elementwise block of rows),
and ``BLOCK`` comes from the platform and dtype only.
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
    rank_total,
    row_temperature,
    scaled,
    store_entropy,
    store_lse,
    store_results,
    widen,
)
from tp_logprob.kernels.triton.support_kernels import masked_tile, row_threshold, support_target

__all__ = ["online_merge_kernel", "online_partial_kernel"]

# Partials are (m_r, s_r, t_r[, q_r]) per row, the layout of merge.pack_partial:
# FIELDS is 3, or 4 with ENTROPY.


@triton.jit
def online_partial_kernel(
    logits_ptr,
    row_stride,
    width,
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
    FIELDS: tl.constexpr,
    SUPPORT: tl.constexpr,
    SEPARATE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * row_stride
    temperature = row_temperature(temperature_ptr, row, row >= 0, SCALE)
    tau = row_threshold(threshold_ptr, row, row >= 0, SUPPORT)
    mask_row_ptr = mask_ptr + row * mask_stride
    offsets = tl.arange(0, BLOCK)
    running_max = float("-inf")
    lane_sums = tl.zeros([BLOCK], dtype=tl.float32)
    lane_moments = tl.zeros([BLOCK], dtype=tl.float32)
    lane_nans = tl.zeros([BLOCK], dtype=tl.int1)
    full_max = float("-inf")
    full_sums = tl.zeros([BLOCK], dtype=tl.float32)
    full_nans = tl.zeros([BLOCK], dtype=tl.int32)  # int32: int1 lanes fill AMD scalar registers
    for start in range(0, live_width, BLOCK):
        cols = start + offsets
        x = widen(tl.load(row_ptr + cols, mask=cols < live_width, other=float("-inf")))
        x = scaled(x, temperature, SCALE)
        if SEPARATE:
            # The full vocabulary's (m, s), for lse: the raw kernel's steps, so its bits.
            full_nan = x != x
            full_nans = full_nans | full_nan.to(tl.int32)
            clean = tl.where(full_nan, float("-inf"), x)
            new_full = tl.maximum(full_max, tl.max(clean, axis=0))
            full_ok = (new_full > float("-inf")) & (new_full < float("inf"))
            full_shift = tl.where(full_ok, new_full, 0.0)
            full_shifted = tl.where(full_ok, clean - full_shift, float("-inf"))
            full_weights = tl.exp(full_shifted)
            full_rescale = tl.exp(tl.where(full_ok, full_max - full_shift, 0.0))
            full_sums = full_sums * full_rescale + full_weights
            full_max = new_full
        if SUPPORT != 0:  # outside S a column counts as padding does (its NaN too)
            x = masked_tile(x, start, tau, mask_row_ptr, live_width, SUPPORT, BLOCK)
        is_nan = x != x
        lane_nans = lane_nans | is_nan
        x = tl.where(is_nan, float("-inf"), x)
        new_max = tl.maximum(running_max, tl.max(x, axis=0))
        # A uniform branch: rows whose max is +-inf skip the sums (see the docstring).
        if (new_max > float("-inf")) & (new_max < float("inf")):
            rescale = tl.exp(running_max - new_max)
            if SEPARATE:
                # S's maximum is the full one's whenever S holds the largest column seen
                # so far (always, for a threshold's upper set): then S's terms are the full
                # terms on S, the same bits as their own exp, at no second exp.
                if new_max == full_max:
                    in_support = x > float("-inf")
                    shifted = tl.where(in_support, full_shifted, float("-inf"))
                    weights = tl.where(in_support, full_weights, 0.0)
                else:
                    shifted = x - new_max
                    weights = tl.exp(shifted)
            else:
                shifted = x - new_max
                weights = tl.exp(shifted)
            if ENTROPY:
                # Where the old sums are dropped (m_old = -inf, or exp(m_old - m_new)
                # underflowed to 0) a gap of 0 keeps gap * s from overflowing into 0 * -inf.
                gap = tl.where(rescale > 0.0, running_max - new_max, 0.0)
                lane_moments = rescale * (lane_moments + gap * lane_sums) + entropy_term(
                    weights, shifted
                )
            lane_sums = lane_sums * rescale + weights
        running_max = new_max
    has_nan = tl.max(lane_nans.to(tl.int32), axis=0) > 0
    base = partial_ptr + row * FIELDS
    tl.store(base, tl.where(has_nan, float("nan"), running_max))
    tl.store(base + 1, tl.sum(lane_sums, axis=0))
    target = owned_target_logit(
        row_ptr, targets_ptr, active_ptr, row, col_start, width, temperature, SCALE
    )
    if SUPPORT != 0:
        support = support_target(
            target, targets_ptr, active_ptr, row, col_start, live_width, tau, mask_row_ptr, SUPPORT
        )
        tl.store(base + 2, support)
    else:
        tl.store(base + 2, target)
    if ENTROPY:
        tl.store(base + 3, tl.sum(lane_moments, axis=0))
    if SEPARATE:
        full = base + (FIELDS - 3)
        full_has_nan = tl.max(full_nans, axis=0) > 0
        tl.store(full, tl.where(full_has_nan, float("nan"), full_max))
        tl.store(full + 1, tl.sum(full_sums, axis=0))
        tl.store(full + 2, target)


@triton.jit
def online_merge_kernel(
    partials_ptr,
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
    full_lse_ptr,
    STORE_LSE: tl.constexpr,
    ENTROPY: tl.constexpr,
    STORE_ENTROPY: tl.constexpr,
    SEPARATE: tl.constexpr,
    FIELDS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = rows < num_rows
    active = tl.load(active_ptr + rows, mask=in_range, other=0) != 0
    target = tl.load(targets_ptr + rows, mask=in_range & active, other=-1).to(tl.int64)
    maximum, has_nan = gathered_max(partials_ptr, rows, in_range, num_ranks, num_rows, FIELDS)
    finite = (maximum > float("-inf")) & (maximum < float("inf"))
    shift = tl.where(finite, maximum, 0.0).to(tl.float64)
    total = tl.zeros([BLOCK], dtype=tl.float64)
    moment = tl.zeros([BLOCK], dtype=tl.float64)
    for rank in range(num_ranks):
        base = partials_ptr + (rank * num_rows + rows) * FIELDS
        rank_max = tl.load(base, mask=in_range, other=float("-inf"))
        rank_sum = tl.load(base + 1, mask=in_range, other=0.0).to(tl.float64)
        live = finite & (rank_max > float("-inf"))
        gap = tl.where(live, rank_max.to(tl.float64) - shift, float("-inf"))
        scale = tl.exp(gap)
        total += tl.where(live, rank_sum * scale, 0.0)
        if ENTROPY:
            rank_moment = tl.load(base + 3, mask=in_range, other=0.0).to(tl.float64)
            safe_gap = tl.where(live, gap, 0.0)
            moment += tl.where(live, scale * (rank_moment + safe_gap * rank_sum), 0.0)
    target_logit = owner_target_logit(
        partials_ptr, boundaries_ptr, rows, in_range, target, num_ranks, num_rows, FIELDS, 2
    )
    if ENTROPY:
        store_entropy(
            rows,
            in_range,
            active,
            maximum,
            has_nan,
            total,
            moment,
            entropy_ptr,
            entropy32_ptr,
            STORE_ENTROPY,
            False,
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
        False,
    )
    if SEPARATE:
        # The full vocabulary's partial follows the support's: its LSE is the op's lse.
        full_ptr = partials_ptr + (FIELDS - 3)
        full_max, full_nan = gathered_max(full_ptr, rows, in_range, num_ranks, num_rows, FIELDS)
        full_total = rank_total(full_ptr, rows, in_range, num_ranks, num_rows, full_max, FIELDS)
        store_lse(rows, in_range, full_max, full_nan, full_total, full_lse_ptr, False)
