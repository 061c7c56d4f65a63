"""The rounding model of one max-shifted log-sum-exp evaluation, shared by every bound.

:class:`ErrorModel` describes a working format and its ``exp``/``log`` errors;
:mod:`tp_logprob.oracle.tolerance` builds one for fp32 kernels,
:mod:`tp_logprob.oracle.reference` one for the float64 reference, and
:mod:`tp_logprob.oracle._entropy_error` adds the entropy's terms to either. The
derivation is in ``docs/tolerances.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tp_logprob.oracle.formats import U64

# Final safety factor for the float64 evaluation of a bound itself.
SLACK = 1.0 + 2.0**-30


def pow_minus_one(base_excess: float, power: float) -> float:
    """``(1 + base_excess) ** power - 1`` without cancellation."""
    return math.expm1(power * math.log1p(base_excess))


@dataclass(frozen=True)
class ErrorModel:
    """Rounding model of one max-shifted log-sum-exp evaluation.

    ``unit`` is the unit roundoff of the working format. ``exp_rel`` and
    ``log_rel`` bound the relative error of one ``exp`` / ``log`` call;
    ``arg_rel`` bounds the relative perturbation of each ``exp`` argument
    ``x - m`` (its subtraction, plus a scaling by ``log2(e)`` when exp is lowered
    to ``exp2``); ``log_abs`` is an extra absolute error of ``log`` near 1;
    ``tiny`` is the absolute error of one underflowing operation (flush to zero
    included). ``rescales`` is the largest number of ``exp(m_old - m_new)``
    rescalings on any column's path to ``S`` (1 for shard partials merged once;
    ``blocks + 1`` for an online softmax over blocks). ``shard_additions`` is the
    most additions on a column's path inside its shard (None: any order, one fewer
    than the widest shard's columns; :class:`tp_logprob.accumulation.AccumulationOrder`
    gives it for a declared order); the merge adds ``num_shards - 1``. With
    ``fixed_point_bits`` the terms ``exp(x - M)`` are quantised to that many
    fractional bits and summed exactly.
    """

    unit: float
    exp_rel: float
    arg_rel: float
    log_rel: float
    log_abs: float
    tiny: float
    num_values: int
    num_shards: int = 1
    max_shard_values: int | None = None
    rescales: int = 1
    fixed_point_bits: int | None = None
    shard_additions: int | None = None

    def additions(self) -> int:
        """The most fp32 additions on one column's path to ``S``: its shard's, then the merge's."""
        if self.shard_additions is None:
            n = max(self.num_values, 1)
            widest = n if self.max_shard_values is None else min(n, self.max_shard_values)
            return max(widest, 1) + self.num_shards - 2
        return self.shard_additions + self.num_shards - 1

    def sum_rel(self) -> float:
        """``theta_S``: a bound on ``|S_hat / S - 1|`` (``S >= 1`` is used throughout)."""
        n, u = max(self.num_values, 1), self.unit
        if self.fixed_point_bits is None:
            # Each column's term passes through one exp, `rescales` exp+product
            # pairs and at most `additions()` additions.
            rel = (1.0 + self.exp_rel) ** (self.rescales + 1) * (
                1.0 + pow_minus_one(u, self.rescales + self.additions())
            ) - 1.0
            quantisation = 0.0
        else:
            rel = (1.0 + self.exp_rel) * (1.0 + u) ** 2 - 1.0
            quantisation = n * 2.0**-self.fixed_point_bits * (1.0 + u) ** 2
        argument = self._argument_error(n) * (1.0 + rel)
        underflow = (n * (self.rescales + 1) + self.num_shards) * 2.0 * self.tiny
        return (rel + argument + quantisation + underflow) * SLACK

    def _argument_error(self, n: int) -> float:
        """Bound on ``sum_i |exp(d_i + eta_i) - exp(d_i)| / S`` with ``|eta_i| <= a |d_i|``.

        The perturbations along one column's path add up to at most ``a |x - M|``
        because every shift has the same sign. With ``t = |d|``,
        ``f(t) = e^-t (e^(a t) - 1) <= a t e^(-(1 - a) t)``, whose maximum is
        ``a / ((1 - a) e)``: that gives ``n a / ((1 - a) e)``. For ``n >= 3`` split
        at ``T = log n``: terms with ``t <= T`` add at most
        ``a T n^a sum e^-t <= a T n^a (S - 1)``; each of the other (at most ``n``)
        terms is at most ``a T n^(a-1)`` since ``f`` decreases past
        ``1 / (1 - a) <= T``. So the total is at most ``a log(n) n^a S``.
        """
        a = self.arg_rel
        crude = n * a / ((1.0 - a) * math.e)
        if n < 3:
            return crude
        return min(crude, a * math.log(n) * math.pow(n, a))

    def log_sum_error(self, log_sum: NDArray[np.float64]) -> NDArray[np.float64]:
        """``Delta_L``: a bound on ``|L_hat - L|`` given (an upper bound on) ``L = log S``."""
        theta = self.sum_rel()
        lam = math.inf if theta >= 1.0 else -math.log1p(-theta)
        return (lam + self.log_rel * (log_sum + lam) + self.log_abs) * SLACK

    def lse_error(
        self, lse: NDArray[np.float64], log_sum: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """A bound on ``|lse_computed - lse_true|``."""
        delta = self.log_sum_error(log_sum)
        return (delta + self.unit * (np.abs(lse) + delta)) * SLACK

    def selected_error(
        self, selected: NDArray[np.float64], lse: NDArray[np.float64], log_sum: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """A bound on ``|selected_computed - selected_true|``, for either evaluation order.

        ``x_t - lse_k`` (as ``torch.logsumexp`` users do) is off by at most
        ``E_lse + u (|sel| + E_lse)``; ``(x_t - M) - L_hat`` (torch's CUDA
        ``log_softmax`` epilogue) by at most ``u |x_t - M| + Delta_L + u (|sel| +
        u |x_t - M| + Delta_L)`` with ``|x_t - M| <= |sel| + L``. The bound is the
        larger of the two.
        """
        u = self.unit
        sel = np.abs(selected)
        e_lse = self.lse_error(lse, log_sum)
        via_lse = e_lse + u * (sel + e_lse)
        delta = self.log_sum_error(log_sum)
        shifted = u * (sel + log_sum)
        via_shift = shifted + delta + u * (sel + shifted + delta)
        return np.maximum(via_lse, via_shift) * SLACK

    def log_sum_upper(
        self, lse: NDArray[np.float64], row_max: ArrayLike | None
    ) -> NDArray[np.float64]:
        """An upper bound on ``L = LSE - M``: ``log n``, or tighter from ``row_max``."""
        cap = math.log(max(self.num_values, 1))
        if row_max is None:
            return np.full(np.shape(lse), cap)
        m = np.asarray(row_max, dtype=np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            approx = (lse - m) + 4.0 * U64 * (np.abs(lse) + np.abs(m))
        return np.where(np.isfinite(approx), np.minimum(approx, cap), cap)
