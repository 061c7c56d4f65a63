"""The fast path's first phase: a row's sum of exponentials from binned float64 work.

For a row of values ``x`` (finite or ``-inf``) with finite maximum ``M``, on the
grid ``2^-Q``: ``t = x 2^Q`` (exact), ``a = rint(t)``, ``beta = t - a`` (exact,
``|beta| <= 1/2``), ``A = floor(M 2^Q)`` and ``M' = A 2^-Q <= M``. Then, exactly,

    exp(x - M') = G_j (1 + e),   j = A + 1 - a >= 0,
    G_j = exp((1 - j) 2^-Q),     e = exp(beta 2^-Q) - 1,

so ``W = sum exp(x - M') = sum_j G_j (n_j + E_j)`` with ``n_j`` the number of
values in bin ``j`` and ``E_j`` the sum of their ``e``: two ``bincount`` passes
and a degree-5 polynomial per value, no per-value double-double. ``W >= 1`` and
``log S = log W - (M - M')``, so ``LSE = M' + log W`` and
``x_t - LSE = (x_t - M') - log W``.

* ``X = sum_j n_j G_j`` is exact up to the table: ``G_j`` is stored as four
  29-bit integer limbs, and the row sums of ``n_j`` times each limb add integer
  products below ``2^53`` (at most ``2^23`` head values), exact in any order.
* ``Y = sum_j fl(G_j) E_j`` (``|Y| <= 2^-9 (1 + 2^-8) X``) is summed by
  :func:`pairwise_sum` or, where even any order's bound is negligible, as one
  dot product; besides that sum, only the rounding of each ``e``, of each bin's
  ``bincount`` accumulation and of each product matter.
* a value more than ``SPAN`` below ``M'`` goes to the tail bin, bounded.

:func:`bin_error_terms` lists each error term; ``docs/tolerances.md`` ("The
oracle's fast path", F10) derives them. Rows the bound cannot certify go on to
the double-double path (``_fast_rows``), which gives the same bits.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any, cast

import mpmath
import numpy as np
from numpy.typing import NDArray

from tp_logprob.oracle._eft import U, gamma, two_sum
from tp_logprob.oracle._fast_rows import SLACK, Enclosure
from tp_logprob.oracle._inputs import BoolArray, FloatArray, IntArray

Q = 8
SCALE_Q = 2.0**Q
SPAN = 64  # values below M' - SPAN (about) are bounded, not binned
TAIL_BIN = SPAN << Q
LIMB_BITS = 29
_LIMBS = 4
_FIX = 200  # fractional bits of the fixed-point table
# Rows with |M| at or above this are left to the double-double path (A + 1 stays exact).
M_LIMIT = 2.0**40
# At most this many head values per row: each limb product sum stays below 2^53.
HEAD_LIMIT = 2.0**23
_CHUNK = 1 << 15  # values per pass (reused temporaries, 768 KiB)
_GROUP_BINS = 1 << 13
_KEEP = 1 << 20  # largest buffer kept per thread (8 MiB)
_BETA_MAX = 0.5
_FSUM_WIDTH = 64  # pairwise_sum's last columns, summed by math.fsum
_COEFFS = tuple(Fraction(1, math.factorial(n) * 2 ** (Q * n)) for n in range(1, 6))


@dataclass(frozen=True)
class BinTables:
    """``G_j`` for ``j < TAIL_BIN`` as limbs (``[TAIL_BIN + 1, 4]``) and rounded (``gh``);
    the last row (the tail bin) is zero."""

    limbs: FloatArray
    gh: FloatArray
    coeffs: tuple[float, ...]
    limb_columns: FloatArray  # limbs.T, contiguous
    by_bin: FloatArray  # [TAIL_BIN + 1, 5]: each bin's limbs, then gh (one gather for both)


@lru_cache(maxsize=1)
def bin_tables() -> BinTables:
    """The table of ``exp((1 - j) 2^-Q)``, built once in integer fixed point (a few ms).

    ``F_0 = floor(exp(2^-Q) 2^200)``, ``F_(j+1) = floor(F_j s / 2^200)`` with
    ``s = floor(exp(-2^-Q) 2^200)``: each step adds less than ``3 2^-200`` to the
    error, so ``|F_j 2^-200 - G_j| < 2^-183`` for ``j < 2^14``.
    """
    ctx = mpmath.MPContext()
    ctx.prec = 260
    one = 1 << _FIX
    step = int(ctx.floor(ctx.exp(-(ctx.mpf(2) ** -Q)) * one))
    g = int(ctx.floor(ctx.exp(ctx.mpf(2) ** -Q) * one))
    mask = (1 << LIMB_BITS) - 1
    fixed = []
    for _ in range(TAIL_BIN):
        fixed.append(g)
        g = (g * step) >> _FIX
    # Python's int / int is correctly rounded.
    gh = np.array([f / one for f in fixed] + [0.0])
    top = [f >> (_FIX - LIMB_BITS * _LIMBS) for f in fixed]  # floor(G_j 2^116), to 2^-183
    columns = [[float(v >> (LIMB_BITS * (_LIMBS - 1))) for v in top]]  # G_j < 2: 30 bits
    for k in range(1, _LIMBS):
        shift = LIMB_BITS * (_LIMBS - 1 - k)
        columns.append([float((v >> shift) & mask) for v in top])
    limbs = np.zeros((TAIL_BIN + 1, _LIMBS))
    limbs[:TAIL_BIN] = np.array(columns).T
    coeffs = tuple(float(c) for c in _COEFFS)
    by_bin = np.concatenate([limbs, gh[:, None]], axis=1)
    return BinTables(limbs, gh, coeffs, np.ascontiguousarray(limbs.T), by_bin)


def _horner_error() -> tuple[float, float]:
    """``(ERR_E, E_MAX)``: bounds on ``|e_hat - e|`` and ``|e_hat|`` over ``|beta| <= 1/2``.

    Horner ``h5 = c5``, ``h_n = fl(c_n + fl(beta h_(n+1)))``, ``e = fl(beta h1)``:
    each step's absolute error is the coefficient's representation error plus
    ``|beta|`` times the inner error plus one rounding of each operation, at the
    largest magnitudes; the Taylor remainder is ``b^6/720 / (1 - b/7)`` at
    ``b = 2^-(Q+1)``; nine possible underflows add ``2^-1070``.
    """
    coeffs = bin_tables().coeffs
    b = _BETA_MAX
    err = float(abs(Fraction(coeffs[4]) - _COEFFS[4]))
    mag = coeffs[4] * (1 + U)
    for n in (3, 2, 1, 0):
        prod_mag = b * mag * (1 + U)
        err = float(abs(Fraction(coeffs[n]) - _COEFFS[n])) + b * err + U * b * mag
        mag = (coeffs[n] + prod_mag) * (1 + U)
        err += U * mag
    err = b * err + U * b * mag
    e_max = b * mag * (1 + U) + err
    x = 2.0 ** -(Q + 1)
    remainder = x**6 / 720 / (1 - x / 7)
    return (err + remainder + 2.0**-1070) * (1 + 2.0**-20), e_max * (1 + 2.0**-20)


ERR_E, E_MAX = _horner_error()
# |G_j - limbs_j| < 2^-116 (truncation) + 2^-183 (fixed point).
LIMB_ERR = 2.0**-115
# exp(x - M') for a value in the tail bin: at most exp((1.5 - TAIL_BIN) 2^-Q), rounded up.
# (mpmath at 60 bits, then widened: no bound depends on the platform's libm.)
TAIL_TERM = float(mpmath.exp(mpmath.mpf(1.5 - TAIL_BIN) / 2**Q, prec=60)) * (1 + 2.0**-40)


def bin_error_terms(
    x_bound: FloatArray,
    head: FloatArray,
    d2: FloatArray,
    p_abs: FloatArray,
    bins: int,
    weighted: bool = False,
    y_rounds: int | None = None,
) -> dict[str, FloatArray | float]:
    """Each source of error in ``W`` for one row (``docs/tolerances.md``, F10).

    ``x_bound >= X``, ``head`` the number of head values (counts included),
    ``d2`` the computed ``sum_j fl(G_j) n_j^2``, ``p_abs`` the computed
    ``sum_j fl(G_j) |E_j|`` (or ``sum_j |fl(fl(G_j) E_j)|``), ``bins`` the number of
    bins, ``weighted`` whether values carry counts (each ``count e`` is then one
    more rounding) and ``y_rounds`` how many roundings each term of ``Y``'s sum
    can see (``ceil(log2 bins)`` for :func:`pairwise_sum`, the default; ``bins``
    for a dot product in any order).
    """
    g, g_levels = _bin_gammas(bins)
    g_sum = g_levels if y_rounds is None else gamma(y_rounds)
    return {
        "limbs of G_j": head * LIMB_ERR,
        "e per value (Horner, remainder)": ERR_E * x_bound,
        "count times e (weighted rows)": U * E_MAX * x_bound * weighted,
        "bincount accumulation": U * (1 + U) ** 2 * E_MAX * d2 * (1 + 3 * g),
        "G_j E_j products": 2.001 * U * p_abs * (1 + g),
        "sum of the products": g_sum * p_abs * (1 + g),
        "double-double of X and W": 2.0**-100 * x_bound,
        "underflow in products": bins * 2.0**-1074,
    }


@lru_cache(maxsize=64)
def _bin_gammas(bins: int) -> tuple[float, float]:
    """``gamma(bins + 2)``, which widens a computed sum of ``bins`` nonnegative terms (or
    of their products by ``gh``) to a bound on the exact one, and
    ``gamma(ceil(log2 bins))`` (at least 1 level)."""
    return gamma(bins + 2), gamma(math.ceil(math.log2(max(bins, 2))))


@dataclass
class BinSums:
    """Per row: ``M'`` and the enclosure of ``W``; ``ok`` marks rows this phase handled."""

    m_grid: FloatArray
    w: Enclosure
    ok: BoolArray


