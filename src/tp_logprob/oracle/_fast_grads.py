"""The fast path's softmax probabilities, entropy and gradients, from :class:`._fast_rows.Terms`.

``1/S`` comes from one Newton correction of an IEEE division, with the
residual formed exactly; each probability ``p_v = exp(d_v) / S`` is then a
double-double product with a relative error of ``EXP_REL`` plus that of
``1/S``. Probabilities and gradient elements are formed scaled by
``2^SHIFT`` (they stay normal down to ``exp(D_MIN)``) and rounded by
:func:`._fast_rows.certify` on the float64 grid of the unscaled value, subnormal
and zero results included. The entropy adds ``P = sum exp(d) |d|``, summed like
``T``; ``H = L + P / S`` and ``dH/dz_v = -p_v (d_v + P / S)``
(``docs/tolerances.md``, "The oracle's fast path").
"""

from __future__ import annotations

import numpy as np

from tp_logprob.oracle._eft import U, gamma, split, two_prod, two_prod_split, two_sum
from tp_logprob.oracle._fast_exp import exp_rel
from tp_logprob.oracle._fast_rows import (
    ETA,
    SCALE,
    SHIFT,
    SLACK,
    TAIL_Q,
    UNSCALE,
    Enclosure,
    Terms,
    certify,
    row_sum,
    scaled_sum,
)
from tp_logprob.oracle._inputs import BoolArray, FloatArray

_UNDERFLOW = 2.0**-1073  # > 3 * 2^-1075: the reciprocal's underflowing roundings (A6)


def reciprocal(terms: Terms) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``(r_h, r_l, rel)``: ``1 / S`` per row, within a relative ``rel``."""
    s = row_sum(terms)
    r0 = 1.0 / s.hi
    p, q = two_prod(s.hi, r0)
    tail = s.lo * r0
    eps = ((1.0 - p) - q) - tail  # 1 - p and its difference with q are exact
    r_l = r0 * eps
    own = (U * (np.abs(tail) + np.abs(eps)) + eps * eps * 1.01 + U * np.abs(eps)) * 1.0001
    # tail, eps and r_l may be subnormal: three roundings of at most 2^-1075 each, absolute
    # (S >= 1, so r0 <= 1 carries the first two into r_l no larger).
    own += _UNDERFLOW / r0 * 1.0001
    rel_s = s.rad / s.hi * 1.0001
    return r0, r_l, (own + rel_s / (1.0 - rel_s)) * SLACK


def _times_row(
    ah: FloatArray, al: FloatArray, bh: FloatArray, bl: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``(ah + al)(bh + bl)`` as ``(hi, lo)`` and an absolute rounding bound (``bh`` broadcast)."""
    ph, pe = two_prod_split(ah, *split(ah), bh, *split(bh))
    cross = ah * bl + al * bh
    lo = pe + cross
    err = gamma(2) * (np.abs(pe) + np.abs(ah * bl) + np.abs(al * bh)) + np.abs(al * bl)
    return ph, lo, err


