"""A vectorised ``exp`` in double-double with a proven relative error bound, no libm.

For ``d = dh + dl`` (an exact difference, ``D_MIN <= dh <= 0``) and an integer
``shift``, :func:`exp_terms` returns ``yh + yl = exp(d) 2^shift (1 + theta)`` with
``|theta| <= EXP_REL`` (:func:`exp_rel`, about ``2^-86.5``) and ``|yl| <= u |yh|``:

1. ``k = rint(dh 1024 / ln 2)``; ``r = d - k C`` with ``C = ln 2 / 1024`` in four
   parts: ``C1`` and ``C2`` on 32 bits (``k C1``, ``k C2`` exact for
   ``|k| < 2^21``), ``C3`` a double, the rest below ``2^-127``. ``dh - k C1`` is
   exact; two :func:`two_sum` steps give ``r = rh + rl`` with
   ``|rh| <= R_MAX = 3.386e-4`` and ``|rl| <= RL_MAX``;
2. ``exp(rh) - 1 = rh + rh^2/2 + rh^3 Q(rh)`` with ``Q`` the Taylor polynomial of
   degree 3 (``rh^2`` split exactly), times ``1 + rl``;
3. ``exp(d) = 2^(k >> 10) 2^((k & 1023) / 1024) exp(r)``, the second factor from
   a double-double table computed once with mpmath;
4. the power of two is applied exactly by building its bit pattern.

A plain float (one row's scalar) takes the same steps on Python floats.

The error terms of each step are :func:`exp_error_terms`; ``docs/tolerances.md``
("The oracle's fast path") derives them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

import mpmath
import numpy as np

from tp_logprob.oracle._eft import U, fast_two_sum, split, two_prod_split, two_sum
from tp_logprob.oracle._inputs import FloatArray

# Smallest dh computed; below it a term is bounded (the tail), never computed.
D_MIN = -1000.0
# Bounds on the reduced argument (docs/tolerances.md): |rh| <= C/2 (1 + 2^-30) + 2^-44.
R_MAX = 3.386e-4
RL_MAX = 1.12e-16
_TABLE_BITS = 10
_K_MAX = 2.0**21  # |k| <= 1000 * 1024 / ln 2 + 1 < 2^21


@dataclass(frozen=True)
class _Tables:
    inv_c: float
    c1: float
    c2: float
    neg_c2: float
    c3: float
    k6: float
    k24: float
    k120: float
    k720: float
    th: FloatArray
    tl: FloatArray
    thh: FloatArray
    thl: FloatArray
    entries: tuple[tuple[float, float, float, float], ...]  # (th, tl, thh, thl) as floats


@lru_cache(maxsize=1)
def tables() -> _Tables:
    """The reduction constants and the table of ``2^(j/1024)``, built once (about 10 ms)."""
    ctx = mpmath.MPContext()
    ctx.prec = 240
    c = ctx.log(2) / 1024
    c1 = ctx.floor(c * 2**42) / 2**42  # 32 bits: C lies in [2^-11, 2^-10)
    c2 = ctx.floor((c - c1) * 2**74) / 2**74  # 32 bits below 2^-42
    c3 = float(c - c1 - c2)
    size = 1 << _TABLE_BITS
    exact = [ctx.power(2, ctx.mpf(j) / size) for j in range(size)]
    th = np.array([float(v) for v in exact])
    tl = np.array([float(v - ctx.mpf(float(v))) for v in exact])
    thh, thl = split(th)
    return _Tables(
        inv_c=float(1 / c),
        c1=float(c1),
        c2=float(c2),
        neg_c2=-float(c2),
        c3=c3,
        k6=1.0 / 6.0,
        k24=1.0 / 24.0,
        k120=1.0 / 120.0,
        k720=1.0 / 720.0,
        th=th,
        tl=tl,
        thh=thh,
        thl=thl,
        entries=tuple(zip(th.tolist(), tl.tolist(), thh.tolist(), thl.tolist(), strict=True)),
    )


def reduce(dh: FloatArray, dl: FloatArray | None) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``(k, rh, rl)``: ``dh + dl = k ln2 / 1024 + rh + rl`` up to ``2^-104``, ``|rh| <= R_MAX``."""
    t = tables()
    k = _rint(dh * t.inv_c)
    r1 = dh - k * t.c1  # exact: both are multiples of min(ulp(dh), 2^-42) and |r1| < 2^-11
    if dl is None:
        rh, e = two_sum(r1, k * t.neg_c2)  # k C2 is exact
        return k, rh, e - k * t.c3
    a, b = two_sum(r1, dl)
    rh, e = two_sum(a, k * t.neg_c2)
    return k, rh, (b + e) - k * t.c3


def _rint(x: Any) -> Any:
    """``np.rint``; a plain float stays plain (``round`` also rounds half to even)."""
    return float(round(x)) if isinstance(x, float) else np.rint(x)


