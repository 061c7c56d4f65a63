"""Certified log-sum-exp of one row: the engine behind :mod:`tp_logprob.oracle.exact`.

For a row of finite values with maximum ``M`` (multiplicity ``c_max``),
``S = sum_v exp(x_v - M)`` and ``LSE = M + log S``. The engine encloses ``S``
in an interval whose width shrinks as the working precision ``F`` grows, and a
Ziv loop doubles ``F`` until every requested quantity rounds to one float64.

The enclosure at ``F`` fractional bits (all arithmetic on Python integers):

* equal values are grouped (``np.unique``) and each distinct difference
  ``d = x - M`` is formed exactly, once;
* the maximum contributes ``c_max`` exactly; every other distinct value with
  ``d >= -(F + 1) ln 2 - 1`` (the head) contributes ``count * floor(y * 2^F)``
  where ``y = exp(d)`` at ``F + 4`` bits. By the error model of
  :mod:`._mpfloat` each such term is off by less than ``count * 2`` units of
  ``2^-F``;
* the remaining values (the tail) have ``exp(d) < 2^-(F+1)`` (the ``- 1`` margin
  absorbs the float64 rounding of the ``d`` used to pick them), so together they
  add less than ``n_tail`` units and are bounded instead of computed;
* ``S >= c_max`` always, which is used as a floor for the lower end.

``log`` of the two ends (rounded outward, widened per the error model) encloses
``L = log S``; ``M + L`` and ``x_t - M - L`` are then formed exactly.

Open ends and termination: with more than one distinct value, ``S`` is a sum
of exponentials of distinct dyadic rationals with positive integer weights, so
by Lindemann-Weierstrass ``S``, ``LSE``, ``x_t - LSE`` and ``exp(x_v - LSE)``
are transcendental: none equals an interval end (a dyadic rational), so each
lies strictly inside its interval, and the ends are rounded as open ends
(:meth:`Interval.rounded`). A quantity infinitely close to a rounding boundary
because a whole tail was dropped (``x_t - M`` exactly halfway between two
floats, ``L`` tinier than any precision) therefore still rounds correctly at
the first precision whose interval excludes the boundary from its interior.
Otherwise the loop stops once the interval is narrower than the distance to the
nearest boundary. With one distinct value ``S = c_max`` exactly: ``c_max = 1``
is short-circuited, and ``log(c_max)`` for ``c_max > 1`` is transcendental.
"""

from __future__ import annotations

import math

import numpy as np

from tp_logprob.oracle._inputs import FloatArray
from tp_logprob.oracle._mpfloat import (
    LN2,
    MPF,
    ONE,
    ZERO,
    exact_diff,
    from_float,
    from_int,
    from_man_exp,
    mpf_add,
    mpf_cmp,
    mpf_div,
    mpf_exp,
    mpf_log,
    mpf_sub,
    same_float,
    to_fixed_floor,
    to_float64,
    widen,
)

# Guard bits between the fixed-point sum and the precision of each exp.
_EXP_GUARD = 4
# Past this many fractional bits the loop gives up (never reached in practice:
# see the termination argument in the module docstring).
MAX_BITS = 1 << 16
# exp(d) for d below this (in float64) is under 2**-1095: it rounds to 0 even
# after division by S >= 1, and (1 - it) / T rounds as 1 / T does (1 / T is
# a power of two or at least 2**-78 relative away from a rounding boundary).
UNDERFLOW_D = -760.0


def start_bits(num_values: int) -> int:
    """Default first working precision: 53 bits plus room for the sum's error."""
    return 80 + int(num_values).bit_length()


def precisions(first: int) -> list[int]:
    """The Ziv schedule: ``first, 2 first, 4 first, ...`` up to :data:`MAX_BITS`."""
    out = []
    bits = first
    while bits <= MAX_BITS:
        out.append(bits)
        bits *= 2
    return out


class Interval:
    """An interval ``[lo, hi]`` of raw mpf values holding a quantity.

    The quantity lies strictly inside unless ``lo == hi`` (module docstring).
    """

    __slots__ = ("hi", "lo")

    def __init__(self, lo: MPF, hi: MPF) -> None:
        self.lo = lo
        self.hi = hi

    def rounded(self) -> tuple[float, float]:
        """The float64 roundings of the interior's two ends.

        The quantities enclosed are never dyadic rationals outside the
        short-circuited exact cases (module docstring), so they lie strictly
        inside the interval: its ends are rounded as open ends.
        """
        if self.lo == self.hi:
            value = to_float64(self.lo)
            return value, value
        return to_float64(self.lo, nudge=1), to_float64(self.hi, nudge=-1)