def _divided(
    hi: FloatArray, lo: FloatArray, rad: FloatArray, scale: float
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``(hi + lo ± rad) / scale`` for a positive double ``scale``: IEEE division, corrected."""
    if scale == 1.0:
        return hi, lo, rad
    q_h = hi / scale
    pi_h, pi_l = two_prod(q_h, np.full_like(q_h, scale))
    residual = (hi - pi_h) - pi_l  # exact: the remainder of a correctly rounded division
    num = residual + lo
    q_l = num / scale
    err = (U * np.abs(num) / scale + U * np.abs(q_l)) * 1.0001
    return q_h, q_l, rad / scale * (1.0 + 2 * U) + err


def probabilities(terms: Terms, r_h: FloatArray, r_l: FloatArray, rel_r: FloatArray) -> Enclosure:
    """``p_v 2^SHIFT`` for every value (``[R, K]``); max values are exact ``2^SHIFT`` terms."""
    yh = np.where(terms.is_max, SCALE, terms.yh)
    ph, pl, err = _times_row(yh, terms.yl, r_h[:, None], r_l[:, None])
    rel = np.where(terms.is_max, 0.0, exp_rel()) + rel_r[:, None]
    return Enclosure(ph, pl, ((np.abs(ph) + np.abs(pl)) * rel * 1.0001 + err) * SLACK)


def negated_quotient(p: Enclosure, scale: float) -> tuple[FloatArray, BoolArray]:
    """``-p / scale`` rounded per element (a zero is ``-0.0``), and where it is certified."""
    q_h, q_l, rad = _divided(p.hi, p.lo, p.rad, scale)
    value, ok, zero = certify(Enclosure(-q_h, -q_l, rad * SLACK), SHIFT)
    return np.where(zero, -0.0, value), ok


def target_gradient(
    terms: Terms,
    r_h: FloatArray,
    r_l: FloatArray,
    rel_r: FloatArray,
    y_h: FloatArray,
    y_l: FloatArray,
    at_max: BoolArray,
    scale: float,
) -> tuple[FloatArray, BoolArray]:
    """``(1 - p_t) / scale`` per row, ``p_t = y_t / S`` (``y`` scaled, ``2^SHIFT`` at the max)."""
    c = terms.count_max
    # At the max, S - y_t = (c - 1) + T keeps T's relative accuracy when c = 1.
    a, b = two_sum(terms.t_h, np.where(at_max, 0.0, -y_h))
    n_h, n_e = two_sum(np.where(at_max, c - 1.0, c) * SCALE, a)
    tail = (b + terms.t_l) - np.where(at_max, 0.0, y_l)
    n_l = n_e + tail
    n_rad = terms.t_rad + np.where(at_max, 0.0, exp_rel() * y_h * 1.0001)
    n_rad += gamma(3) * (np.abs(b) + np.abs(terms.t_l) + np.abs(y_l) + np.abs(n_e))
    g_h, g_l, err = _times_row(n_h, n_l, r_h, r_l)
    rad = n_rad * r_h * (1.0 + rel_r) * 1.0001 + (np.abs(g_h) + np.abs(g_l)) * rel_r + err
    q_h, q_l, q_rad = _divided(g_h, g_l, rad * SLACK, scale)
    value, ok, zero = certify(Enclosure(q_h, q_l, q_rad * SLACK), SHIFT)
    return value, ok & ~zero


def neg_q_terms(terms: Terms) -> Enclosure:
    """``P 2^SHIFT = sum exp(d) |d| 2^SHIFT`` per row (``[R]``), like ``T``."""
    neg_d = -terms.dh
    gh, ge = two_prod(terms.yh, neg_d)
    gl = ge + terms.yl * neg_d
    if terms.dl is not None:
        gl = gl - terms.yh * terms.dl
    if terms.counts is not None:
        wh, we = two_prod(terms.counts, gh)
        gh, gl = wh, we + terms.counts * gl
    return scaled_sum(gh, gl, terms.tail, TAIL_Q, low_ratio=4.0)


def ratio(p: Enclosure, r_h: FloatArray, r_l: FloatArray, rel_r: FloatArray) -> Enclosure:
    """``rho 2^SHIFT = P / S 2^SHIFT`` per row."""
    hi, lo, err = _times_row(p.hi, p.lo, r_h, r_l)
    rad = p.rad * r_h * (1.0 + rel_r) * 1.0001 + (np.abs(hi) + np.abs(lo)) * rel_r + err
    return Enclosure(hi, lo, rad * SLACK)


def entropy(log_scaled: Enclosure, rho: Enclosure) -> tuple[FloatArray, BoolArray]:
    """``H = L + rho`` rounded per row (both parts are ``>= 0``); zero results fail."""
    h, e = two_sum(log_scaled.hi, rho.hi)
    rest = log_scaled.lo + rho.lo
    lo = e + rest
    rad = log_scaled.rad + rho.rad + U * (np.abs(rest) + np.abs(lo)) * 1.0001
    value, ok, zero = certify(Enclosure(h, lo, rad * SLACK), SHIFT)
    return value, ok & ~zero


def entropy_gradient(
    terms: Terms,
    p: Enclosure,
    rho: Enclosure,
    r_h: FloatArray,
    r_l: FloatArray,
    rel_r: FloatArray,
    scale: float,
) -> tuple[FloatArray, BoolArray]:
    """``-p_v (d_v + rho) / scale`` per element (``[R, K]``), and where it is certified."""
    rho_h = (rho.hi * UNSCALE)[:, None]
    rho_l = (rho.lo * UNSCALE)[:, None]
    rho_rad = (rho.rad * UNSCALE)[:, None] + ETA
    w_h, w_e = two_sum(terms.dh, rho_h)
    rest = (rho_l if terms.dl is None else terms.dl + rho_l) + w_e
    w_rad = rho_rad + U * 2.0001 * (np.abs(rest) + np.abs(w_e))
    g_h, g_l, err = _times_row(p.hi, p.lo, w_h, rest)
    w_abs = np.abs(w_h) + np.abs(rest)
    rad = p.rad * (w_abs + w_rad) + (np.abs(p.hi) + np.abs(p.lo)) * w_rad + err
    # The max columns have w = rho exactly: (1 / S) rho 2^SHIFT keeps a tiny rho's accuracy.
    top_h, top_l, top_err = _times_row(rho.hi, rho.lo, r_h, r_l)
    top_rad = rho.rad * r_h * (1.0 + rel_r) * 1.0001 + (np.abs(top_h) + np.abs(top_l)) * rel_r
    top = terms.is_max
    g_h = np.where(top, top_h[:, None], g_h)
    g_l = np.where(top, top_l[:, None], g_l)
    rad = np.where(top, (top_rad + top_err)[:, None], rad)
    q_h, q_l, q_rad = _divided(g_h, g_l, rad * SLACK, scale)
    value, ok, zero = certify(Enclosure(-q_h, -q_l, q_rad * SLACK), SHIFT)
    # A zero takes the sign of -(d + rho), which is known once w excludes 0.
    w_sign = np.where(top, 1.0, np.sign(w_h))
    rho_positive = (rho.hi > (np.abs(rho.lo) + rho.rad) * (1.0 + 2.0**-50))[:, None]
    known = np.where(top, rho_positive, np.abs(w_h) > (np.abs(rest) + w_rad) * (1.0 + 2.0**-50))
    value = np.where(zero, np.where(w_sign > 0, -0.0, 0.0), value)
    return value, ok & (~zero | known)
