"""Exact processed logprobs: the outputs over a given support ``S``, correctly rounded.

``docs/semantics.md``, "Processed logprobs": a column outside ``S`` counts as
padding does (``-inf``), so every output is the raw op's on the logits with
those columns set to ``-inf`` (:func:`support_masked_logits`), except ``lse``,
which stays the full vocabulary's. Setting ``x`` to ``-inf`` before the
temperature is the same as setting ``z`` after it (``-inf / T = -inf`` for any
``T > 0``), so the functions here run the exact oracle's functions on the masked
logits and are correctly rounded in the same way; with every live column in
``S`` they return the raw op's bits.

The suite judges a backend on the backend's own (admissible) support: pass
that mask here. A row whose recomputed support is undefined
(``exact_support(...).defined`` False) is marked with ``defined``: its
``selected_logp``, ``support_lse`` and entropy are NaN (inactive rows: ``0.0``
for ``selected_logp`` and entropy) and its gradients NaN on every live column.
Float64 references on a support are the ``reference_*`` functions on
:func:`support_masked_logits`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tp_logprob.oracle._inputs import (
    BoolArray,
    FloatArray,
    as_active_mask,
    as_exact_array,
    as_real_vocab_size,
    as_support_mask,
)
from tp_logprob.oracle.exact import (
    exact_entropy,
    exact_entropy_grad,
    exact_logprob_grad,
    exact_selected_logprob,
)

__all__ = [
    "exact_processed_entropy",
    "exact_processed_entropy_grad",
    "exact_processed_logprob",
    "exact_processed_logprob_grad",
    "support_masked_logits",
]


def support_masked_logits(
    logits: ArrayLike, support_mask: ArrayLike, *, real_vocab_size: int | None = None
) -> NDArray[Any]:
    """A copy of ``logits`` (``[N, V]``, same dtype) with every live column outside ``S`` at -inf.

    ``support_mask`` is bool ``[N, V]``, True in ``S``; a True padding column is
    refused. Padding columns are copied unchanged (they count as ``-inf`` anyway).

    >>> support_masked_logits([[1.0, 2.0, 3.0]], [[True, False, True]]).tolist()
    [[1.0, -inf, 3.0]]
    """
    arr = as_exact_array(logits, "logits", 2)
    rv = as_real_vocab_size(real_vocab_size, arr.shape[1])
    mask = as_support_mask(support_mask, (arr.shape[0], arr.shape[1]), rv)
    out = np.array(arr, copy=True)
    live = out[:, :rv]
    live[~mask[:, :rv]] = -math.inf
    return out


def exact_processed_logprob(
    logits: ArrayLike,
    targets: ArrayLike,
    support_mask: ArrayLike,
    *,
    active_mask: ArrayLike | None = None,
    real_vocab_size: int | None = None,
    temperature: float = 1.0,
    defined: ArrayLike | None = None,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``(selected_logp, support_lse, lse)`` over the support, each correctly rounded.

    ``selected_logp = z_y - LSE_S(z)`` (``-inf`` for an active target outside
    ``S``, ``0.0`` for inactive tokens), ``support_lse = LSE_S(z)`` and ``lse`` the
    full vocabulary's. ``defined`` (bool ``[N]``, default all True) marks rows
    whose support is defined.

    >>> sel, s_lse, lse = exact_processed_logprob([[0.0, 0.0, -50.0]], [0],
    ...                                          [[True, True, False]])
    >>> float(sel[0]), float(s_lse[0])
    (-0.6931471805599453, 0.6931471805599453)
    """
    masked = support_masked_logits(logits, support_mask, real_vocab_size=real_vocab_size)
    n = masked.shape[0]
    undefined = ~_defined(defined, n)
    selected, support_lse = exact_selected_logprob(
        masked,
        targets,
        active_mask=active_mask,
        real_vocab_size=real_vocab_size,
        temperature=temperature,
    )
    _, lse = exact_selected_logprob(
        logits,
        np.zeros(n, dtype=np.int64),
        active_mask=np.zeros(n, dtype=np.bool_),
        real_vocab_size=real_vocab_size,
        temperature=temperature,
    )
    active = as_active_mask(active_mask, n)
    selected[undefined & active] = math.nan
    support_lse[undefined] = math.nan
    return selected, support_lse, lse


