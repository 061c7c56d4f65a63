"""How far an fp32 backend's support decisions may be from the exact rules.

Min-p and top-p compare masses (``docs/semantics.md``, "Processed logprobs"),
and a backend computes those masses in fp32: a token whose exact decision lies
within the backend's error of the boundary may land on either side.
:class:`SupportMargins` states that error for one contract, and
:func:`tp_logprob.oracle.classify_support` turns it into certainly in,
certainly out and borderline tokens. The derivation is the section
"Processed logprobs: the support" of ``docs/tolerances.md``; in short, with
``d = z - M``, ``e = exp(d)`` and ``u = 2^-24``:

* min-p: the backend compares some ``e_hat`` with some threshold ``t_hat``, where
  ``e exp(-a|d|)(1 - term_rel) - abs_error <= e_hat <= e exp(a|d|)(1 + term_rel) + abs_error``
  and ``min_p (1 - threshold_rel) - abs_error <= t_hat <= min_p (1 + threshold_rel) + abs_error``;
* top-p: the backend's decision variable (``A - p Z`` for the mass ``A`` above a
  token and the survivors' total ``Z``) is off by at most
  :meth:`SupportMargins.top_p_margin` ``* Z``, built from ``sum_rel``
  (``theta_S`` of the LSE's error model: any subset sum of the survivors is
  within ``theta_S Z`` of exact).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tp_logprob.oracle._error_model import SLACK, pow_minus_one
from tp_logprob.oracle.tolerance import tolerance

__all__ = ["SupportMargins", "support_margins"]


@dataclass(frozen=True)
class SupportMargins:
    """The error bounds of a backend's min-p and top-p mass comparisons.

    Built for a contract by :func:`support_margins`; :meth:`zero` is an exact
    backend (then :func:`~tp_logprob.oracle.classify_support` finds no
    borderline token). ``sum_rel`` bounds every computed subset sum of the
    survivors to ``sum_rel * Z``; ``term_rel``, ``arg_rel`` and ``abs_error`` bound a
    computed mass ``exp(d)`` (its rounding, its argument's relative
    perturbation, and an absolute part for underflow and fixed-point
    quantisation); ``threshold_rel`` and ``abs_error`` bound the computed
    min-p threshold; ``unit`` is the working format's unit roundoff.

    >>> SupportMargins.zero().top_p_margin(0.9)
    0.0
    """

    sum_rel: float
    term_rel: float
    arg_rel: float
    threshold_rel: float
    abs_error: float
    unit: float

    def __post_init__(self) -> None:
        for name in ("sum_rel", "term_rel", "arg_rel", "threshold_rel", "abs_error", "unit"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}={value!r} must be a finite number >= 0")

    @classmethod
    def zero(cls) -> SupportMargins:
        """No error at all: the certain sets are the exact support and its complement."""
        return cls(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)

    @property
    def min_p_exact(self) -> bool:
        """True when the min-p comparison has no error (no min-p token is borderline)."""
        return self.term_rel == self.arg_rel == self.threshold_rel == self.abs_error == 0.0

    def top_p_margin(self, top_p: float) -> float:
        """``mu``: the backend's top-p decision variable is within ``mu Z`` of ``A - p Z``.

        The larger of the two evaluations the model covers: ``A_hat < fl(fl(p) Z_hat)``
        (``theta + p ((1 + u)^2 (1 + theta) - 1)``) and vLLM's comparison of a cumulative
        sum of normalised probabilities with ``fl(1 - fl(p))``
        (``(2 theta + u (1 + theta)) / (1 - theta) + u (1 + u)``).
        """
        theta, u = self.sum_rel, self.unit
        if theta >= 1.0:
            return math.inf
        direct = theta + top_p * ((1.0 + u) ** 2 * (1.0 + theta) - 1.0)
        normalised = (2.0 * theta + u * (1.0 + theta)) / (1.0 - theta) + u * (1.0 + u)
        return max(direct, normalised) * SLACK


def support_margins(
    dtype: Any,
    vocab_size: int,
    *,
    num_shards: int = 1,
    max_shard_size: int | None = None,
    rescales: int = 1,
    exp_ulp: float = 3.0,
    fixed_point_bits: int | None = None,
) -> SupportMargins:
    """The support's error bounds for an fp32 backend on ``vocab_size`` live columns.

    The parameters are :func:`~tp_logprob.oracle.tolerance`'s, and the model is
    its model (``docs/tolerances.md``, "Processed logprobs: the support"): masses
    ``exp(fl(z - M))`` within ``exp_ulp`` ulps, sums in any order over
    ``num_shards`` shards (or exact fixed-point sums with ``fixed_point_bits``),
    ``rescales`` rescalings on a column's path, ``min_p`` and ``top_p`` rounded
    to fp32, and the comparisons formed on normalised probabilities or not.

    >>> margins = support_margins("bf16", 32000, num_shards=8, max_shard_size=4000)
    >>> print(f"{margins.top_p_margin(0.9):.2e}")
    4.82e-04
    """
    model = tolerance(
        dtype,
        vocab_size,
        num_shards=num_shards,
        max_shard_size=max_shard_size,
        rescales=rescales,
        exp_ulp=exp_ulp,
        fixed_point_bits=fixed_point_bits,
    ).model
    u = model.unit
    paths = model.rescales + 1  # the exps on a column's path, and as many roundings
    term_rel = pow_minus_one(model.exp_rel, paths) + pow_minus_one(u, paths) * (
        1.0 + pow_minus_one(model.exp_rel, paths)
    )
    quantum = 0.0 if model.fixed_point_bits is None else 2.0**-model.fixed_point_bits
    return SupportMargins(
        sum_rel=model.sum_rel(),
        term_rel=term_rel * SLACK,
        arg_rel=model.arg_rel * SLACK,
        threshold_rel=pow_minus_one(u, 3) * SLACK,
        abs_error=(2.0 * (model.num_values + 1) * model.tiny + quantum) * SLACK,
        unit=u,
    )
