"""The fast path's row enclosures: ``T = S - c_max``, ``L = log S``, and the rounding test.

A block of rows ``[R, K]`` (finite values or ``-inf``, each row's maximum
``M`` finite) becomes, per row, ``c`` (the count of ``M``) and the scaled sum
``T 2^SHIFT = sum_{x < M} exp(x - M) 2^SHIFT`` as ``t_h + t_l`` within ``t_rad``:
every term from :func:`._fast_exp.exp_terms` (relative error ``EXP_REL``),
summed by :func:`._eft.tree_sum`; a value with ``x - M < D_MIN`` is not computed
but bounded (``TAIL``). The scale keeps every term and its low part normal.

``L = log(c + T)`` is then enclosed two ways: for ``c = 1`` and
``T <= 2^-30`` by the series ``T (1 - T/2 + T^2/3)`` on the scaled ``T``, which
keeps ``L``'s relative accuracy however small it is; otherwise by one
correction of a starting guess ``L0``: ``L = L0 + log1p(W)``,
``W = S exp(-L0) - 1``, with ``exp`` from :func:`._fast_exp.exp_terms`.
``L0`` is numpy's ``log``, used only as a guess: a poor guess makes ``W`` large
and the row falls back, it never makes a bound wrong.

Every enclosure is ``(hi, lo, rad)``: the true value lies in
``[hi + lo - rad, hi + lo + rad]``. :func:`certify` rounds it when the whole
interval rounds to one float64. Error bounds are evaluated in float64 and
multiplied by :data:`SLACK`, which covers their own few dozen roundings.
``docs/tolerances.md`` ("The oracle's fast path") derives each one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import mpmath
import numpy as np

from tp_logprob.oracle._eft import (
    U,
    fast_two_sum,
    gamma,
    tree_error_factor,
    tree_sum,
    two_prod,
    two_sum,
)
from tp_logprob.oracle._fast_exp import D_MIN, exp_rel, exp_terms
from tp_logprob.oracle._inputs import BoolArray, FloatArray

SHIFT = 600
SCALE = 2.0**SHIFT
UNSCALE = 2.0**-SHIFT
SLACK = 1.0 + 2.0**-40
# Underflow allowance for a quantity formed unscaled: a few operations of 2^-1074 each.
ETA = 2.0**-1068


def _tail_bounds() -> tuple[float, float]:
    # exp(D_MIN + 1) 2^SHIFT underflows as a double product: take it at 60 bits, rounded up.
    ctx = mpmath.MPContext()
    ctx.prec = 60
    term = ctx.exp(D_MIN + 1 + SHIFT * ctx.log(2))
    up = 1.0 + 2.0**-40
    return float(term) * up, float(term * (1 - D_MIN)) * up


# A term with dh < D_MIN has x - M < D_MIN + 2^-43: exp(x - M) 2^SHIFT is below TAIL,
# and exp(d) |d| 2^SHIFT below TAIL_Q (t e^-t decreases past 1).
TAIL, TAIL_Q = _tail_bounds()
_SMALL_T = 2.0 ** (SHIFT - 30)
_W_MAX = 2.0**-24
_EXP_BLOCK = 4096


class RowSum(Protocol):
    """What :func:`log_sum`, :func:`lse` and :func:`selected` read: ``S = c + T`` about ``m``.

    ``m`` is the point the row is shifted by (``LSE = m + log S``), ``c`` an exact
    integer part, ``T 2^SHIFT`` within ``t_h + t_l +- t_rad``, and ``S >= 1``.
    """

    m: FloatArray
    count_max: FloatArray
    t_h: FloatArray
    t_l: FloatArray
    t_rad: FloatArray


@dataclass
class Sums:
    """A :class:`RowSum` with nothing else attached: ``[R]`` arrays, or one row's plain
    floats (the binned first phase's, and any single row's)."""

    m: Any
    count_max: Any
    t_h: Any
    t_l: Any
    t_rad: Any


def fields(sums: RowSum) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]:
    """``(m, count_max, t_h, t_l, t_rad)``, in :class:`Sums`' order."""
    return sums.m, sums.count_max, sums.t_h, sums.t_l, sums.t_rad


@dataclass
class Terms:
    """Per-block exp terms and their sums (``[R, K]`` arrays, ``[R]`` sums)."""

    m: FloatArray
    count_max: FloatArray
    is_max: BoolArray
    head: BoolArray
    dh: FloatArray  # x - M rounded, 0 outside the head
    dl: FloatArray | None  # its exact remainder; None when all zero
    yh: FloatArray
    yl: FloatArray
    counts: FloatArray | None
    tail: FloatArray
    t_h: FloatArray
    t_l: FloatArray
    t_rad: FloatArray