class RowLSE:
    """Interval enclosures of ``S`` and ``log S`` for one row of finite values."""

    def __init__(self, finite: FloatArray) -> None:
        values, counts = np.unique(finite, return_counts=True)
        self.values = values
        self.counts: list[int] = counts.tolist()
        self.max = float(values[-1])
        self.max_count = self.counts[-1]
        self.num_values = int(finite.size)
        # Approximate differences, only used to choose what to compute
        # (may overflow to -inf, which only sends a value to the tail).
        with np.errstate(over="ignore"):
            self.approx_d = values - self.max
        # S == c_max exactly when there is a single distinct value.
        self.exact = values.size == 1
        self._diffs: dict[int, MPF] = {}
        self._exps: dict[tuple[int, int], MPF] = {}
        self._sums: dict[int, Interval] = {}
        self._logs: dict[int, Interval] = {}

    def diff(self, i: int) -> MPF:
        """Exact ``values[i] - max``."""
        d = self._diffs.get(i)
        if d is None:
            d = exact_diff(float(self.values[i]), self.max)
            self._diffs[i] = d
        return d

    def exp_diff(self, i: int, bits: int) -> MPF:
        """``exp(values[i] - max)`` at ``bits + guard`` bits (error model of _mpfloat)."""
        key = (i, bits)
        y = self._exps.get(key)
        if y is None:
            y = ONE if i == len(self.counts) - 1 else mpf_exp(self.diff(i), bits + _EXP_GUARD)
            self._exps[key] = y
        return y

    def head_start(self, bits: int) -> int:
        """First index of the head: values whose exp is computed at ``bits``."""
        cutoff = -(bits + 1) * LN2 - 1.0
        return int(np.searchsorted(self.approx_d, cutoff, side="left"))

    def sum_interval(self, bits: int) -> Interval:
        """An interval holding ``S``, of width below ``(4 n_head + n_tail) 2^-bits``."""
        cached = self._sums.get(bits)
        if cached is None:
            cached = self._sums[bits] = self._sum_interval(bits)
        return cached

    def _sum_interval(self, bits: int) -> Interval:
        if self.exact:
            s = from_int(self.max_count)
            return Interval(s, s)
        last = len(self.counts) - 1
        first = self.head_start(bits)
        total = self.max_count << bits
        head_count = 0
        for i in range(first, last):
            c = self.counts[i]
            total += c * to_fixed_floor(self.exp_diff(i, bits), bits)
            head_count += c
        tail_count = sum(self.counts[:first])
        lo = max(total - 2 * head_count, self.max_count << bits)
        hi = total + 2 * head_count + tail_count
        return Interval(from_man_exp(lo, -bits), from_man_exp(hi, -bits))

    def log_interval(self, bits: int) -> Interval:
        """An interval holding ``L = log S`` (``L >= 0``)."""
        cached = self._logs.get(bits)
        if cached is None:
            cached = self._logs[bits] = self._log_interval(bits)
        return cached

    def _log_interval(self, bits: int) -> Interval:
        if self.exact and self.max_count == 1:
            return Interval(ZERO, ZERO)
        s = self.sum_interval(bits)
        wp = bits + _EXP_GUARD
        lo = widen(mpf_log(s.lo, wp, "f"), wp, up=False)
        hi = widen(mpf_log(s.hi, wp, "c"), wp, up=True)
        if mpf_cmp(lo, ZERO) < 0:
            lo = ZERO  # S >= 1, so L >= 0
        return Interval(lo, hi)

    def quotient_interval(self, i: int, s: Interval, bits: int) -> Interval:
        """An interval holding ``exp(values[i] - LSE) = exp(values[i] - max) / S``."""
        wp = bits + _EXP_GUARD
        y = self.exp_diff(i, bits)
        exact_y = i == len(self.counts) - 1
        y_lo = y if exact_y else widen(y, wp, up=False)
        y_hi = y if exact_y else widen(y, wp, up=True)
        lo = widen(mpf_div(y_lo, s.hi, wp, "f"), wp, up=False)
        hi = widen(mpf_div(y_hi, s.lo, wp, "c"), wp, up=True)
        # 0 <= exp(d) / S <= 1 since d <= 0 and S >= 1.
        if mpf_cmp(lo, ZERO) < 0:
            lo = ZERO
        if mpf_cmp(hi, ONE) > 0:
            hi = ONE
        return Interval(lo, hi)


def _no_convergence(what: str) -> RuntimeError:
    return RuntimeError(f"exact oracle: {what} did not round uniquely within {MAX_BITS} bits")


