"""Error-free transformations on numpy float64 arrays, and a pairwise sum that keeps its errors.

Only IEEE round-to-nearest ``+``, ``-`` and ``*`` are used (numpy never
contracts them into an FMA), so each result below holds on any IEEE platform.
``u = 2^-53`` is the unit roundoff. Exactness needs no overflow, and no
underflow where a product is involved; every caller either keeps its operands
in range or bounds what an underflow can cost (``docs/tolerances.md``, "The
oracle's fast path").
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from tp_logprob.oracle._inputs import FloatArray
from tp_logprob.oracle.formats import U64

U = U64  # the names of the proofs in docs/tolerances.md
# Veltkamp's constant 2^27 + 1: splits a double into two halves of 26 bits each.
_SPLITTER = 134217729.0


def gamma(k: int) -> float:
    """``gamma_k = k u / (1 - k u)``, rounded up: the classic bound for ``k`` roundings."""
    return k * U / (1.0 - k * U) * (1.0 + 2.0**-50)


def two_sum(a: FloatArray, b: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(s, e)`` with ``s = fl(a + b)`` and ``s + e = a + b`` exactly (Knuth), any order."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


def fast_two_sum(a: FloatArray, b: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(s, e)`` with ``s + e = a + b`` exactly, for ``|a| >= |b|`` (Dekker)."""
    s = a + b
    e = b - (s - a)
    return s, e


def split(a: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(hi, lo)`` with ``hi + lo = a`` exactly and each half on 26 bits (Veltkamp)."""
    c = _SPLITTER * a
    hi = c - (c - a)
    return hi, a - hi


def two_prod(a: FloatArray, b: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(p, e)`` with ``p = fl(a b)`` and ``p + e = a b`` exactly (Dekker, no FMA)."""
    ah, al = split(a)
    bh, bl = split(b)
    return two_prod_split(a, ah, al, b, bh, bl)


def two_prod_split(
    a: FloatArray,
    ah: FloatArray,
    al: FloatArray,
    b: FloatArray,
    bh: FloatArray,
    bl: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """:func:`two_prod` with both operands already split (a table, or a per-row constant)."""
    p = a * b
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


@lru_cache(maxsize=256)
def tree_error_factor(size: int) -> float:
    """``F`` with ``|root + err - sum(a)| <= F u sum(|a|)`` for :func:`tree_sum` of ``size`` terms.

    Level ``l`` turns ``n_l`` pairs into sums ``s`` and errors ``e`` with
    ``|e| <= u |s|`` and ``sum |s| <= (1 + u)^l sum |a|``; its ``n_l (+1)`` errors
    are added in any order (``gamma``), and the running total takes at most two
    additions per level (the level's sum and an odd element's error).
    """
    factor = 0.0
    levels = 0
    n = size
    while n > 1:
        levels += 1
        pairs = n // 2
        factor += gamma(pairs + (n % 2)) * (1.0 + U) ** levels
        n = pairs
    if levels:
        factor += gamma(2 * levels) * levels * (1.0 + U) ** levels * (1.0 + gamma(size))
    return factor * (1.0 + 2.0**-40)


def tree_sum(a: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Row sums of ``a`` (``[R, K]``) as ``root + err``: pairwise :func:`two_sum` levels.

    ``root + (the exact sum of every error)`` is exactly ``sum(a)``; ``err`` is
    that error sum in floating point, within :func:`tree_error_factor`.
    """
    errors = np.zeros(a.shape[0])
    while a.shape[1] > 1:
        half = a.shape[1] // 2
        s, e = two_sum(a[:, :half], a[:, half : 2 * half])
        errors += e.sum(axis=1)
        if a.shape[1] % 2:
            s0, e0 = two_sum(s[:, 0], a[:, -1])
            s[:, 0] = s0
            errors += e0
        a = s
    root = a[:, 0] if a.shape[1] else np.zeros(a.shape[0])
    return np.array(root), errors