_LOCAL = threading.local()


def _buffer(name: str, size: int, dtype: type = np.float64) -> NDArray[Any]:
    """A per-thread buffer of at least ``size`` elements, reused from call to call: a
    fresh mapping for every block costs more in page faults than the arithmetic on it."""
    if size > _KEEP:
        return np.empty(size, dtype=dtype)  # a very wide row: not kept between calls
    buf: NDArray[Any] | None = getattr(_LOCAL, name, None)
    if buf is None or buf.size < size:
        buf = np.empty(max(size, 1 << 16), dtype=dtype)
        setattr(_LOCAL, name, buf)
    return buf[:size]


def _keys_and_e(
    values: FloatArray, a1: FloatArray, stride: int, capped: bool
) -> tuple[IntArray, FloatArray]:
    """Each value's key ``r stride + j`` and its ``e`` (``[R, K]`` each, reused buffers).

    ``capped`` sends ``j > TAIL_BIN`` (``-inf`` included) to ``TAIL_BIN``.
    """
    rows, width = values.shape
    keys = _buffer("keys", rows * width, np.intp).reshape(rows, width)
    e_all = _buffer("e", rows * width).reshape(rows, width)
    step = max(1, _CHUNK // max(rows, 1))
    offsets = (np.arange(rows) * float(stride))[:, None]
    top = a1[:, None] if capped else a1[:, None] + offsets
    scratch = _buffer("chunk", 3 * rows * min(step, width))
    for start in range(0, width, step):
        part = slice(start, start + step)
        x = values[:, part]
        size = x.size
        t = np.multiply(x, SCALE_Q, out=scratch[:size].reshape(x.shape))
        a = np.rint(t, out=scratch[size : 2 * size].reshape(x.shape))
        beta = np.subtract(t, a, out=t)
        if capped:
            j = np.subtract(top, a, out=a)
            np.minimum(j, float(TAIL_BIN), out=j)
            np.add(j, offsets, out=keys[:, part], casting="unsafe")
        else:
            np.subtract(top, a, out=keys[:, part], casting="unsafe")
        _horner(beta, scratch[2 * size : 3 * size].reshape(x.shape), e_all[:, part])
    return keys, e_all


def _horner(beta: FloatArray, scratch: FloatArray, out: FloatArray) -> None:
    """``e = exp(beta 2^-Q) - 1`` into ``out``: the Horner scheme of :func:`_horner_error`."""
    c = bin_tables().coeffs
    e = np.multiply(beta, c[4], out=scratch)
    e += c[3]
    e *= beta
    e += c[2]
    e *= beta
    e += c[1]
    e *= beta
    e += c[0]
    np.multiply(e, beta, out=out)


@lru_cache(maxsize=1)
def bf16_grid() -> tuple[FloatArray, FloatArray, FloatArray]:
    """Every bfloat16 value ``x`` as float64, its ``a = rint(x 2^Q)`` and its ``e``, indexed
    by its 16-bit pattern: a deduplicated row looks its values' up (the same
    operations, done once)."""
    with np.errstate(invalid="ignore"):  # inf and NaN patterns: never a head value
        x = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32).astype(np.float64)
        t = x * SCALE_Q
        a = np.rint(t)
        e = np.empty_like(x)
        _horner(t - a, np.empty_like(x), e)
    return x, a, e


