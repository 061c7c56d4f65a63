"""The fused LM head's ground truth: exact logits from hidden states and a weight, and the
error a fp32 dot product may add.

With ``input_kind="hidden"`` a kernel forms ``x[t, v] = sum_i hidden[t, i] * W[v, i]
(+ bias[v])`` itself, in fp32, so its ``x`` is not the exact one. The oracle
pipeline is:

1. ``x = exact_hidden_logits(hidden, W, bias)``: each element the exact real value
   correctly rounded to float64 (bf16, fp16 and fp32 values and their pairwise
   products are exact in float64; the sum is exact, then rounded once);
2. ``exact_selected_logprob(fp32(x), ...)`` (and ``exact_entropy``): exact with
   respect to the fp32-rounded logits, as on the logits path;
3. the kernel is within ``tolerance(...)`` of step 2 plus the effect of its own
   ``x`` being off: :func:`dot_product_error_bound` bounds ``|x_kernel - x|``,
   :func:`fused_extra_bounds` turns that into extra room for ``lse``,
   ``selected_logp`` and entropy (``docs/tolerances.md``, "Fused LM head").

Gradients: :func:`exact_hidden_grads`. Imports numpy only (never torch).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from tp_logprob.oracle import _fast_drivers as fast
from tp_logprob.oracle._fast_stats import enabled as fast_path_enabled
from tp_logprob.oracle._inputs import FloatArray, as_exact_array
from tp_logprob.oracle.exact import exact_entropy_grad, exact_logprob_grad
from tp_logprob.oracle.formats import FORMATS, U32, U64

__all__ = [
    "dot_product_error_bound",
    "exact_hidden_grads",
    "exact_hidden_logits",
    "fused_extra_bounds",
    "reference_hidden_logits",
]

_FP32_SUBNORMAL = FORMATS["fp32"].smallest_subnormal


def _operands(
    hidden: ArrayLike, weight: ArrayLike, bias: ArrayLike | None
) -> tuple[FloatArray, FloatArray, FloatArray | None]:
    """float64 copies of the operands, refusing values fp32 cannot hold exactly."""
    h = np.asarray(as_exact_array(hidden, "hidden", 2), dtype=np.float64)
    w = np.asarray(as_exact_array(weight, "weight", 2), dtype=np.float64)
    if h.shape[1] != w.shape[1]:
        raise ValueError(f"hidden has shape {h.shape} and weight {w.shape}: hidden sizes differ")
    b = None
    if bias is not None:
        b = np.asarray(as_exact_array(bias, "bias", 1), dtype=np.float64)
        if b.shape != (w.shape[0],):
            raise ValueError(f"bias has shape {b.shape}; expected ({w.shape[0]},)")
    for name, array in (("hidden", h), ("weight", w), ("bias", b)):
        if array is None:
            continue
        with np.errstate(over="ignore"):
            inexact = np.isfinite(array) & (array.astype(np.float32) != array)
        if inexact.any():
            raise ValueError(
                f"{name}: value {array[inexact][0]!r} is not an fp32 value; kernels take "
                "bf16, fp16 or fp32 operands, whose products float64 holds exactly"
            )
    return h, w, b


def _exact_sum(terms: FloatArray) -> float:
    """The exact sum of float64 ``terms`` correctly rounded; IEEE special values otherwise."""
    if np.isfinite(terms).all():
        return math.fsum(terms.tolist())  # correctly rounded for finite float64 inputs
    with np.errstate(invalid="ignore"):
        return float(np.sum(terms))


def exact_hidden_logits(
    hidden: ArrayLike, weight: ArrayLike, bias: ArrayLike | None = None
) -> FloatArray:
    """``x[t, v] = sum_i hidden[t, i] * weight[v, i] (+ bias[v])``, correctly rounded, ``[N, V]``.

    Operands must hold fp32 values (bf16, fp16 and fp32 do): each product is then
    exact in float64, and the exact sum is rounded once: by a vectorised pairwise
    sum that keeps its rounding errors when its bound settles the rounding, by
    ``math.fsum`` otherwise (the same value). A NaN or infinity among a row's terms
    gives the IEEE result of summing them.

    >>> exact_hidden_logits([[1.0, 2.0**-30]], [[1.0, 1.0]]).tolist()
    [[1.0000000009313226]]
    """
    h, w, b = _operands(hidden, weight, bias)
    out = np.empty((h.shape[0], w.shape[0]), dtype=np.float64)
    quick = fast_path_enabled()
    with np.errstate(invalid="ignore", over="ignore"):
        for t in range(h.shape[0]):
            products = w * h[t]  # [V, H], exact
            if b is not None:
                products = np.concatenate([products, b[:, None]], axis=1)
            pending: list[int] = list(range(w.shape[0]))
            if quick:
                out[t], ok = fast.exact_sums(products)
                pending = np.flatnonzero(~ok).tolist()
            for v in pending:
                out[t, v] = _exact_sum(products[v])
    return out


def reference_hidden_logits(
    hidden: ArrayLike, weight: ArrayLike, bias: ArrayLike | None = None
) -> tuple[FloatArray, FloatArray]:
    """``(x, bound)``: float64 matmul logits and a bound on ``|x - x_exact|``, ``[N, V]`` each.

    Products are exact in float64, so only the ``H - 1`` additions (``H`` with a
    bias) round: ``|x - x_exact| <= gamma_H(2^-53) * (sum_i |h_i w_i| + |b|)``
    in any summation order (Higham, *Accuracy and Stability*, eq. 3.5).
    """
    h, w, b = _operands(hidden, weight, bias)
    with np.errstate(invalid="ignore", over="ignore"):
        x = h @ w.T
        magnitude = np.abs(h) @ np.abs(w).T
        if b is not None:
            x = x + b
            magnitude = magnitude + np.abs(b)
    n = h.shape[1] + 1
    gamma = n * U64 / (1.0 - n * U64)
    return np.asarray(x, np.float64), np.asarray(gamma * magnitude * (1 + 4 * U64), np.float64)


def dot_product_error_bound(
    hidden: ArrayLike, weight: ArrayLike, bias: ArrayLike | None = None
) -> FloatArray:
    """Bound on ``|x_fp32 - x_exact|`` for a fp32 dot product in any order, ``[N, V]``.

    ``x_fp32`` is ``sum_i fl(h_i w_i)`` accumulated in fp32 in any order (FMA or
    not), then ``fl(. + b)`` with a bias; ``x_exact`` is the real value. With
    ``S = sum_i |h_i w_i|`` and ``u = 2^-24``::

        |x_fp32 - x_exact| <= gamma_H S                       (no bias)
                            <= gamma_H S (1 + u) + u |x_exact| (bias)

    plus ``(2H + 1) 2^-150`` for fp32 underflow, where ``gamma_H = H u / (1 - H u)``.
    Valid while nothing overflows fp32 (a kernel then returns a special value).
    The bound itself is computed in float64 and rounded up by a relative ``2^-50``.
    """
    h, w, b = _operands(hidden, weight, bias)
    size = h.shape[1]
    if size * U32 >= 1.0:
        raise ValueError(f"hidden size {size} too large for the gamma_H model (H u < 1)")
    gamma = size * U32 / (1.0 - size * U32)
    with np.errstate(invalid="ignore", over="ignore"):
        magnitude = np.abs(h) @ np.abs(w).T
        bound = gamma * magnitude
        if b is not None:
            x = exact_hidden_logits(hidden, weight, bias)
            bound = bound * (1.0 + U32) + U32 * np.abs(x)
        bound = bound * (1.0 + 2.0**-50) + (2 * size + 1) * _FP32_SUBNORMAL / 2
    return np.asarray(bound, dtype=np.float64)


def fused_extra_bounds(
    x_exact: ArrayLike,
    dot_bound: ArrayLike,
    targets: ArrayLike,
    *,
    real_vocab_size: int | None = None,
    temperature: float = 1.0,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Extra ``(lse, selected_logp, entropy)`` room, ``[N]`` each, for a kernel's own ``x``.

    The oracle works on ``z_o = fl(fp32(x) / T)``, the kernel on ``z_k = fl(x_k / T)``
    with ``|x_k - x| <= dot_bound``. Per column ``|z_k - z_o| <= D_v = ((d_v + u|x_v|)
    / T + 2u (|x_v| + d_v) / T) (1 + 2^-20)`` (the two divisions round only when
    ``T != 1``). LSE is 1-Lipschitz in the max norm, so ``lse`` moves by at most
    ``max_v D_v``, ``selected_logp`` by ``D_target + max_v D_v``, and entropy by
    ``2 log(n) max_v D_v`` (its gradient ``-p_v (z_v - LSE + H)`` has l1 norm at most
    ``2 H <= 2 log n`` at every point between the two). Live columns only.
    """
    x = np.asarray(x_exact, dtype=np.float64)
    d = np.asarray(dot_bound, dtype=np.float64)
    live = x.shape[1] if real_vocab_size is None else int(real_vocab_size)
    x, d = np.abs(x[:, :live]), d[:, :live]
    t32 = float(np.float32(temperature))
    rounding = 0.0 if t32 == 1.0 else 2.0 * U32
    with np.errstate(invalid="ignore", over="ignore"):
        column = ((d + U32 * x) / t32 + rounding * (x + d) / t32) * (1.0 + 2.0**-20)
        worst = column.max(axis=1) if live else np.zeros(x.shape[0])
        index = np.clip(np.asarray(targets, dtype=np.int64), 0, max(live - 1, 0))
        at_target = column[np.arange(x.shape[0]), index] if live else np.zeros(x.shape[0])
    entropy = 2.0 * math.log(max(live, 1)) * worst
    return worst, at_target + worst, entropy


