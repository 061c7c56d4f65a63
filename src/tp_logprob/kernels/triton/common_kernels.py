"""``@triton.jit`` helpers shared by the kernel families (inlined where called; no kernels here).

Gathered partials are fp32 ``[R, N, FIELDS]`` tensors with the row maximum in
field 0 (NaN when the shard saw a NaN) and the owner's target logit in field
``TARGET_FIELD`` (0.0 on other ranks). The kernels never compute ``inf - inf``,
``log(0)``, ``0 * -inf`` or a NaN-to-integer cast, not even in lanes a ``tl.where`` discards:
the GPU would not mind, but the interpreter warns, and the tests run with
warnings as errors. (fp32 overflow to +-inf, as in ``x - M`` for ``|x|`` near the
fp32 maximum, is IEEE behaviour the kernels rely on; see ``launch.py``.)

Temperature: every kernel that reads logits forms ``z = x / T`` with
``tl.math.div_rn`` (``div.rn.f32``, the IEEE division the contract names), not
``x / T``, which Triton lowers to the approximate ``div.full.f32`` on NVIDIA.
"""

# triton ships no type hints, and Triton types kernel parameters itself:
# mypy: disable-error-code="untyped-decorator, no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl

from tp_logprob.kernels.triton.portable_math import row_log

__all__ = [
    "entropy_term",
    "gathered_max",
    "merged_lse",
    "owned_target_logit",
    "owner_target_logit",
    "rank_total",
    "round_for",
    "scaled",
    "store_entropy",
    "store_lse",
    "store_results",
    "stored",
    "widen",
]


@triton.jit
def widen(x):
    """``x`` as fp32, exactly: bf16 by moving its 16 bits up, as the GPU's conversion does.

    The interpreter's own bf16 -> fp32 cast gets subnormals wrong (6.4e-40 came out
    as 8.8e-39), which a tiny temperature then magnifies into a wrong logprob.
    """
    if x.dtype == tl.bfloat16:
        bits = x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


@triton.jit
def scaled(x, temperature, SCALE: tl.constexpr):
    """``z = x / T`` by IEEE division (``div.rn.f32``) when ``SCALE``, else ``x`` unchanged."""
    if SCALE:
        return tl.math.div_rn(x, temperature)
    else:
        return x


@triton.jit
def row_temperature(temperature_ptr, rows, row_mask, SCALE: tl.constexpr):
    """The divisors ``fp32(T)`` of ``rows`` (a row or a block; 1 for a greedy row), read
    only when ``SCALE``: every row of an engine batch may bring its own temperature."""
    if SCALE:
        return tl.load(temperature_ptr + rows, mask=row_mask, other=1.0)
    else:
        return 1.0


@triton.jit
def entropy_term(weight, shifted):
    """``exp(d) * d`` given ``weight = exp(d)``: exactly 0 where ``d = -inf``, never NaN."""
    return weight * tl.where(shifted > float("-inf"), shifted, 0.0)


@triton.jit
def owned_target_logit(
    row_ptr, targets_ptr, active_ptr, row, col_start, width, temperature, SCALE: tl.constexpr
):
    """This rank's ``z`` at an active row's target column when it owns the column, else 0.0.

    An inactive row's target is never loaded.
    """
    active = tl.load(active_ptr + row) != 0
    target = tl.load(targets_ptr + row, mask=active, other=-1).to(tl.int64)
    local = target - col_start
    owned = active & (local >= 0) & (local < width)
    logit = widen(tl.load(row_ptr + local, mask=owned, other=0.0))
    return scaled(logit, temperature, SCALE)


@triton.jit
def gathered_max(ptr, rows, in_range, num_ranks, num_rows, FIELDS: tl.constexpr):
    """``(M, has_nan)``: the max of field 0 over ranks with NaNs set aside, and whether one was NaN.

    ``rows`` may be a scalar row or a block of rows; the maximum is exact, so the
    rank order does not matter for it.
    """
    first = tl.load(ptr + rows * FIELDS, mask=in_range, other=float("-inf"))
    has_nan = first != first
    maximum = tl.where(has_nan, float("-inf"), first)
    for rank in range(1, num_ranks):
        value = tl.load(ptr + (rank * num_rows + rows) * FIELDS, mask=in_range, other=float("-inf"))
        is_nan = value != value
        has_nan = has_nan | is_nan
        maximum = tl.maximum(maximum, tl.where(is_nan, float("-inf"), value))
    return maximum, has_nan