# bfloat16 patterns are sign and magnitude: ascending, the positive values rise, then
# (from -0.0 at the sign bit on) the negative ones fall, down to -inf and the NaNs.
_SIGN = 0x8000
NEGATIVE_INF = 0xFF80


def highest(patterns: IntArray) -> int:
    """The position of the largest value among distinct bfloat16 ``patterns`` (ascending,
    no negative NaN): the largest positive one, else the negative one nearest zero."""
    i = int(np.searchsorted(patterns, _SIGN))
    return i - 1 if i else 0


def _lowest(patterns: IntArray) -> int:
    """The position of the smallest value among distinct bfloat16 ``patterns`` (ascending,
    no NaN): the negative one farthest from zero, else the smallest positive one."""
    return patterns.size - 1 if patterns[-1] >= _SIGN else 0


@lru_cache(maxsize=1)
def bf16_a_index() -> IntArray:
    """:func:`bf16_grid`'s ``a`` as integers, clipped to ``+-2^50`` (``-inf`` is ``-2^50``;
    NaN and ``+inf`` patterns, never a value of an attempted row, are 0): ``a1 - a``
    is then ``j``, exact, or far past the tail bin."""
    a = bf16_grid()[1]
    with np.errstate(invalid="ignore"):
        return np.nan_to_num(np.clip(a, -(2.0**50), 2.0**50), nan=0.0).astype(np.intp)


