"""Certified entropy of one row and its gradient: extends :class:`._exact_row.RowLSE`.

With ``d_v = z_v - M <= 0``, ``S = sum exp(d_v)`` and ``P = -Q = sum exp(d_v) |d_v|``
(both sums over the row's finite values),

    H = log S + P / S,    dH/dz_v = -p_v (d_v + P / S),    p_v = exp(d_v) / S.

``log S >= 0`` and ``P / S >= 0``, so ``H`` is a sum of two nonnegative parts
and its enclosure loses nothing to cancellation.

The enclosure of ``P`` at ``F`` fractional bits mirrors that of ``S``: each
distinct head value contributes ``count * floor(y |d| 2^F)`` with ``y = exp(d)``
at ``F + 4`` bits (relative error below ``2^-(F+2)``) and ``|d|`` exact; as
``y |d| <= 1/e`` each term is off by less than 2 units of ``2^-F``. A tail value
has ``|d| > t_c = (F + 1) ln 2 + 1/2`` (the ``- 1`` margin of the head cutoff
less the float64 rounding of ``d``); ``t e^-t`` decreases past 1, so it adds at
most ``t_c e^-t_c <= F / 4 + 1`` units. ``P / S`` is then enclosed by outward
division, and ``-p_v (d_v + P / S) / T`` by an outward product.

Termination: the Ziv loop stops at the first precision whose interval rounds to
one float64, so it stops whenever ``H`` (or a gradient element) is not a
float64 rounding boundary (a dyadic rational with 54 significant bits). With a
single distinct value ``H = log(count)`` (0 for one value, transcendental
otherwise) and every gradient element is exactly 0; both are short-circuited.
Otherwise that ``H`` is transcendental is the expected case (it would follow
from Schanuel's conjecture), not a theorem; a boundary would end in a
``RuntimeError`` at :data:`._exact_row.MAX_BITS`, never in a wrong result.
"""

from __future__ import annotations

import numpy as np

from tp_logprob.oracle._exact_row import (
    Interval,
    RowLSE,
    divided,
    precisions,
    underflow_cutoff,
)
from tp_logprob.oracle._inputs import FloatArray
from tp_logprob.oracle._mpfloat import (
    ZERO,
    from_man_exp,
    mpf_add,
    mpf_cmp,
    mpf_div,
    mpf_mul,
    mpf_neg,
    same_float,
    to_fixed_floor,
    widen,
)

_EXP_GUARD = 4
# A gradient element with d below this is below 2**-1144 in magnitude (times the
# row's log n <= 50): it rounds to +0.0 (d + P / S < 0, so the element is > 0).
ENTROPY_UNDERFLOW_D = -800.0


class RowEntropy(RowLSE):
    """Adds enclosures of ``P = -Q`` and ``P / S`` to the log-sum-exp engine."""

    def __init__(self, finite: FloatArray) -> None:
        super().__init__(finite)
        self._neg_q: dict[int, Interval] = {}
        self._ratios: dict[int, Interval] = {}

    def neg_q_interval(self, bits: int) -> Interval:
        """An interval holding ``P = sum exp(d) |d|`` (``P >= 0``)."""
        cached = self._neg_q.get(bits)
        if cached is None:
            cached = self._neg_q[bits] = self._neg_q_interval(bits)
        return cached

    def _neg_q_interval(self, bits: int) -> Interval:
        if self.exact:
            return Interval(ZERO, ZERO)
        last = len(self.counts) - 1
        first = self.head_start(bits)
        total = 0
        head_count = 0
        for i in range(first, last):
            c = self.counts[i]
            term = mpf_mul(self.exp_diff(i, bits), mpf_neg(self.diff(i)), 0)
            total += c * to_fixed_floor(term, bits)
            head_count += c
        tail_units = sum(self.counts[:first]) * (bits // 4 + 1)
        lo = max(total - 2 * head_count, 0)
        hi = total + 2 * head_count + tail_units
        return Interval(from_man_exp(lo, -bits), from_man_exp(hi, -bits))

    def ratio_interval(self, bits: int) -> Interval:
        """An interval holding ``P / S`` (``>= 0``)."""
        cached = self._ratios.get(bits)
        if cached is None:
            cached = self._ratios[bits] = self._ratio_interval(bits)
        return cached

    def _ratio_interval(self, bits: int) -> Interval:
        p = self.neg_q_interval(bits)
        s = self.sum_interval(bits)
        wp = bits + _EXP_GUARD
        lo = widen(mpf_div(p.lo, s.hi, wp, "f"), wp, up=False)
        hi = widen(mpf_div(p.hi, s.lo, wp, "c"), wp, up=True)
        if mpf_cmp(lo, ZERO) < 0:
            lo = ZERO
        return Interval(lo, hi)


def _no_convergence(what: str) -> RuntimeError:
    return RuntimeError(f"exact oracle: {what} did not round uniquely (see _exact_entropy)")


def certified_entropy(row: RowEntropy, first_bits: int) -> float:
    """``H = log S + P / S`` correctly rounded to float64 (``+0.0`` for one value)."""
    if row.exact and row.max_count == 1:
        return 0.0
    for bits in precisions(first_bits):
        log_s = row.log_interval(bits)
        ratio = row.ratio_interval(bits)
        h = Interval(mpf_add(log_s.lo, ratio.lo, 0), mpf_add(log_s.hi, ratio.hi, 0))
        lo, hi = h.rounded()
        if same_float(lo, hi):
            return lo  # H >= 0 and both ends are >= 0, so a zero is +0.0
    raise _no_convergence("entropy")


def _times(p: Interval, w: Interval) -> Interval:
    """``p * w`` for ``p >= 0`` and ``w`` of any sign, exactly."""
    lo = mpf_mul(p.hi if mpf_cmp(w.lo, ZERO) < 0 else p.lo, w.lo, 0)
    hi = mpf_mul(p.lo if mpf_cmp(w.hi, ZERO) < 0 else p.hi, w.hi, 0)
    return Interval(lo, hi)


def certified_entropy_grad(row: RowEntropy, first_bits: int, scale: float = 1.0) -> FloatArray:
    """``-p_v (d_v + P / S) / scale`` for each distinct value of the row, correctly rounded.

    ``scale`` is the fp32 temperature, taken exactly. A zero result carries the
    sign of the true value; a row with one distinct value is exactly 0.
    """
    out = np.zeros(len(row.counts))
    if row.exact:
        return out
    cutoff = underflow_cutoff(ENTROPY_UNDERFLOW_D, scale)
    pending = set(np.flatnonzero(row.approx_d >= cutoff).tolist())
    for bits in precisions(first_bits):
        if not pending:
            break
        s = row.sum_interval(bits)
        ratio = row.ratio_interval(bits)
        for i in sorted(pending):
            d = row.diff(i)
            w = Interval(mpf_add(d, ratio.lo, 0), mpf_add(d, ratio.hi, 0))
            prod = _times(row.quotient_interval(i, s, bits), w)
            g = divided(Interval(mpf_neg(prod.hi), mpf_neg(prod.lo)), scale, bits)
            lo, hi = g.rounded()
            if not same_float(lo, hi):
                continue
            if lo != 0.0:
                out[i] = lo
            elif mpf_cmp(g.lo, ZERO) >= 0:
                out[i] = 0.0
            elif mpf_cmp(g.hi, ZERO) <= 0:
                out[i] = -0.0
            else:
                continue  # the sign of a zero is not settled yet
            pending.discard(i)
    if pending:
        raise _no_convergence("entropy gradient")
    return out