@triton.jit
def owner_target_logit(
    ptr,
    boundaries_ptr,
    rows,
    in_range,
    target,
    num_ranks,
    num_rows,
    FIELDS: tl.constexpr,
    TARGET_FIELD: tl.constexpr,
):
    """The gathered target logit of the rank whose shard holds ``target`` (shards ascend)."""
    logit = tl.load(ptr + rows * FIELDS + TARGET_FIELD, mask=in_range, other=0.0)
    for rank in range(1, num_ranks):
        start = tl.load(boundaries_ptr + rank)
        value = tl.load(
            ptr + (rank * num_rows + rows) * FIELDS + TARGET_FIELD, mask=in_range, other=0.0
        )
        logit = tl.where(target >= start, value, logit)
    return logit


@triton.jit
def rank_total(ptr, rows, in_range, num_ranks, num_rows, maximum, FIELDS: tl.constexpr):
    """``S = sum_r s_r exp(m_r - M)`` in fp64 over gathered ``(m_r, s_r)`` at fields 0 and 1
    (``M`` the NaN-free ``gathered_max``), in rank order, skipping identity partials; the
    same steps as ``online_merge_kernel``'s own fold. 0 where ``M`` is not finite."""
    finite = (maximum > float("-inf")) & (maximum < float("inf"))
    shift = tl.where(finite, maximum, 0.0).to(tl.float64)
    total = tl.zeros(rows.shape, dtype=tl.float64)
    for rank in range(num_ranks):
        base = ptr + (rank * num_rows + rows) * FIELDS
        rank_max = tl.load(base, mask=in_range, other=float("-inf"))
        rank_sum = tl.load(base + 1, mask=in_range, other=0.0).to(tl.float64)
        live = finite & (rank_max > float("-inf"))
        gap = tl.where(live, rank_max.to(tl.float64) - shift, float("-inf"))
        total += tl.where(live, rank_sum * tl.exp(gap), 0.0)
    return total


@triton.jit
def merged_lse(maximum, has_nan, total, PORTABLE: tl.constexpr):
    """``(lse, finite, M, log S)``: the fp32 ``LSE = M + log S`` (fp64, rounded once) with the
    special values of ``docs/semantics.md`` (NaN anywhere live gives NaN, ``M = +inf``
    gives ``+inf``, no finite live value ``-inf``), whether ``M`` is finite, and the fp64
    ``M`` (0 where not finite) and ``log S`` the selected logprob is formed from.

    ``PORTABLE``: ``log`` is ``portable_log``, and ``M = -0`` counts as ``+0`` (the sign
    of a zero maximum is the platform's ``max``'s choice, and ``t - M`` would show it)."""
    finite = (maximum > float("-inf")) & (maximum < float("inf")) & ~has_nan
    shift = tl.where(finite, maximum, 0.0).to(tl.float64)
    if PORTABLE:
        shift = shift + 0.0
    log_total = row_log(tl.where(finite, total, 1.0), PORTABLE)
    lse64 = shift + log_total
    special = tl.where(has_nan, float("nan"), maximum)
    lse = tl.where(finite, lse64.to(tl.float32), special)
    return lse, finite, shift, log_total


@triton.jit
def store_lse(rows, in_range, maximum, has_nan, total, lse_ptr, PORTABLE: tl.constexpr):
    """Write :func:`merged_lse`'s LSE in ``lse_ptr``'s element type (a support's full ``lse``)."""
    lse = merged_lse(maximum, has_nan, total, PORTABLE)[0]
    tl.store(lse_ptr + rows, stored(lse_ptr, lse, PORTABLE), mask=in_range)