def certified_lse(row: RowLSE, first_bits: int) -> float:
    """``M + log S`` correctly rounded to float64."""
    if row.exact and row.max_count == 1:
        return row.max
    m = from_float(row.max)
    for bits in precisions(first_bits):
        log_s = row.log_interval(bits)
        lo, hi = Interval(mpf_add(m, log_s.lo, 0), mpf_add(m, log_s.hi, 0)).rounded()
        if not same_float(lo, hi):
            continue
        if lo != 0.0:
            return lo
        # A zero result: LSE > M, so it is positive when M >= 0; otherwise the
        # sign is settled once the interval excludes zero.
        if row.max >= 0.0:
            return 0.0
        if mpf_cmp(mpf_add(m, log_s.hi, 0), ZERO) < 0:
            return -0.0
        if mpf_cmp(mpf_add(m, log_s.lo, 0), ZERO) > 0:
            return 0.0
    raise _no_convergence("log-sum-exp")


def certified_selected(row: RowLSE, target_value: float, first_bits: int) -> float:
    """``target_value - M - log S`` correctly rounded, for a finite target value."""
    shifted = exact_diff(target_value, row.max)
    exactly_zero = row.exact and row.max_count == 1
    for bits in precisions(first_bits):
        log_s = row.log_interval(bits)
        lo, hi = Interval(mpf_sub(shifted, log_s.hi, 0), mpf_sub(shifted, log_s.lo, 0)).rounded()
        if same_float(lo, hi):
            # The value is <= 0, and zero only when S == 1 and the target is the max.
            return lo if lo != 0.0 else (0.0 if exactly_zero else -0.0)
    raise _no_convergence("selected log-probability")


def divided(iv: Interval, scale: float, bits: int) -> Interval:
    """An interval holding ``q / scale`` for ``q`` in ``iv`` and a positive float ``scale``."""
    if scale == 1.0:
        return iv
    t = from_float(scale)
    wp = bits + _EXP_GUARD
    lo = widen(mpf_div(iv.lo, t, wp, "f"), wp, up=False)
    hi = widen(mpf_div(iv.hi, t, wp, "c"), wp, up=True)
    return Interval(lo, hi)


def underflow_cutoff(base: float, scale: float) -> float:
    """Differences ``d`` below this give results that round to zero even after ``/ scale``."""
    return base + min(0.0, math.log(scale))


def certified_probabilities(
    row: RowLSE, target_index: int | None, first_bits: int, scale: float = 1.0
) -> tuple[FloatArray, float | None]:
    """``-exp(v - LSE) / scale`` for each distinct value ``v`` of the row, correctly rounded.

    Also returns ``(1 - exp(values[target_index] - LSE)) / scale`` correctly
    rounded when ``target_index`` is given (the gradient at the target column).
    ``scale`` is the fp32 temperature (the chain rule's ``1 / T``), taken exactly.
    """
    neg_q = np.full(len(row.counts), -0.0)
    cutoff = underflow_cutoff(UNDERFLOW_D, scale)
    pending = set(np.flatnonzero(row.approx_d >= cutoff).tolist())
    target_grad: float | None = None
    if target_index is not None and row.approx_d[target_index] < cutoff:
        # 1 - p with p < 2**-1095: the quotient rounds as 1 / scale does, and
        # IEEE float64 division rounds that correctly.
        target_grad = 1.0 / scale
    need_target = target_index is not None and target_grad is None
    for bits in precisions(first_bits):
        if not pending and not need_target:
            break
        s = row.sum_interval(bits)
        for i in sorted(pending):
            q_lo, q_hi = divided(row.quotient_interval(i, s, bits), scale, bits).rounded()
            if same_float(q_lo, q_hi):
                neg_q[i] = -q_lo  # -q < 0, so a zero here is -0.0
                pending.discard(i)
        if need_target and target_index is not None:
            q = row.quotient_interval(target_index, s, bits)
            one_minus = Interval(mpf_sub(ONE, q.hi, 0), mpf_sub(ONE, q.lo, 0))
            lo, hi = divided(one_minus, scale, bits).rounded()
            if same_float(lo, hi):
                target_grad = lo
                need_target = False
    if pending or need_target:
        raise _no_convergence("softmax probability")
    return neg_q, target_grad


def finite_part(live: FloatArray) -> tuple[str | None, FloatArray]:
    """Classify a row's live values: ``("nan"|"inf"|"empty", ...)`` or ``(None, finite)``."""
    if np.isnan(live).any():
        return "nan", live
    if (live == math.inf).any():
        return "inf", live
    finite = live[live > -math.inf]
    if finite.size == 0:
        return "empty", finite
    return None, finite
