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
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tp_logprob.oracle._entropy_error import entropy_error, ratio_upper
from tp_logprob.oracle._error_model import ErrorModel as ErrorModel  # public here, as before
from tp_logprob.oracle._inputs import format_name
from tp_logprob.oracle.formats import FORMATS, U32, U64

_FP32_OVERFLOW = float(np.finfo(np.float32).max) * (1.0 + 2.0**-25)


@runtime_checkable
class SummationOrder(Protocol):
    """What a bound reads from a declared accumulation order
    (:class:`tp_logprob.accumulation.AccumulationOrder`)."""

    @property
    def is_any(self) -> bool:
        """Whether nothing is declared (any order)."""

    def additions(self, width: int) -> int:
        """The most additions on one column's path to a shard's sum of ``width`` columns."""

    def rescales(self, width: int) -> int:
        """The most rescalings on one column's path, the merge's included."""

    def fraction_bits(self, padded_vocab_size: int) -> int | None:
        """The fixed-point fractional bits, or None for a floating-point sum."""

    def describe(self) -> str:
        """The order in words."""


@dataclass(frozen=True)
class LogprobTolerance:
    """Absolute bounds on ``|kernel - exact|`` for fp32 ``lse``, ``selected_logp`` and entropy.

    Built by :func:`tolerance`. :meth:`lse_bound`, :meth:`selected_bound` and
    :meth:`entropy_bound` take the exact (oracle) values, because the bounds grow
    with their magnitudes; :meth:`violations` applies them row by row, special
    values included. ``order`` is the accumulation order the bounds assume (None: any).
    """

    dtype: str
    vocab_size: int
    num_shards: int
    model: ErrorModel = field(repr=False)
    order: SummationOrder | None = None

    @property
    def sum_rel(self) -> float:
        """Bound on the relative error of the computed sum ``S``."""
        return self.model.sum_rel()

    def lse_bound(self, lse: ArrayLike, *, row_max: ArrayLike | None = None) -> NDArray[np.float64]:
        """Bound on ``|lse_kernel - lse_exact|`` for each row (``lse`` = exact values)."""
        e = np.asarray(lse, dtype=np.float64)
        bound = self.model.lse_error(e, self.model.log_sum_upper(e, row_max))
        return np.asarray(bound + U64 * np.abs(e), dtype=np.float64)

    def selected_bound(
        self, selected: ArrayLike, lse: ArrayLike, *, row_max: ArrayLike | None = None
    ) -> NDArray[np.float64]:
        """Bound on ``|selected_kernel - selected_exact|`` for each active token."""
        s = np.asarray(selected, dtype=np.float64)
        e = np.asarray(lse, dtype=np.float64)
        log_sum = self.model.log_sum_upper(e, row_max)
        bound = self.model.selected_error(s, e, log_sum) + U64 * np.abs(s)
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
        bound = entropy_error(self.model, h, log_sum, rho) + U64 * np.abs(h)
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
    rescales: int | None = None,
    exp_ulp: float = 3.0,
    log_ulp: float = 4.0,
    log_abs: float = 2.0**-22,
    fixed_point_bits: int | None = None,
    order: SummationOrder | None = None,
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
    (see :class:`ErrorModel`; default 1, or the declared order's), and
    ``fixed_point_bits`` selects the exact integer-sum model.

    ``order`` is how each shard is summed
    (:class:`tp_logprob.accumulation.AccumulationOrder`; None: any order): a
    declared order shortens a column's path of additions from ``max_shard_size - 1``
    to the order's, an online softmax adds its rescalings, and a ``fixed_point``
    order is the integer-sum model (its ``bits`` None: ``62 - bitlength(vocab_size - 1)``).

    >>> tol = tolerance("bf16", 32000, num_shards=8)
    >>> print(f"{tol.lse_bound([12.0])[0]:.2e}")
    1.92e-03
    >>> from tp_logprob.accumulation import AccumulationOrder
    >>> tree = tolerance("bf16", 32000, num_shards=8, max_shard_size=4000,
    ...                  order=AccumulationOrder.tree())
    >>> print(f"{tree.lse_bound([12.0])[0]:.2e}")
    9.66e-06
    """
    name = format_name(dtype, ("bf16", "fp16", "fp32"))
    n = _positive_int(vocab_size, "vocab_size", allow_zero=True)
    shards = _positive_int(num_shards, "num_shards")
    widest = None if max_shard_size is None else _positive_int(max_shard_size, "max_shard_size")
    hops = None if rescales is None else _positive_int(rescales, "rescales", allow_zero=True)
    for label, value in (("exp_ulp", exp_ulp), ("log_ulp", log_ulp), ("log_abs", log_abs)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{label}={value!r} must be a finite number >= 0")
    if fixed_point_bits is not None:
        fixed_point_bits = _positive_int(fixed_point_bits, "fixed_point_bits")
    if order is not None and not isinstance(order, SummationOrder):
        raise TypeError(f"order={order!r} must be an AccumulationOrder or None")
    path, hops, fixed_point_bits = _declared(order, min(n, widest or n), hops, fixed_point_bits)
    model = ErrorModel(
        unit=U32,
        # k ulp of the exact result is at most 2k u relative.
        exp_rel=2.0 * exp_ulp * U32,
        # fl(x - m), then fl(d * log2(e)) when exp is computed as exp2.
        arg_rel=(1.0 + U32) ** 2 - 1.0,
        # k ulp, plus one rounding when log is computed as log2(S) * ln 2.
        log_rel=2.0 * log_ulp * U32 + U32,
        log_abs=float(log_abs),
        tiny=FORMATS["fp32"].smallest_normal,
        num_values=n,
        num_shards=shards,
        max_shard_values=widest,
        rescales=hops,
        fixed_point_bits=fixed_point_bits,
        shard_additions=path,
    )
    return LogprobTolerance(dtype=name, vocab_size=n, num_shards=shards, model=model, order=order)


def _declared(
    order: SummationOrder | None, width: int, rescales: int | None, bits: int | None
) -> tuple[int | None, int, int | None]:
    """``(shard additions, rescales, fixed-point bits)`` of ``order`` on shards of ``width``
    live columns; the any order leaves the additions to the shard width."""
    if order is None or order.is_any:
        return None, 1 if rescales is None else rescales, bits
    declared_bits = order.fraction_bits(width)
    if bits is not None and declared_bits is not None and bits != declared_bits:
        raise ValueError(
            f"fixed_point_bits={bits!r}: the order {order.describe()!r} says {declared_bits}"
        )
    if bits is not None and declared_bits is None:
        raise ValueError(
            f"fixed_point_bits={bits!r}: the order {order.describe()!r} is not fixed_point"
        )
    hops = order.rescales(width) if rescales is None else max(rescales, order.rescales(width))
    return order.additions(width), hops, bits if declared_bits is None else declared_bits


def _positive_int(value: Any, label: str, *, allow_zero: bool = False) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{label}={value!r} must be an int")
    low = 0 if allow_zero else 1
    if int(value) < low:
        raise ValueError(f"{label}={value!r} must be >= {low}")
    return int(value)