@triton.jit
def store_results(
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
    STORE_LSE: tl.constexpr,
    PORTABLE: tl.constexpr,
):
    """Write ``selected`` and ``lse`` from ``M``, ``S = sum exp(x - M)`` (fp64) and the target.

    ``LSE = M + log S`` and ``selected = (target - M) - log S`` are formed in fp64 and
    rounded once to fp32 (then to the output dtype at the store). Special values follow
    ``docs/semantics.md``, "Special values": NaN anywhere live gives NaN; ``M = +inf``
    gives ``lse = +inf``; an all ``-inf`` row gives ``lse = -inf``; then ``selected`` is
    NaN; inactive rows get exactly 0.0.
    """
    lse, finite, shift, log_total = merged_lse(maximum, has_nan, total, PORTABLE)
    # (t - M) - log S rather than t - LSE: exact t - M keeps a near-0 logprob accurate.
    relative = (target_logit.to(tl.float64) - shift) - log_total
    selected = tl.where(finite, relative.to(tl.float32), float("nan"))
    selected = tl.where(active, selected, 0.0)
    tl.store(lse32_ptr + rows, stored(lse32_ptr, lse, PORTABLE), mask=in_range)
    if STORE_LSE:
        tl.store(lse_ptr + rows, stored(lse_ptr, lse, PORTABLE), mask=in_range)
    tl.store(selected_ptr + rows, stored(selected_ptr, selected, PORTABLE), mask=in_range)


@triton.jit
def round_for(ptr, value):
    """fp32 ``value`` rounded to ``ptr``'s element type, to nearest even.

    bf16 is rounded with integer ops (the same bits as the GPU's ``cvt.rn.bf16.f32``)
    because the interpreter's own fp32 -> bf16 cast truncates.
    """
    if ptr.dtype.element_ty == tl.bfloat16:
        raw = value.to(tl.uint32, bitcast=True)
        nearest_even = (raw + 0x7FFF + ((raw >> 16) & 1)) >> 16
        half = tl.where(value != value, 0x7FC0, nearest_even).to(tl.uint16)
        return half.to(tl.bfloat16, bitcast=True)
    else:
        return value.to(ptr.dtype.element_ty)


@triton.jit
def stored(ptr, value, PORTABLE: tl.constexpr):
    """:func:`round_for`, and with ``PORTABLE`` every NaN as the one quiet NaN of ``ptr``'s
    type (``0x7FC00000``, ``0x7FC0``, ``0x7E00``): a NaN's sign and payload are the
    platform's choice (NVIDIA's arithmetic and conversions give ``0x7FFFFFFF`` and
    ``0x7FFF``, x86 keeps the operand's or makes ``0xFFC00000``)."""
    out = round_for(ptr, value)
    if PORTABLE:
        if ptr.dtype.element_ty == tl.bfloat16:
            nan = tl.full(value.shape, 0x7FC0, tl.int16).to(tl.bfloat16, bitcast=True)
        elif ptr.dtype.element_ty == tl.float16:
            nan = tl.full(value.shape, 0x7E00, tl.int16).to(tl.float16, bitcast=True)
        else:
            nan = tl.full(value.shape, 0x7FC00000, tl.int32).to(tl.float32, bitcast=True)
        out = tl.where(value != value, nan, out)
    return out


@triton.jit
def store_entropy(
    rows,
    in_range,
    active,
    maximum,
    has_nan,
    total,
    moment,
    entropy_ptr,
    entropy32_ptr,
    STORE_ENTROPY: tl.constexpr,
    PORTABLE: tl.constexpr,
):
    """Write ``entropy = log S - Q / S`` (fp64, rounded once) from ``S`` and ``Q``, both
    relative to the global max ``M``.

    NaN when ``M`` is not finite (a NaN, a ``+inf`` or no finite live logit);
    exactly 0.0 on inactive rows.
    """
    finite = (maximum > float("-inf")) & (maximum < float("inf")) & ~has_nan
    safe_total = tl.where(finite, total, 1.0)
    entropy64 = row_log(safe_total, PORTABLE) - moment / safe_total
    entropy = tl.where(finite, entropy64.to(tl.float32), float("nan"))
    entropy = tl.where(active, entropy, 0.0)
    tl.store(entropy32_ptr + rows, stored(entropy32_ptr, entropy, PORTABLE), mask=in_range)
    if STORE_ENTROPY:
        tl.store(entropy_ptr + rows, stored(entropy_ptr, entropy, PORTABLE), mask=in_range)