def pairwise_sum(a: FloatArray) -> FloatArray:
    """Row sums of ``a`` (``[R, K]``, overwritten) by folding: each level adds the upper
    half of the columns onto the lower, and an odd middle column waits for the next;
    at most :data:`_FSUM_WIDTH` columns left, ``math.fsum`` rounds their exact sum.

    That is ``ceil(log2 K) - 6`` folding levels (none for ``K <= 64``), each value
    in at most one addition per level, then one rounding: the error is within
    ``gamma(ceil(log2 K)) sum |a|`` for ``K >= 2``, with room to spare.
    """
    width = a.shape[1]
    if a.shape[0] == 1:  # one row: plain 1-D slices, a little cheaper
        v = a[0]
        while width > _FSUM_WIDTH:
            half = (width + 1) // 2
            np.add(v[: width - half], v[half:width], out=v[: width - half])
            width = half
        return np.array([_fsum(v[:width].tolist())])
    while width > _FSUM_WIDTH:
        half = (width + 1) // 2
        np.add(a[:, : width - half], a[:, half:width], out=a[:, : width - half])
        width = half
    return np.array([_fsum(row) for row in a[:, :width].tolist()])


def _fsum(values: list[float]) -> float:
    """``math.fsum``, NaN where it refuses (``inf - inf``): never a certified row."""
    try:
        return math.fsum(values)
    except (ValueError, OverflowError):
        return math.nan


@dataclass
class _Totals:
    """One row's (or every row's) sums from its bins: ``X``'s four limb sums, ``Y``, the
    head and tail counts, ``d2`` and ``sum |p_j|`` (:func:`bin_error_terms`)."""

    limbs: list[Any]
    y_sum: Any
    head: Any
    tail: Any
    d2: Any
    p_abs: Any


def _enclosure(
    t: _Totals, bins: int, weighted: bool, y_rounds: int | None = None
) -> tuple[Any, Any, Any, Any]:
    """``(w_h, w_l, rad, ok)``: ``W = X + Y`` and its radius, on arrays of rows or, for
    one row, on plain floats (the same IEEE operations, without the microsecond an
    array call or a numpy scalar's costs)."""
    l0, l1, l2, l3 = t.limbs
    x_h, x_l = two_sum(l0 * 2.0**-LIMB_BITS, l1 * 2.0 ** (-2 * LIMB_BITS))
    x_l = x_l + (l2 * 2.0 ** (-3 * LIMB_BITS) + l3 * 2.0 ** (-4 * LIMB_BITS))
    w_h, w_e = two_sum(x_h, t.y_sum)
    w_l = w_e + x_l
    x_bound = x_h * (1 + 2.0**-40) + t.head * LIMB_ERR
    terms = bin_error_terms(x_bound, t.head, t.d2, t.p_abs, bins, weighted, y_rounds)
    rad = sum(terms.values(), 0.0 * x_bound)  # the rows' shape (a float for one row)
    rad += t.tail * TAIL_TERM + U * (abs(x_l) + abs(w_l))
    return w_h, w_l, rad * SLACK, t.head < HEAD_LIMIT