def exp_terms(
    dh: Any,
    dl: FloatArray | None,
    shift: int,
    out: tuple[FloatArray, FloatArray] | None = None,
) -> tuple[Any, Any]:
    """``(yh, yl)`` with ``yh + yl = exp(dh + dl) 2^shift (1 + theta)``, ``|theta| <= EXP_REL``.

    ``dh`` is an array, or one plain float (two floats back). ``dl`` None means
    zero. Needs ``D_MIN <= dh <= 0``, ``|dl| <= ulp(dh) / 2`` and
    ``exp(dh) 2^shift >= 2^-968`` (so that ``yl`` is normal too): then ``yh`` and
    ``yl`` are exact scalings of a normalised pair. ``out`` receives them.
    """
    t = tables()
    plain = isinstance(dh, float)  # one row's plain float: math's steps, the same values
    if plain and not math.isfinite(dh):
        return math.nan, math.nan
    k, rh, rl = reduce(dh, dl)
    # rh^2 = A + B + C exactly: A = rh_hi^2 (52 bits), B = 2 rh_hi rh_lo (53 bits), C = rh_lo^2.
    rh_hi, rh_lo = split(rh)
    half_a = 0.5 * (rh_hi * rh_hi)
    half_bc = rh_hi * rh_lo + 0.5 * (rh_lo * rh_lo)
    q = t.k6 + rh * (t.k24 + rh * (t.k120 + rh * t.k720))
    cube = ((rh * rh) * rh) * q
    ph, pl = fast_two_sum(rh, half_a)
    # exp(r) - 1 = ph + c, summed small terms first so only the last addition is large.
    c = cube + (rl + (rl * (rh + half_a) + (half_bc + pl)))
    ki: Any
    if plain:
        ki = int(k)
        th, tl, thh, thl = t.entries[ki & ((1 << _TABLE_BITS) - 1)]
    else:
        ki = k.astype(np.int64)
        j = ki & ((1 << _TABLE_BITS) - 1)
        th, tl, thh, thl = t.th[j], t.tl[j], t.thh[j], t.thl[j]
    mh, ml = two_prod_split(th, thh, thl, ph, *split(ph))
    yh, ym = fast_two_sum(th, mh)
    yl = th * c + (ym + (ml + (tl + tl * (ph + c))))
    yh, yl = fast_two_sum(yh, yl)
    if plain:
        scale = math.ldexp(1.0, (ki >> _TABLE_BITS) + shift)
        return yh * scale, yl * scale
    scale = (((ki >> _TABLE_BITS) + (shift + 1023)) << 52).view(np.float64)
    if out is None:
        return yh * scale, yl * scale
    return np.multiply(yh, scale, out=out[0]), np.multiply(yl, scale, out=out[1])


def exp_error_terms() -> dict[str, float]:
    """Each step's contribution to the absolute error of ``exp(r)`` (``docs/tolerances.md``)."""
    r, rl = R_MAX, RL_MAX
    t = tables()
    q_max = 1 / 6 + r / 24 + r**2 / 120 + r**3 / 720

    # Horner in double: each coefficient's representation error (exact, as a
    # rational), and one rounding per product and per sum.
    def rep(value: float, den: int) -> float:
        return float(abs(Fraction(value) - Fraction(1, den)))

    inner = rep(t.k120, 120) + 2 * U / 120 + r * (rep(t.k720, 720) + U / 720)
    dq = rep(t.k6, 6) + U * q_max + r * (rep(t.k24, 24) + 2 * U * 0.0417 + r * inner)
    c_max = r**3 * q_max * (1 + 4 * U) + rl * (1 + 2 * r) + U * r**2 + 2.0**-63
    yl_max = 2.0**-52 + 2 * U * r * 1.001 + 2 * c_max * (1 + U) + U * (1 + 1.01 * r)
    inner_c = r**2 * 2.0**-26 + 2.0**-64
    r_err = U * _K_MAX * abs(t.c3) + U * 2.0**-63 + U * rl + _K_MAX * 2.0**-127
    return {
        "taylor remainder": r**7 / 5040 / (1 - r / 8),
        "cube term (Q and rh^3 in double)": r**3 * (dq + 3.0001 * U * q_max),
        "rl beyond second order": rl * r**3 / 6 * (1 + r) + rl**2 * 0.51,
        "reduced argument error": r_err * 1.001,
        # The last addition, and three below it on partial sums of at most
        # rl + 2 r rl + r^2 2^-26 + 2^-64 (half_bc and pl).
        "sum of the correction c": U * c_max + 4 * U * (rl * (1 + 2 * r) + inner_c),
        "table entry": 2.0**-106 * (1 + r),
        "th * c and the low sum": 2 * U * c_max * 2 + U * yl_max + 4 * U * 2.0**-51,
        "underflow of tiny rh": 2.0**-1060,
    }


@lru_cache(maxsize=1)
def exp_rel() -> float:
    """``EXP_REL``: the terms' sum over ``1 - R_MAX <= exp(-R_MAX) <= T_j exp(r)``, rounded up."""
    total = sum(exp_error_terms().values())
    return total / (1.0 - R_MAX) * (1 + 2.0**-20)
