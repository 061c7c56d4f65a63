"""Distances in units in the last place of a chosen floating-point format."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tp_logprob.oracle._inputs import format_name
from tp_logprob.oracle.formats import FORMATS


def _format(dtype: Any) -> tuple[int, int, int]:
    found = FORMATS[format_name(dtype, tuple(FORMATS))]
    return found.precision, found.emin, found.emax


def ulp_exponent(a: ArrayLike, dtype: Any) -> NDArray[np.int64]:
    """``log2`` of the ulp of ``dtype`` at each value of ``a`` (see :func:`ulp_distance`)."""
    p, emin, emax = _format(dtype)
    x = np.asarray(a, dtype=np.float64)
    _, e = np.frexp(np.where(np.isfinite(x), x, 0.0))
    # frexp gives |x| = f 2^e with f in [0.5, 1), so floor(log2|x|) = e - 1;
    # zero (and non-finite values, whose distance is settled elsewhere) take emin.
    top = np.where(x == 0, emin, np.clip(e.astype(np.int64) - 1, emin, emax))
    return np.asarray(top - (p - 1), dtype=np.int64)


def ulp_distance(a: ArrayLike, b: ArrayLike, dtype: Any) -> NDArray[np.float64]:
    """How many ulps of ``dtype`` the value ``b`` is from the reference ``a``.

    ``ulp_distance(a, b, dtype) = |a - b| / ulp(a)`` where ``a`` is the exact (or
    oracle) value and ``ulp(a) = 2^(max(floor(log2|a|), emin) - p + 1)`` is the
    spacing of ``dtype`` at ``a``: ``p`` bits of precision, subnormal spacing
    below the smallest normal ``2^emin`` (so ``ulp(0)`` is the smallest
    subnormal) and the top binade's spacing above the largest finite value.
    ``dtype`` is ``"bf16"``, ``"fp16"``, ``"fp32"``, ``"fp64"`` or a numpy dtype.

    Special values: NaN against NaN and equal infinities are 0; any other pairing
    of a special value is ``inf``. ``0.0`` and ``-0.0`` are 0 apart. Distances
    beyond the float64 range are ``inf``. Arrays broadcast.

    >>> float(ulp_distance(1.0, 1.0 + 2.0**-23, "fp32"))
    1.0
    """
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    q = ulp_exponent(x, dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        # Scaling by a power of two is exact; only the difference rounds.
        dist = np.abs(np.ldexp(x, -q) - np.ldexp(y, -q))
    both_nan = np.isnan(x) & np.isnan(y)
    same_inf = np.isinf(x) & (x == y)
    special = ~(np.isfinite(x) & np.isfinite(y))
    out = np.where(both_nan | same_inf, 0.0, np.where(special, np.inf, dist))
    return np.asarray(out, dtype=np.float64)
