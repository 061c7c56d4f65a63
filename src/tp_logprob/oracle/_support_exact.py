"""Exact min-p and top-p decisions in multi-precision: what the fast path cannot settle.

Both rules compare masses, and both comparisons are decided by a Ziv loop over
intervals that shrink as the working precision doubles (mpmath's ``libmp``
with an explicit precision, the error model of :mod:`._mpfloat`).

**min-p** keeps ``v`` iff ``exp(d) >= min_p`` with ``d = z_v - M``, that is
``d >= log(min_p)``. ``d`` is a dyadic rational, formed exactly. For
``0 < min_p < 1`` (a dyadic rational, so algebraic and not 1),
``log(min_p)`` is transcendental (Lindemann: ``exp`` of a nonzero algebraic
number is transcendental), so ``d != log(min_p)``: the loop stops at the first
precision whose interval around ``log(min_p)`` excludes ``d``. ``min_p = 1``
never comes here: ``d >= 0`` holds exactly at the maximum.

**top-p** keeps the value ``w`` of the survivors iff
``F = A - p Z < 0``, with ``A`` the mass strictly above ``w`` and ``Z`` the
survivors' total (both as ``sum c_i exp(w_i - M)`` over distinct values
``w_i`` with counts ``c_i``). ``F = sum_{w_i > w} (1 - p) c_i e^(w_i - M) -
sum_{w_i <= w} p c_i e^(w_i - M)``: exponentials of distinct rationals with
rational coefficients, and the maximum's coefficient ``(1 - p) c_max`` is
nonzero for ``w < M`` and ``p < 1``. By Lindemann-Weierstrass (exponentials of
distinct algebraic numbers are linearly independent over the algebraic
numbers) ``F != 0``, so the loop stops. The maximum itself is always kept
(``A = 0 < p Z``) without any arithmetic, and a ``-inf`` value is always
dropped (``A = Z >= p Z``).

``A`` and ``Z`` are enclosed as :class:`._exact_row.RowLSE` encloses its sum, in
units of ``2^-F``: the maximum exactly, each head value ``c floor(y 2^F)`` with
``y = exp(d)`` at ``F + 4`` bits (off by less than ``2 c`` units), each tail
value (``exp(d) < 2^-(F+1)``) in ``[0, c]`` units. ``p = num / den`` exactly,
so the sign of ``F`` is read from integers.
"""

from __future__ import annotations

import numpy as np

from tp_logprob.oracle._exact_row import RowLSE, precisions, start_bits
from tp_logprob.oracle._inputs import FloatArray
from tp_logprob.oracle._mpfloat import (
    exact_diff,
    from_float,
    mpf_cmp,
    mpf_log,
    to_fixed_floor,
    widen,
)

_MIN_P_FIRST_BITS = 96


def _no_decision(what: str) -> RuntimeError:
    return RuntimeError(f"exact oracle: the {what} decision did not settle within the Ziv loop")


def min_p_keeps(value: float, row_max: float, min_p: float) -> bool:
    """``exp(value - row_max) >= min_p``, exactly, for finite values and ``0 < min_p < 1``."""
    d = exact_diff(value, row_max)
    target = from_float(min_p)
    for bits in precisions(_MIN_P_FIRST_BITS):
        log_p = mpf_log(target, bits, "n")
        if mpf_cmp(d, widen(log_p, bits, up=True)) >= 0:
            return True
        if mpf_cmp(d, widen(log_p, bits, up=False)) <= 0:
            return False  # d <= lo <= log(min_p) and d != log(min_p)
    raise _no_decision("min-p")


class TopPRow:
    """Exact top-p decisions on one row's survivors (their finite values, with repeats)."""

    def __init__(self, finite: FloatArray, top_p: float) -> None:
        self.engine = RowLSE(finite)
        self.num, self.den = top_p.as_integer_ratio()
        self.first_bits = start_bits(self.engine.num_values)

    def keeps(self, value: float) -> bool:
        """Whether the survivor value ``value`` is kept (``0 < top_p < 1``)."""
        values = self.engine.values
        j = int(np.searchsorted(values, value))
        if j >= values.size - 1:
            return True
        for bits in precisions(self.first_bits):
            a_lo, a_hi = self._fixed_sum(j + 1, bits)
            z_lo, z_hi = self._fixed_sum(0, bits)
            if a_hi * self.den - self.num * z_lo <= 0:
                return True  # F <= 0 and F != 0
            if a_lo * self.den - self.num * z_hi >= 0:
                return False
        raise _no_decision("top-p")

    def _fixed_sum(self, start: int, bits: int) -> tuple[int, int]:
        """``sum_{i >= start} c_i exp(values_i - M)`` in units of ``2^-bits``, as ``(lo, hi)``."""
        engine = self.engine
        last = len(engine.counts) - 1
        head_first = engine.head_start(bits)
        exact_floor = engine.max_count << bits
        total = exact_floor
        head = tail = 0
        for i in range(start, last):
            count = engine.counts[i]
            if i >= head_first:
                total += count * to_fixed_floor(engine.exp_diff(i, bits), bits)
                head += count
            else:
                tail += count
        return max(total - 2 * head, exact_floor), total + 2 * head + tail