def _grid_stage(
    n: FloatArray, big_e: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray, BoolArray]:
    """``(w_h, w_l, rad, ok)`` per row from per-bin counts ``n`` and sums of ``e``
    (``[R, stride]``, column ``j`` is bin ``j``; ``big_e`` overwritten)."""
    rows, stride = n.shape
    tables = bin_tables()
    if stride > TAIL_BIN:
        tail = n[:, TAIL_BIN].copy()
        big_e[:, TAIL_BIN] = 0.0
    else:
        tail = np.zeros(rows)
    columns = tables.limb_columns[:, :stride]
    gh = tables.gh[:stride]
    head = n.sum(axis=1) - tail
    # Row-wise products and sums, not BLAS: a multithreaded matmul on a loaded
    # machine can cost more than the arithmetic. Integer-valued, so exact in any order.
    scratch = _buffer("scratch", rows * stride).reshape(rows, stride)
    limbs = [np.multiply(n, columns[k], out=scratch).sum(axis=1) for k in range(_LIMBS)]
    np.multiply(n, n, out=scratch)
    d2 = np.multiply(scratch, gh, out=scratch).sum(axis=1)  # >= sum gh n (n - 1), rounded
    p = np.multiply(big_e, gh, out=big_e)
    p_abs = np.abs(p, out=scratch).sum(axis=1)
    totals = _Totals(limbs, pairwise_sum(p), head, tail, d2, p_abs)
    if rows == 1:  # one row: plain floats from here, back to [1] arrays at the end
        y_sum, head_n, tail_n, d2_sum, p_abs_sum = (
            float(v[0]) for v in (totals.y_sum, head, tail, d2, p_abs)
        )
        one = _Totals([float(v[0]) for v in limbs], y_sum, head_n, tail_n, d2_sum, p_abs_sum)
        w_h, w_l, rad, ok = _enclosure(one, stride, False)
        return np.array([w_h]), np.array([w_l]), np.array([rad]), np.array([ok])
    return _enclosure(totals, stride, False)


# Y by one dot product (any order) where its bound, gamma(bins) sum_j gh_j |E_j|, is
# at most this (W >= 1, so relatively too); else by pairwise_sum.
_DOT_Y_MAX = 2.0**-64
_DOT_PRODUCTS = 8192  # per matrix product: below the size at which a BLAS may start threads


def _dot(a: FloatArray, b: FloatArray) -> Any:
    """``a @ b`` (``[K]`` by ``[K]`` or ``[K, L]``) in pieces of at most
    :data:`_DOT_PRODUCTS` products, the pieces' results added in order."""
    step = _DOT_PRODUCTS // (b.shape[1] if b.ndim == 2 else 1)
    total = a[:step] @ b[:step]
    for start in range(step, a.size, step):
        total = total + a[start : start + step] @ b[start : start + step]
    return total


@dataclass
class RowSums:
    """One row's ``M'`` and ``W``'s enclosure as plain floats; ``ok`` as in :class:`BinSums`."""

    m_grid: float
    w: Enclosure
    ok: bool