def exact_processed_entropy(
    logits: ArrayLike,
    support_mask: ArrayLike,
    *,
    active_mask: ArrayLike | None = None,
    real_vocab_size: int | None = None,
    temperature: float = 1.0,
    defined: ArrayLike | None = None,
) -> FloatArray:
    """Per-token entropy of the distribution renormalised over ``S``, correctly rounded.

    >>> exact_processed_entropy([[0.0, 0.0, 0.0]], [[True, True, False]]).tolist()
    [0.6931471805599453]
    """
    masked = support_masked_logits(logits, support_mask, real_vocab_size=real_vocab_size)
    undefined = ~_defined(defined, masked.shape[0])
    out = exact_entropy(
        masked, active_mask=active_mask, real_vocab_size=real_vocab_size, temperature=temperature
    )
    out[undefined & as_active_mask(active_mask, masked.shape[0])] = math.nan
    return out


def exact_processed_logprob_grad(
    logits: ArrayLike,
    targets: ArrayLike,
    support_mask: ArrayLike,
    *,
    active_mask: ArrayLike | None = None,
    real_vocab_size: int | None = None,
    temperature: float = 1.0,
    defined: ArrayLike | None = None,
) -> FloatArray:
    """``d selected_logp / d logits`` with ``S`` held fixed: ``([v == y] - p^S_v) / T`` on ``S``.

    Exactly 0 outside ``S`` (the target's column too, when it lies outside), on
    padding and on inactive rows; a row whose ``support_lse`` is not finite is
    NaN on ``S`` (on every live column when its support is undefined).

    >>> exact_processed_logprob_grad([[0.0, 0.0, 7.0]], [1], [[True, True, False]]).tolist()
    [[-0.5, 0.5, 0.0]]
    """
    masked = support_masked_logits(logits, support_mask, real_vocab_size=real_vocab_size)
    _defined(defined, masked.shape[0])
    grad = exact_logprob_grad(
        masked,
        targets,
        active_mask=active_mask,
        real_vocab_size=real_vocab_size,
        temperature=temperature,
    )
    return _held_fixed(grad, support_mask, active_mask, real_vocab_size, defined)


def exact_processed_entropy_grad(
    logits: ArrayLike,
    support_mask: ArrayLike,
    *,
    active_mask: ArrayLike | None = None,
    real_vocab_size: int | None = None,
    temperature: float = 1.0,
    defined: ArrayLike | None = None,
) -> FloatArray:
    """``d entropy / d logits`` with ``S`` held fixed: ``-p^S_v (z_v - LSE_S + H) / T`` on ``S``.

    Zeros and NaN as :func:`exact_processed_logprob_grad`.

    >>> exact_processed_entropy_grad([[0.0, 0.0, 7.0]], [[True, True, False]]).tolist()
    [[0.0, 0.0, 0.0]]
    """
    masked = support_masked_logits(logits, support_mask, real_vocab_size=real_vocab_size)
    _defined(defined, masked.shape[0])
    grad = exact_entropy_grad(
        masked, active_mask=active_mask, real_vocab_size=real_vocab_size, temperature=temperature
    )
    return _held_fixed(grad, support_mask, active_mask, real_vocab_size, defined)


def _defined(defined: ArrayLike | None, n: int) -> BoolArray:
    if defined is None:
        return np.ones(n, dtype=np.bool_)
    arr = np.asarray(defined)
    if arr.dtype != np.bool_ or arr.shape != (n,):
        raise ValueError(
            f"defined has shape {arr.shape} dtype {arr.dtype}; expected bool ({n},), one per row"
        )
    return arr


def _held_fixed(
    grad: FloatArray,
    support_mask: ArrayLike,
    active_mask: ArrayLike | None,
    real_vocab_size: int | None,
    defined: ArrayLike | None,
) -> FloatArray:
    """Zero the gradient outside ``S``; NaN on the live columns of undefined active rows."""
    n, width = grad.shape
    rv = as_real_vocab_size(real_vocab_size, width)
    mask = np.asarray(support_mask)
    grad[:, :rv][~mask[:, :rv]] = 0.0
    undefined = ~_defined(defined, n) & as_active_mask(active_mask, n)
    grad[undefined, :rv] = math.nan
    return grad