@dataclass
class Enclosure:
    """``[hi + lo - rad, hi + lo + rad]`` holds the quantity (per row or per element)."""

    hi: FloatArray
    lo: FloatArray
    rad: FloatArray


def select(condition: Any, if_true: Any, if_false: Any) -> Any:
    """``np.where``, except that one row's numpy scalars get a plain choice: the stages
    below run on scalars for a single row, where each array call costs microseconds."""
    if isinstance(condition, (bool, np.bool_)):
        return if_true if condition else if_false
    return np.where(condition, if_true, if_false)


def _weighted(
    hi: FloatArray, lo: FloatArray, counts: FloatArray | None
) -> tuple[FloatArray, FloatArray]:
    if counts is None:
        return hi, lo
    ph, pe = two_prod(counts, hi)
    return ph, pe + counts * lo


def scaled_sum(
    hi: FloatArray, lo: FloatArray, tail: FloatArray, tail_term: float, low_ratio: float = 2.0
) -> Enclosure:
    """``sum(hi + lo)`` per row, ``hi >= 0``, ``|lo| <= low_ratio u hi``, plus ``tail`` terms.

    Each tail term is below ``tail_term``. The terms carry a relative error
    ``EXP_REL`` (and ``4 u^2`` from forming their low parts), added here.
    """
    root, err = tree_sum(hi)
    low = lo.sum(axis=1)
    t_h, t_l = fast_two_sum(root, err + low)
    size = hi.shape[1]
    # sum(hi) <= root / (1 - levels u (1 + u)^levels) <= root (1 + 2^-44) for K < 2^60.
    total = root * (1.0 + 2.0**-44)
    rad = total * (U * tree_error_factor(size) + gamma(size) * low_ratio * U * 1.0001 + 4 * U * U)
    rad += U * (abs(err) + abs(low)) * 2.0
    rel = exp_rel()
    rad += rel * (total + rad) / (1.0 - rel)
    return Enclosure(t_h, t_l, (rad + tail * tail_term) * SLACK)


def _piece(
    values: FloatArray,
    m: FloatArray | float,
    is_max: BoolArray,
    head: BoolArray,
    y: tuple[FloatArray, FloatArray],
    diffs: tuple[FloatArray, FloatArray] | None,
) -> None:
    """One cache-sized piece, written into its slices of the outputs: ``d = x - M`` split
    exactly, the masks, and the exp terms (0 outside the head)."""
    dh = values - m
    # TwoSum's error term of values + (-m); NaN only where dh is infinite (the tail).
    back = dh - values
    dl_full = (values - (dh - back)) + (-m - back)
    np.equal(dh, 0.0, out=is_max)
    np.logical_and(dh >= D_MIN, ~is_max, out=head)
    dl = np.where(head, dl_full, 0.0)
    dh = np.where(head, dh, 0.0)
    if diffs is not None:
        diffs[0][:] = dh
        diffs[1][:] = dl
    yh, yl = exp_terms(dh, dl if dl.any() else None, SHIFT, y)
    yh *= head
    yl *= head


def build_terms(
    values: FloatArray, m: FloatArray, counts: FloatArray | None, *, keep: bool = True
) -> Terms:
    """Exp terms and ``T`` for rows ``values`` (``[R, K]``) with maxima ``m`` (``[R]``, finite).

    ``keep=False`` drops the differences (``dh``, ``dl``), which only gradients
    and the entropy need.
    """
    shape = values.shape
    flat = values.reshape(-1)
    maxima = None if shape[0] == 1 else np.repeat(m, shape[1])
    is_max: BoolArray = np.empty(shape, bool)
    head: BoolArray = np.empty(shape, bool)
    yh: FloatArray = np.empty(shape)
    yl: FloatArray = np.empty(shape)
    dh_all, dl_all = (np.empty(shape), np.empty(shape)) if keep else (None, None)
    flags = (is_max.reshape(-1), head.reshape(-1))
    terms = (yh.reshape(-1), yl.reshape(-1))
    kept = None if dh_all is None or dl_all is None else (dh_all.reshape(-1), dl_all.reshape(-1))
    for start in range(0, flat.size, _EXP_BLOCK):
        p = slice(start, start + _EXP_BLOCK)
        row_max = float(m[0]) if maxima is None else maxima[p]
        diffs = None if kept is None else (kept[0][p], kept[1][p])
        _piece(flat[p], row_max, flags[0][p], flags[1][p], (terms[0][p], terms[1][p]), diffs)
    dh = np.zeros(0) if dh_all is None else dh_all
    dl = None if dl_all is None or not dl_all.any() else dl_all
    if counts is None:
        count_max = is_max.sum(axis=1).astype(np.float64)
        tail = (shape[1] - count_max) - head.sum(axis=1)
    else:
        count_max = np.where(is_max, counts, 0.0).sum(axis=1)
        tail = np.where(head | is_max, 0.0, counts).sum(axis=1)
    zh, zl = _weighted(yh, yl, counts)
    t = scaled_sum(zh, zl, tail, TAIL)
    return Terms(m, count_max, is_max, head, dh, dl, yh, yl, counts, tail, t.hi, t.lo, t.rad)