def exact_hidden_grads(
    hidden: ArrayLike,
    weight: ArrayLike,
    targets: ArrayLike,
    *,
    bias: ArrayLike | None = None,
    active_mask: ArrayLike | None = None,
    real_vocab_size: int | None = None,
    temperature: float = 1.0,
    of: str = "selected_logp",
) -> tuple[FloatArray, FloatArray]:
    """``(d hidden [N, H], d weight [V, H])`` of ``sum_t out[t]``, ``out`` = ``of``.

    ``of`` is ``"selected_logp"`` or ``"entropy"``. ``G = d out / d x`` is the
    exact oracle gradient at ``fp32(exact_hidden_logits(...))``, each element
    correctly rounded to float64 (``exact_logprob_grad`` / ``exact_entropy_grad``).
    Then ``d hidden = G W`` and ``d weight = G^T hidden`` are each the exact real
    value of the sum of products of that rounded ``G`` with the inputs, correctly
    rounded once (rational arithmetic): exact given ``G``, so the only error
    against the true derivative is ``G``'s half ulp per element. Padding rows of
    ``weight`` (``>= real_vocab_size``) and inactive rows of ``hidden`` never enter:
    their gradient terms are exactly 0 whatever they hold. ``d hidden`` is the sum
    over every TP rank's partial; ``d weight`` row ``v`` is rank-local.
    """
    h, w, b = _operands(hidden, weight, bias)
    live = w.shape[0] if real_vocab_size is None else int(real_vocab_size)
    x = exact_hidden_logits(h[:, :], w[:live], None if b is None else b[:live])
    with np.errstate(over="ignore", invalid="ignore"):
        x32 = x.astype(np.float32).astype(np.float64)
    if of not in ("selected_logp", "entropy"):
        raise ValueError(f"of={of!r}: expected 'selected_logp' or 'entropy'")
    kwargs: dict[str, Any] = {"active_mask": active_mask, "temperature": temperature}
    if of == "selected_logp":
        g = exact_logprob_grad(x32, targets, **kwargs)
    else:
        g = exact_entropy_grad(x32, **kwargs)
    d_hidden = _exact_products(g, w[:live])  # [N, H] = G [N, V] @ W [V, H]
    d_weight = np.zeros_like(w)
    d_weight[:live] = _exact_products(g.T, h)  # [V, H] = G^T [V, N] @ hidden [N, H]
    return d_hidden, d_weight


def _exact_products(left: FloatArray, right: FloatArray) -> FloatArray:
    """``left @ right`` with every element the exact sum correctly rounded; zero terms skipped.

    A term whose ``left`` factor is exactly 0 is dropped, so NaN in ``right`` where
    the gradient is 0 (inactive rows, padding) never leaks in.
    """
    out = np.zeros((left.shape[0], right.shape[1]), dtype=np.float64)
    for row in range(left.shape[0]):
        used = np.nonzero(left[row])[0]
        for col in range(right.shape[1]):
            factors, values = left[row, used], right[used, col]
            if np.isfinite(factors).all() and np.isfinite(values).all():
                total = sum(
                    (Fraction(a) * Fraction(c) for a, c in zip(factors, values, strict=True)),
                    Fraction(0),
                )
                out[row, col] = float(total)  # Fraction -> float rounds correctly
            else:
                with np.errstate(invalid="ignore", over="ignore"):
                    out[row, col] = float(np.sum(factors * values))
    return out