def value_row_sums(
    top: float,
    counts: FloatArray,
    values: FloatArray | None = None,
    patterns: IntArray | None = None,
) -> RowSums:
    """One row given as distinct values with ``counts`` (``[K]``), its maximum ``top``
    (``|top| < M_LIMIT``): each value is a bin of its own.

    The values are their bfloat16 ``patterns`` (``a`` and ``e`` looked up in
    :func:`bf16_grid`) or, without patterns, ``values`` (computed). A value's ``E``
    is the one product ``count e``, accumulated with nothing (``d2 = 0``; the
    product's rounding is a term of its own).
    """
    tables = bin_tables()
    a_top = float(math.floor(top * SCALE_Q))  # exact: |top| < 2^40
    a1 = a_top + 1.0
    if patterns is None:
        assert values is not None
        with np.errstate(invalid="ignore", over="ignore"):  # -inf: NaN e, tail bin only
            keys, e_all = _keys_and_e(values[None, :], np.array([a1]), 0, True)
        index, e = keys[0].copy(), e_all[0]
    else:  # -inf: j far past the tail bin, the table's e NaN (no operation makes a new NaN)
        index = int(a1) - bf16_a_index()[patterns]
        e = bf16_grid()[2][patterns]
    big_e = e * counts
    tail = 0.0
    # The lowest value has the largest j; with patterns, their order tells which it is.
    deepest = index[_lowest(patterns)] if patterns is not None else index.max()
    if deepest >= TAIL_BIN:
        at_tail = index >= TAIL_BIN
        index[at_tail] = TAIL_BIN
        tail = float(counts[at_tail].sum())
        big_e[at_tail] = 0.0  # may hold NaN from -inf values; G is 0 there
    by_bin = np.take(tables.by_bin, index, axis=0)
    # Integer-valued products whose sums stay below 2^53: exact in any order and split.
    limbs = cast(list[float], _dot(counts, by_bin[:, :_LIMBS]).tolist())
    gh = by_bin[:, _LIMBS]
    bins = counts.size
    p_abs = float(_dot(np.abs(big_e), gh))
    y_rounds = None
    if gamma(bins) * p_abs <= _DOT_Y_MAX:  # W >= 1: negligible next to ERR_E X
        y_sum, y_rounds = float(_dot(big_e, gh)), bins
    else:
        y_sum = float(pairwise_sum(np.multiply(big_e, gh, out=big_e)[None, :])[0])
    totals = _Totals(limbs, y_sum, float(counts.sum()) - tail, tail, 0.0, p_abs)
    w_h, w_l, rad, ok = _enclosure(totals, bins, True, y_rounds)
    return RowSums(a_top * 2.0**-Q, Enclosure(w_h, w_l, rad), ok)


def bin_sums(
    values: FloatArray,
    m: FloatArray,
    counts: FloatArray | None,
    row_min: FloatArray | None = None,
    patterns: IntArray | None = None,
) -> BinSums:
    """``M'`` and ``W`` per row of ``values`` (``[R, K]``), for row maxima ``|m| < M_LIMIT``
    (and, for plain rows, minima ``row_min`` when the caller has them).

    Values with ``counts`` (a deduplicated row, ``R = 1``) are each a bin of their
    own (:func:`value_row_sums`): no ``bincount``, and no empty bins where the
    values are sparse on the grid. Their bfloat16 ``patterns`` (``[1, K]``), when
    given, look ``a`` and ``e`` up (:func:`bf16_grid`).
    Plain rows are binned in groups of at most about ``_GROUP_BINS`` bins (each
    ``bincount``'s fresh output stays small), into reused per-thread buffers;
    the per-bin stage then runs on all ``R`` rows at once.
    """
    if counts is not None:
        given = None if patterns is None else patterns[0]
        one = value_row_sums(float(m[0]), counts[0], values[0], given)
        w = Enclosure(*(np.array([v]) for v in (one.w.hi, one.w.lo, one.w.rad)))
        return BinSums(np.array([one.m_grid]), w, np.array([one.ok]))
    rows, width = values.shape
    a_top = np.floor(m * SCALE_Q)
    a1 = a_top + 1.0
    low = np.floor((values.min(axis=1) if row_min is None else row_min) * SCALE_Q)
    reach = a1 - low  # j <= reach for every value; inf with a -inf value
    capped = bool((reach > TAIL_BIN).any())
    stride = int(min(reach.max(), TAIL_BIN)) + 1
    group = max(1, min(_GROUP_BINS // stride, _CHUNK // max(width, 1)))
    n_all = _buffer("n", rows * stride).reshape(rows, stride)
    e_sums = _buffer("e_sums", rows * stride).reshape(rows, stride)
    for first in range(0, rows, group):
        r = slice(first, first + group)
        with np.errstate(invalid="ignore", over="ignore"):  # -inf: NaN e, tail bin only
            keys, e_all = _keys_and_e(values[r], a1[r], stride, capped)
        flat_keys = keys.reshape(-1)
        size = keys.shape[0] * stride
        n_all[r] = np.bincount(flat_keys, minlength=size).reshape(-1, stride)
        e_sums[r] = np.bincount(flat_keys, weights=e_all.reshape(-1), minlength=size).reshape(
            -1, stride
        )
    w_h, w_l, rad, ok = _grid_stage(n_all, e_sums)
    return BinSums(a_top * 2.0**-Q, Enclosure(w_h, w_l, rad), ok)