def row_sum(terms: RowSum) -> Enclosure:
    """``S = c + T``, unscaled (``S >= 1``)."""
    big_h, big_e = two_sum(terms.count_max * SCALE, terms.t_h)
    big_l = big_e + terms.t_l
    rad = (terms.t_rad + U * abs(big_l)) * UNSCALE + ETA
    return Enclosure(big_h * UNSCALE, big_l * UNSCALE, rad)


def log_sum(terms: RowSum) -> tuple[Enclosure, Enclosure]:
    """``L = log(c + T)``, unscaled and scaled by ``2^SHIFT`` (see the module docstring)."""
    small = (terms.count_max == 1.0) & (terms.t_h <= _SMALL_T)
    if isinstance(small, (bool, np.bool_)):  # one row, on scalars: its own branch only
        return _series(terms) if small else _corrected(terms, small)
    series, corrected = _series(terms), _corrected(terms, small)

    def chosen(a: Enclosure, b: Enclosure) -> Enclosure:
        return Enclosure(
            select(small, a.hi, b.hi), select(small, a.lo, b.lo), select(small, a.rad, b.rad)
        )

    return chosen(series[0], corrected[0]), chosen(series[1], corrected[1])


def _series(terms: RowSum) -> tuple[Enclosure, Enclosure]:
    """:func:`log_sum` for ``c = 1``, ``T <= 2^-30``: ``L = T (1 + h)``, on the scaled ``T``,
    with ``h = -T/2 + T^2/3`` up to ``T^3/4``."""
    t_h, t_l, t_rad = terms.t_h, terms.t_l, terms.t_rad
    t_a = t_h * UNSCALE
    h = t_a * (-0.5 + t_a * (1.0 / 3.0))
    s_h, s_l = fast_two_sum(t_h, t_l + t_h * h)
    e_g = 1.01 * U * t_a + t_a**3 / 4 + 0.51 * abs(t_l) * UNSCALE + 2.0**-1072
    s_rad = t_rad * 1.0001 + (t_h + abs(t_l)) * e_g
    s_rad += 2 * U * t_h * (abs(h) + U) + abs(t_l * h)
    plain = Enclosure(s_h * UNSCALE, s_l * UNSCALE, (s_rad * UNSCALE + ETA) * SLACK)
    return plain, Enclosure(s_h, s_l, s_rad * SLACK)


