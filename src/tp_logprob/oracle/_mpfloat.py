"""Raw mpmath floats: exact conversion, outward widening and float64 rounding.

The oracle works on mpmath's raw ``(sign, man, exp, bc)`` tuples through
``mpmath.libmp``. That layer takes the precision as an argument, so nothing
here reads or changes a global context: it is safe under threads and xdist.
mpmath picks gmpy2 for its integers when it is installed.

Error model, used by every interval in the oracle: a libmp ``exp``, ``log`` or
``div`` asked for ``prec`` bits returns a value within 2 units in the last place
(at ``prec`` bits) of the true result. libmp computes with 14 to 20 guard bits
and claims better than 1 ulp, so the model keeps a factor of two in hand;
:func:`widen` moves a result outward by that amount.
"""

from __future__ import annotations

import math
from typing import Any, cast

from mpmath import libmp

MPF = tuple[int, Any, int, int]

ZERO: MPF = libmp.fzero
ONE: MPF = libmp.fone
LN2 = math.log(2.0)

mpf_add = libmp.mpf_add
mpf_sub = libmp.mpf_sub
mpf_neg = libmp.mpf_neg
mpf_mul = libmp.mpf_mul
mpf_exp = libmp.mpf_exp
mpf_log = libmp.mpf_log
mpf_div = libmp.mpf_div
mpf_cmp = libmp.mpf_cmp
from_float = libmp.from_float
from_int = libmp.from_int
from_man_exp = libmp.from_man_exp


def exact_diff(a: float, b: float) -> MPF:
    """``a - b`` for finite floats, exactly (``prec=0`` means no rounding)."""
    return cast(MPF, mpf_sub(from_float(a), from_float(b), 0))


def widen(x: MPF, prec: int, up: bool, ulps: int = 2) -> MPF:
    """``x`` moved outward by ``ulps`` units in the last place at ``prec`` bits.

    An exact zero stays zero: the libmp functions return zero only for exact
    results (``log(1)``), never for underflow.
    """
    _, man, exp, bc = x
    if not man:
        return x
    delta = from_man_exp(ulps, exp + bc - prec)
    return cast(MPF, mpf_add(x, delta if up else mpf_neg(delta), 0))


def to_fixed_floor(x: MPF, frac_bits: int) -> int:
    """``floor(x * 2**frac_bits)`` for a nonnegative finite ``x``."""
    _, man, exp, _ = x
    shift = exp + frac_bits
    return int(man << shift) if shift >= 0 else int(man >> -shift)


def to_float64(x: MPF, nudge: int = 0) -> float:
    """``x`` rounded to the nearest float64, ties to even.

    Handles the subnormal range without double rounding and overflows to
    ``±inf`` exactly as IEEE 754 round-to-nearest does. mpf has no negative
    zero; a nonzero value that rounds to zero keeps its sign.

    ``nudge=+1`` (``-1``) rounds a value infinitely close above (below) ``x``
    instead: the result differs from plain rounding only when ``x`` is exactly
    halfway between two floats, where it takes the neighbour on that side. This
    rounds the open end of an interval.
    """
    sign, man, exp, bc = x
    if not man:
        if x == libmp.fzero:
            return 0.0
        if x == libmp.finf:
            return math.inf
        if x == libmp.fninf:
            return -math.inf
        return math.nan
    quantum = max(exp + bc - 53, -1074)  # exponent of the float64 ulp at |x|
    shift = quantum - exp
    if shift <= 0:
        m = int(man) << -shift
    else:
        m = int(man >> shift)
        rem = int(man) - (m << shift)
        half = 1 << (shift - 1)
        if rem > half:
            m += 1
        elif rem == half:
            # A tie goes to even; a nudged one to the side the nudge points
            # to, which is up in magnitude when it points away from zero.
            up = bool(m & 1) if nudge == 0 else (nudge > 0) != bool(sign)
            m += up
    try:
        value = math.ldexp(float(m), quantum)
    except OverflowError:
        value = math.inf
    return -value if sign else value


def same_float(a: float, b: float) -> bool:
    """True when two rounded endpoints agree (``-0.0`` and ``0.0`` agree)."""
    return a == b or (math.isnan(a) and math.isnan(b))
