"""Error bound of one entropy evaluation under an :class:`ErrorModel` (``docs/tolerances.md``).

With ``d = z - M <= 0``, ``S = sum exp(d)``, ``P = -Q = sum exp(d) |d|``,
``L = log S`` and ``rho = P / S`` (so ``H = L + rho``, both parts ``>= 0``):

* ``S_hat = S (1 + theta)``, ``|theta| <= theta_S`` (:meth:`ErrorModel.sum_rel`);
* ``|P_hat - P| <= E_P S`` with ``E_P = rho Phi + arg (1 + Phi) + quant + under``:
  ``Phi`` bounds the rounding factors on one column's path (its exps, the
  subtraction and product of ``exp(d) d``, additions, rescalings), ``arg`` the
  exp-argument perturbations, ``quant`` the fixed-point truncation and ``under``
  the underflows;
* ``|P_hat / S_hat - rho| <= D = (E_P + rho theta_S) / (1 - theta_S)`` and
  ``|log S_hat - L| <= lambda = -log(1 - theta_S)``;
* the final ``log S - Q / S`` in float64 adds ``4 u64 (L + lambda + rho + D)`` and
  its rounding to the working format ``u (H + Delta) + tiny u``.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tp_logprob.oracle._error_model import SLACK, ErrorModel, pow_minus_one
from tp_logprob.oracle.formats import U64


def ratio_upper(
    model: ErrorModel,
    entropy: NDArray[np.float64],
    lse: ArrayLike | None,
    row_max: ArrayLike | None,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Upper bounds on ``L = log S`` and ``rho = P / S`` from the exact entropy.

    ``L <= min(H, log n)`` and ``rho <= H``; with ``lse`` and ``row_max`` (the
    exact lse and the row maximum) ``L`` is ``lse - row_max`` up to a margin of
    ``4 u64 (|lse| + |row_max|)``, and ``rho = H - L``.
    """
    if (lse is None) != (row_max is None):
        raise ValueError("lse and row_max must be given together (or neither)")
    h = np.abs(np.asarray(entropy, dtype=np.float64)) * (1.0 + 4.0 * U64)
    cap = math.log(max(model.num_values, 1))
    if lse is None or row_max is None:
        return np.minimum(h, cap), h
    e = np.asarray(lse, dtype=np.float64)
    m = np.asarray(row_max, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        approx = e - m
        margin = 4.0 * U64 * (np.abs(e) + np.abs(m))
        known = np.isfinite(approx) & np.isfinite(margin)
        upper = np.where(known, np.minimum(approx + margin, cap), cap)
        lower = np.where(known, np.maximum(approx - margin, 0.0), 0.0)
    return np.minimum(h, upper), np.maximum(h - lower, 0.0)


def _argument_error(n: int, a: float, rho: NDArray[np.float64]) -> NDArray[np.float64]:
    """Bound on ``sum_v |exp(d_v + eta_v) - exp(d_v)| |d_v| / S`` with ``|eta_v| <= a |d_v|``.

    With ``t = |d|``, ``g(t) = t e^-t (e^(a t) - 1) <= a t^2 e^(-(1 - a) t)``, at most
    ``4 a / ((1 - a)^2 e^2)`` each. For ``n >= 8`` split at ``T = log n >= 2 / (1 - a)``:
    terms with ``t <= T`` add at most ``a T n^a sum t e^-t = a T n^a P``; ``g``
    decreases past ``2 / (1 - a)``, so each other term adds at most
    ``a T^2 n^(a - 1)``. With ``S >= 1``: ``a log(n) n^a (rho + log n)``.
    """
    crude = n * 4.0 * a / ((1.0 - a) ** 2 * math.e**2)
    if n < 8:
        return np.full(np.shape(rho), crude)
    big_t = math.log(n)
    split = a * big_t * math.pow(n, a) * (rho + big_t)
    return np.minimum(crude, split)


def neg_q_error(model: ErrorModel, rho: NDArray[np.float64]) -> NDArray[np.float64]:
    """``E_P``: a bound on ``|P_hat - P| / S`` given (an upper bound on) ``rho = P / S``."""
    n, u = max(model.num_values, 1), model.unit
    hops = model.rescales
    if model.fixed_point_bits is None:
        additions = model.additions()
        # One exp per rescaling plus the column's own; the subtraction d = z - m,
        # the product exp(d) d, the additions, and per rescaling at most three
        # roundings (the shift m_old - m_new, its product with s, the addition to q
        # or the product with exp(m_old - m_new)) on any path into Q.
        phi = (1.0 + model.exp_rel) ** (hops + 1) * (
            1.0 + pow_minus_one(u, additions + 3 * hops + 2)
        ) - 1.0
        quantisation = 0.0
    else:
        # exp, the subtraction, the product and the conversion of the exact sum;
        # each term is truncated toward zero by less than 2^-K.
        phi = (1.0 + model.exp_rel) * (1.0 + u) ** 3 - 1.0
        quantisation = n * 2.0**-model.fixed_point_bits * (1.0 + u)
    argument = _argument_error(n, model.arg_rel, rho) * (1.0 + phi)
    # An underflowing exp or product errs by at most `tiny`, and exp(d) is 0
    # for |d| > 2 |log tiny| (fp32: 175 > 104; fp64: 1417 > 745).
    under_d = 2.0 * abs(math.log(model.tiny))
    underflow = (n * (hops + 2) + model.num_shards) * 2.0 * model.tiny * under_d
    return np.asarray(rho * phi + argument + quantisation + underflow, dtype=np.float64)


def entropy_error(
    model: ErrorModel,
    entropy: NDArray[np.float64],
    log_sum: NDArray[np.float64],
    rho: NDArray[np.float64],
) -> NDArray[np.float64]:
    """A bound on ``|entropy_computed - entropy_true|`` (module docstring)."""
    u = model.unit
    theta = model.sum_rel()
    if theta >= 1.0:
        return np.full(np.shape(entropy), math.inf)
    lam = -math.log1p(-theta)
    ratio_err = (neg_q_error(model, rho) + rho * theta) / (1.0 - theta)
    final64 = 4.0 * U64 * (log_sum + lam + rho + ratio_err)
    delta = lam + ratio_err + final64
    h = np.abs(entropy)
    bound = delta + u * (h + delta) + model.tiny * u
    return np.asarray(bound * SLACK, dtype=np.float64)