def _corrected(terms: RowSum, small: BoolArray | np.bool_ | bool) -> tuple[Enclosure, Enclosure]:
    """:func:`log_sum` by one correction: ``S = c + T`` unscaled (``S >= 1``), ``L0`` a
    guess, ``W = S exp(-L0) - 1``; rows ``small`` (the series') get ``L0 = 0``."""
    total = row_sum(terms)
    sum_h, sum_l, sum_rad = total.hi, total.lo, total.rad
    # A guess only; kept >= 0 (S >= 1) so that exp(-L0) stays in exp_terms' domain.
    if isinstance(sum_h, float):  # one row: a plain float (numpy's log, as for rows)
        l0 = 0.0 if small else max(float(np.log(sum_h)), 0.0)
    else:
        with np.errstate(divide="ignore"):
            l0 = select(small, 0.0, np.maximum(np.log(select(small, 1.0, sum_h)), 0.0))
    e_h, e_l = exp_terms(-l0, None, 0)
    exp_err = select(l0 == 0.0, 0.0, exp_rel())  # exp(0) is computed exactly
    p, q = two_prod(sum_h, e_h)
    w_h = p - 1.0  # exact when |W| <= 1/2 (Sterbenz); larger W is refused below
    cross_h, cross_l = sum_h * e_l, sum_l * e_h
    w_l = (q + cross_h) + cross_l
    w = w_h + w_l
    d_w = (sum_rad * e_h * (1 + 2 * U) + exp_err * (1.0 + abs(w)) * 1.0001) * (1.0 + 2.0**-20)
    d_w += gamma(3) * (abs(q) + abs(cross_h) + abs(cross_l)) + abs(sum_l * e_l)
    poly = w * w * (-0.5 + w * (1.0 / 3.0))
    l_h, l_m = two_sum(l0, w_h)
    rest = w_l + poly
    l_l = l_m + rest
    w2 = w * w
    g_rad = d_w / (1.0 - 2.0 * _W_MAX) + 4.2 * U * w2 + w2 * w2 / 4 * 1.01
    g_rad += U * (abs(rest) + abs(l_l)) + ETA
    g_rad = select(abs(w) <= _W_MAX, g_rad, np.inf)
    plain = Enclosure(l_h, l_l, g_rad * SLACK)
    return plain, Enclosure(l_h * SCALE, l_l * SCALE, g_rad * SCALE * SLACK)


def certify(e: Enclosure, shift: int = 0) -> tuple[FloatArray, BoolArray, BoolArray]:
    """``(value, ok, zero)``: the float64 rounding of ``(hi + lo) 2^-shift`` where ``e`` pins it.

    ``ok`` marks elements whose whole interval rounds to ``value``; ``zero``
    marks those that round to zero (``value`` is then ``+0.0``, the caller
    chooses the sign it knows). Non-finite enclosures are never ``ok``.
    """
    normal_min = 2.0 ** (shift - 1022)
    grid = 2.0 ** (shift - 1074)
    if isinstance(e.hi, float):  # one row's plain floats: the same steps, math's versions
        hi, lo = two_sum(e.hi, e.lo)
        a = abs(hi)
        sub = a < normal_min
        cand = float(np.rint(hi / grid)) * grid if sub else hi
        half = 0.5 * grid if sub else 0.5 * (a - math.nextafter(a, 0.0))
        ok = (abs(hi - cand) + abs(lo) + e.rad) * (1.0 + 2.0**-50) < half
        ok = ok and math.isfinite(e.rad) and math.isfinite(hi)
        return cand * 2.0**-shift, ok, ok and cand == 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        hi, lo = two_sum(e.hi, e.lo)  # now hi is the float nearest hi + lo
        a = abs(hi)
        sub = a < normal_min
        cand = select(sub, np.rint(hi / grid) * grid, hi)
        off = abs(hi - cand) + abs(lo)
        half = select(sub, 0.5 * grid, 0.5 * (a - np.nextafter(a, 0.0)))
        ok = (off + e.rad) * (1.0 + 2.0**-50) < half
        ok &= np.isfinite(e.rad) & np.isfinite(hi)
    value = cand * 2.0**-shift
    zero = ok & (cand == 0.0)
    return value, ok, zero


def lse(terms: RowSum, log_s: Enclosure) -> tuple[FloatArray, BoolArray]:
    """``M + L`` correctly rounded, per row; zero results are left to the slow path."""
    s, err = two_sum(terms.m, log_s.hi)
    lo = err + log_s.lo
    value, ok, zero = certify(Enclosure(s, lo, (log_s.rad + U * abs(lo)) * SLACK))
    return value, ok & ~zero


def selected(
    terms: RowSum, log_s: Enclosure, log_scaled: Enclosure, target: FloatArray
) -> tuple[FloatArray, BoolArray]:
    """``(x_t - M) - L`` correctly rounded for finite target values ``target`` (``[R]``)."""
    a, b = two_sum(target, -terms.m)
    s1, e1 = two_sum(a, -log_s.hi)
    rest = (e1 + b) - log_s.lo
    hi, lo = two_sum(s1, rest)
    rad = (log_s.rad + gamma(2) * (abs(e1) + abs(b) + abs(log_s.lo))) * SLACK
    value, ok, zero = certify(Enclosure(hi, lo, rad))
    at_max = target == terms.m
    neg = Enclosure(-log_scaled.hi, -log_scaled.lo, log_scaled.rad)
    top_value, top_ok, top_zero = certify(neg, SHIFT)
    value = select(at_max, top_value, value)
    ok = select(at_max, top_ok & ~top_zero, ok & ~zero)
    return value, ok
