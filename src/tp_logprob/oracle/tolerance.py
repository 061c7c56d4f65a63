"""Tolerance table: sound error bounds for fp32 ``selected_logp`` and ``lse``.

A backend output is compared with the exact oracle (correctly rounded float64)
through absolute bounds that depend on the live vocabulary size ``n``, the
sharding and the magnitudes of ``lse`` and ``selected_logp``. The derivation is
in ``docs/tolerances.md`` (after Blanchard, Higham & Higham 2021); in short, for
the max-shifted algorithm with fp32 unit roundoff ``u = 2^-24``:

* ``S_hat = S (1 + theta)`` with ``|theta| <= theta_S`` (:attr:`LogprobTolerance.sum_rel`),
  from exp errors, the argument rounding of each ``exp(x - m)``, any-order
  summation and the shard merge;
* ``|L_hat - L| <= Delta_L = lambda + e_log (L + lambda) + a_log`` with
  ``lambda = -log(1 - theta_S)`` and ``L = LSE - M <= log n``;
* ``|lse_k - lse| <= Delta_L + u (|lse| + Delta_L) + 2^-53 |lse|``;
* ``|sel_k - sel| <= E_lse + u (|sel| + E_lse) + 2^-53 |sel|`` for ``x_t - lse_k``,
  or the bound of :meth:`ErrorModel.selected_error` for ``(x_t - M) - L_hat``
  (the larger of the two is used).

The ``2^-53`` terms cover the oracle's own rounding to float64. The fp32
entropy bound (:meth:`LogprobTolerance.entropy_bound`) uses the same model for
``S`` and adds the rounding of ``Q = sum exp(d) d``; its derivation is the
section "Entropy" of ``docs/tolerances.md``. Temperature needs no term of its
own: every bound is for ``z = fp32(x) / fp32(T)``, the oracle's exact input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tp_logprob.oracle._entropy_error import entropy_error, ratio_upper
from tp_logprob.oracle._inputs import format_name

_U32 = 2.0**-24
_U64 = 2.0**-53
# Final safety factor for the float64 evaluation of the bound itself.
_SLACK = 1.0 + 2.0**-30
_FP32_OVERFLOW = float(np.finfo(np.float32).max) * (1.0 + 2.0**-25)


def _pow_minus_one(base_excess: float, power: float) -> float:
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
    ``blocks + 1`` for an online softmax over blocks). With ``fixed_point_bits``
    the terms ``exp(x - M)`` are quantised to that many fractional bits and
    summed exactly.
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

    def sum_rel(self) -> float:
        """``theta_S``: a bound on ``|S_hat / S - 1|`` (``S >= 1`` is used throughout)."""
        n, u = max(self.num_values, 1), self.unit
        if self.fixed_point_bits is None:
            widest = n if self.max_shard_values is None else min(n, self.max_shard_values)
            additions = max(widest, 1) + self.num_shards - 2
            # Each column's term passes through one exp, `rescales` exp+product
            # pairs and at most `additions` additions (any summation order).
            rel = (1.0 + self.exp_rel) ** (self.rescales + 1) * (
                1.0 + _pow_minus_one(u, self.rescales + additions)
            ) - 1.0
            quantisation = 0.0
        else:
            rel = (1.0 + self.exp_rel) * (1.0 + u) ** 2 - 1.0
            quantisation = n * 2.0**-self.fixed_point_bits * (1.0 + u) ** 2
        argument = self._argument_error(n) * (1.0 + rel)
        underflow = (n * (self.rescales + 1) + self.num_shards) * 2.0 * self.tiny
        return (rel + argument + quantisation + underflow) * _SLACK

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
        return (lam + self.log_rel * (log_sum + lam) + self.log_abs) * _SLACK

    def lse_error(
        self, lse: NDArray[np.float64], log_sum: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """A bound on ``|lse_computed - lse_true|``."""
        delta = self.log_sum_error(log_sum)
        return (delta + self.unit * (np.abs(lse) + delta)) * _SLACK

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
        return np.maximum(via_lse, via_shift) * _SLACK

    def log_sum_upper(
        self, lse: NDArray[np.float64], row_max: ArrayLike | None
    ) -> NDArray[np.float64]:
        """An upper bound on ``L = LSE - M``: ``log n``, or tighter from ``row_max``."""
        cap = math.log(max(self.num_values, 1))
        if row_max is None:
            return np.full(np.shape(lse), cap)
        m = np.asarray(row_max, dtype=np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            approx = (lse - m) + 4.0 * _U64 * (np.abs(lse) + np.abs(m))
        return np.where(np.isfinite(approx), np.minimum(approx, cap), cap)


@dataclass(frozen=True)
class LogprobTolerance:
    """Absolute bounds on ``|kernel - exact|`` for fp32 ``lse``, ``selected_logp`` and entropy.

    Built by :func:`tolerance`. :meth:`lse_bound`, :meth:`selected_bound` and
    :meth:`entropy_bound` take the exact (oracle) values, because the bounds grow
    with their magnitudes; :meth:`violations` applies them row by row, special
    values included.
    """

    dtype: str
    vocab_size: int
    num_shards: int
    model: ErrorModel = field(repr=False)

    @property
    def sum_rel(self) -> float:
        """Bound on the relative error of the computed sum ``S``."""
        return self.model.sum_rel()

    def lse_bound(self, lse: ArrayLike, *, row_max: ArrayLike | None = None) -> NDArray[np.float64]:
        """Bound on ``|lse_kernel - lse_exact|`` for each row (``lse`` = exact values)."""
        e = np.asarray(lse, dtype=np.float64)
        bound = self.model.lse_error(e, self.model.log_sum_upper(e, row_max))
        return np.asarray(bound + _U64 * np.abs(e), dtype=np.float64)

    def selected_bound(
        self, selected: ArrayLike, lse: ArrayLike, *, row_max: ArrayLike | None = None
    ) -> NDArray[np.float64]:
        """Bound on ``|selected_kernel - selected_exact|`` for each active token."""
        s = np.asarray(selected, dtype=np.float64)
        e = np.asarray(lse, dtype=np.float64)
        log_sum = self.model.log_sum_upper(e, row_max)
        bound = self.model.selected_error(s, e, log_sum) + _U64 * np.abs(s)
        return np.asarray(bound, dtype=np.float64)

    def entropy_bound(
        self,
        entropy: ArrayLike,
        *,
        lse: ArrayLike | None = None,
        row_max: ArrayLike | None = None,
    ) -> NDArray[np.float64]:
        """Bound on ``|entropy_kernel - entropy_exact|`` for each row (``entropy`` = exact).

        ``entropy`` holds the exact finite entropies. ``lse`` (the exact lse) and
        ``row_max`` (the row's maximum live ``z``), given together, tighten the
        bound through ``log S = lse - row_max``; otherwise ``log S <= min(H, log n)``.
        The model covers per-shard partials merged once, an online softmax with
        rescaled per-lane accumulators (``rescales``) and the fixed-point sums
        (``fixed_point_bits``), with the final ``log S - Q / S`` formed in float64
        and rounded once to fp32 (``docs/tolerances.md``, "Entropy").

        >>> tol = tolerance("bf16", 32000, num_shards=8)
        >>> print(f"{tol.entropy_bound([3.5])[0]:.2e}")
        1.53e-02
        """
        h = np.asarray(entropy, dtype=np.float64)
        log_sum, rho = ratio_upper(self.model, h, lse, row_max)
        bound = entropy_error(self.model, h, log_sum, rho) + _U64 * np.abs(h)
        return np.asarray(bound, dtype=np.float64)

    def violations(
        self,
        kernel_selected: ArrayLike,
        kernel_lse: ArrayLike,
        exact_selected: ArrayLike,
        exact_lse: ArrayLike,
        *,
        row_max: ArrayLike | None = None,
        active_mask: ArrayLike | None = None,
        kernel_entropy: ArrayLike | None = None,
        exact_entropy: ArrayLike | None = None,
    ) -> NDArray[np.bool_]:
        """Rows where the kernel is out of tolerance (True = violation).

        Exact NaN and infinities must be matched exactly; a finite exact value
        accepts a kernel value within the bound, or an fp32 overflow to the
        infinity of the same sign when the bound reaches past the fp32 range.
        Inactive tokens (``active_mask`` False) must have ``selected`` exactly 0.
        With ``kernel_entropy`` and ``exact_entropy`` (given together) the
        entropy is judged too, by :meth:`entropy_bound` (tightened by the exact
        lse and ``row_max`` when ``row_max`` is given), and inactive tokens must
        have entropy exactly 0.
        """
        entropy_bad = self._entropy_violations(
            kernel_entropy, exact_entropy, exact_lse, row_max, active_mask
        )
        es = np.asarray(exact_selected, dtype=np.float64)
        el = np.asarray(exact_lse, dtype=np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            lse_bad = ~within_tolerance(
                np.asarray(kernel_lse, np.float64), el, self.lse_bound(el, row_max=row_max)
            )
            finite_lse = np.where(np.isfinite(el), el, 0.0)
            sel_bound = self.selected_bound(
                np.where(np.isfinite(es), es, 0.0), finite_lse, row_max=row_max
            )
            sel_bad = ~within_tolerance(np.asarray(kernel_selected, np.float64), es, sel_bound)
        if active_mask is not None:
            active = np.asarray(active_mask, dtype=np.bool_)
            ks = np.asarray(kernel_selected, np.float64)
            sel_bad = np.where(active, sel_bad, ks != 0.0)
        return np.asarray(lse_bad | sel_bad | entropy_bad, dtype=np.bool_)

    def _entropy_violations(
        self,
        kernel_entropy: ArrayLike | None,
        exact_entropy: ArrayLike | None,
        exact_lse: ArrayLike,
        row_max: ArrayLike | None,
        active_mask: ArrayLike | None,
    ) -> NDArray[np.bool_] | bool:
        if kernel_entropy is None and exact_entropy is None:
            return False
        if kernel_entropy is None or exact_entropy is None:
            raise ValueError("kernel_entropy and exact_entropy must be given together")
        ke = np.asarray(kernel_entropy, np.float64)
        eh = np.asarray(exact_entropy, np.float64)
        finite = np.isfinite(eh)
        h = np.where(finite, eh, 0.0)
        with np.errstate(invalid="ignore", over="ignore"):
            if row_max is None:
                bound = self.entropy_bound(h)
            else:
                el = np.asarray(exact_lse, np.float64)
                m = np.asarray(row_max, np.float64)
                usable = np.isfinite(el) & np.isfinite(m)
                bound = self.entropy_bound(
                    h, lse=np.where(usable, el, np.inf), row_max=np.where(usable, m, 0.0)
                )
            bad = ~within_tolerance(ke, eh, bound)
        if active_mask is not None:
            bad = np.where(np.asarray(active_mask, dtype=np.bool_), bad, ke != 0.0)
        return np.asarray(bad, dtype=np.bool_)


def within_tolerance(
    kernel: NDArray[np.float64], exact: NDArray[np.float64], bound: NDArray[np.float64]
) -> NDArray[np.bool_]:
    """Elementwise: equal special values, or finite and ``|kernel - exact| <= bound``.

    An fp32 result that overflowed to an infinity of the right sign counts as
    within when the exact value plus the bound reaches fp32's overflow threshold.
    """
    same_special = (np.isnan(exact) & np.isnan(kernel)) | (np.isinf(exact) & (kernel == exact))
    finite = np.isfinite(exact)
    close = finite & np.isfinite(kernel) & (np.abs(kernel - exact) <= bound)
    overflow = (
        finite
        & np.isinf(kernel)
        & (np.sign(kernel) == np.sign(exact))
        & (np.abs(exact) + bound >= _FP32_OVERFLOW)
    )
    return np.asarray(same_special | close | overflow, dtype=np.bool_)


def tolerance(
    dtype: Any,
    vocab_size: int,
    *,
    num_shards: int = 1,
    max_shard_size: int | None = None,
    rescales: int = 1,
    exp_ulp: float = 3.0,
    log_ulp: float = 4.0,
    log_abs: float = 2.0**-22,
    fixed_point_bits: int | None = None,
) -> LogprobTolerance:
    """The tolerance for an fp32 backend on ``vocab_size`` live columns.

    ``dtype`` is the input dtype (``"bf16"``, ``"fp16"``, ``"fp32"`` or a numpy
    dtype); inputs are exact, so it only labels the result. Defaults assume
    ``exp`` within 3 ulp and ``log`` within 4 ulp of the exact result (numpy's
    SIMD float32 exp/log measure 2.54 and 3.05 ulp; PTX ``ex2.approx.f32`` is
    within 2 ulp of correctly rounded), an extra absolute ``2^-22`` for
    ``lg2.approx``-based logs near 1, and an exp argument scaled by ``log2(e)``.
    ``num_shards`` is the number of vocabulary shards merged (the TP degree),
    ``max_shard_size`` the most columns in one shard (default ``vocab_size``; the
    summation bound grows with it), ``rescales`` the exp-rescalings per column
    (see :class:`ErrorModel`), and ``fixed_point_bits`` selects the exact
    integer-sum model.

    >>> tol = tolerance("bf16", 32000, num_shards=8)
    >>> print(f"{tol.lse_bound([12.0])[0]:.2e}")
    1.92e-03
    """
    name = format_name(dtype, ("bf16", "fp16", "fp32"))
    n = _positive_int(vocab_size, "vocab_size", allow_zero=True)
    shards = _positive_int(num_shards, "num_shards")
    widest = None if max_shard_size is None else _positive_int(max_shard_size, "max_shard_size")
    hops = _positive_int(rescales, "rescales", allow_zero=True)
    for label, value in (("exp_ulp", exp_ulp), ("log_ulp", log_ulp), ("log_abs", log_abs)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{label}={value!r} must be a finite number >= 0")
    if fixed_point_bits is not None:
        fixed_point_bits = _positive_int(fixed_point_bits, "fixed_point_bits")
    model = ErrorModel(
        unit=_U32,
        # k ulp of the exact result is at most 2k u relative.
        exp_rel=2.0 * exp_ulp * _U32,
        # fl(x - m), then fl(d * log2(e)) when exp is computed as exp2.
        arg_rel=(1.0 + _U32) ** 2 - 1.0,
        # k ulp, plus one rounding when log is computed as log2(S) * ln 2.
        log_rel=2.0 * log_ulp * _U32 + _U32,
        log_abs=float(log_abs),
        tiny=2.0**-126,
        num_values=n,
        num_shards=shards,
        max_shard_values=widest,
        rescales=hops,
        fixed_point_bits=fixed_point_bits,
    )
    return LogprobTolerance(dtype=name, vocab_size=n, num_shards=shards, model=model)


def _positive_int(value: Any, label: str, *, allow_zero: bool = False) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{label}={value!r} must be an int")
    low = 0 if allow_zero else 1
    if int(value) < low:
        raise ValueError(f"{label}={value!r} must be >= {low}")
    return int(value)
