"""Exact oracle: log-sum-exp, selected log-probabilities, entropy and gradients, correctly rounded.

Every float64 returned here is the true real value (inputs taken exactly)
rounded to nearest, ties to even. The values are enclosed in intervals that
tighten as the working precision doubles (a Ziv loop); see
:mod:`tp_logprob.oracle._exact_row` for the enclosure, its error bound and why
the loop terminates. mpmath's raw ``libmp`` layer is used with an explicit
precision, so no global mpmath state is read or changed.

Before the Ziv loop, every row goes through a fast path (``_fast_drivers``): the
same quantities in vectorised double-double arithmetic with a proven error
bound, kept only when the whole enclosure rounds to one float64 (for ``lse``
and ``selected_logp``, a cheaper binned float64 phase, ``_fast_bins``, comes
first and hands on the rows it cannot settle). A row (or one
quantity of a row) it cannot settle runs the Ziv loop as before, so the results
are the same bit for bit; :func:`tp_logprob.oracle.fast_path_stats` counts both.

Semantics (``docs/semantics.md``): columns at or past ``real_vocab_size`` are ``-inf``
whatever they hold; ``lse`` follows ``torch.logsumexp`` and an active token's
``selected_logp`` follows ``torch.log_softmax(...).gather(...)`` on the live
columns; inactive tokens get ``selected_logp = 0.0`` (and ``entropy = 0.0``) and
their target is never read. Every function takes ``temperature``: it works on
``z = fp32(x) / fp32(T)`` (:func:`tp_logprob.oracle.apply_temperature`) and is
exact with respect to that ``z``; gradients are with respect to ``x``, the
exact ``d/dz`` divided by ``fp32(T)`` and rounded once.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tp_logprob.oracle import _fast_drivers as fast
from tp_logprob.oracle._exact_entropy import (
    RowEntropy,
    certified_entropy,
    certified_entropy_grad,
)
from tp_logprob.oracle._exact_row import (
    RowLSE,
    certified_lse,
    certified_probabilities,
    certified_selected,
    finite_part,
    start_bits,
)
from tp_logprob.oracle._fast_stats import enabled as fast_path_enabled
from tp_logprob.oracle._inputs import (
    BoolArray,
    FloatArray,
    as_active_mask,
    as_exact_array,
    as_float64,
    as_real_vocab_size,
    as_targets,
    checked_targets,
    row_dimensions,
)
from tp_logprob.oracle.temperature import checked_temperature, scaled_live

_SPECIAL_LSE = {"nan": math.nan, "inf": math.inf, "empty": -math.inf}


def _bits_source(value: ArrayLike, t32: float, live: int) -> NDArray[Any] | None:
    """The caller's float32 or bfloat16 array (live columns), when its values are the ``z``."""
    arr = np.asarray(value)
    if t32 != 1.0 or not (arr.dtype == np.float32 or arr.dtype.name == "bfloat16"):
        return None
    return arr[..., :live]


def exact_logsumexp(
    row: ArrayLike, *, real_vocab_size: int | None = None, temperature: float = 1.0
) -> float | FloatArray:
    """``log(sum(exp(row[:real_vocab_size])))``, correctly rounded to float64.

    ``row`` is 1-D, or ``[N, V]`` for one value per row along the last axis (as
    ``torch.logsumexp(dim=-1)``), float16, bfloat16, float32 or float64, taken
    exactly. A 1-D row gives a float; a batch gives float64 ``[N]`` holding, row
    for row, the bits of the 1-D call (each value is correctly rounded, so unique).
    NaN gives NaN, ``+inf`` gives ``+inf``, and a row with no finite live value
    gives ``-inf``.

    >>> exact_logsumexp([0.0, 0.0])
    0.6931471805599453
    >>> exact_logsumexp([[0.0, 0.0], [1.0, -float("inf")]]).tolist()
    [0.6931471805599453, 1.0]
    """
    if row_dimensions(row, "row") == 2:
        return _logsumexp_rows(row, real_vocab_size=real_vocab_size, temperature=temperature)
    return _logsumexp(row, real_vocab_size=real_vocab_size, temperature=temperature)


def exact_selected_logprob(
    logits: ArrayLike,
    targets: ArrayLike,
    *,
    active_mask: ArrayLike | None = None,
    real_vocab_size: int | None = None,
    temperature: float = 1.0,
) -> tuple[FloatArray, FloatArray]:
    """Per-token ``(selected_logp, lse)``, each correctly rounded to float64.

    ``logits`` is ``[N, V]``; ``targets`` holds ``N`` global column ids. An
    active target outside ``[0, real_vocab_size)`` raises ``ValueError`` naming
    the token, before anything is computed.

    >>> sel, lse = exact_selected_logprob([[0.0, 0.0]], [1])
    >>> float(sel[0]), float(lse[0])
    (-0.6931471805599453, 0.6931471805599453)
    """
    return _selected_logprob(
        logits,
        targets,
        active_mask=active_mask,
        real_vocab_size=real_vocab_size,
        temperature=temperature,
    )


def exact_logprob_grad(
    logits: ArrayLike,
    targets: ArrayLike,
    *,
    active_mask: ArrayLike | None = None,
    real_vocab_size: int | None = None,
    temperature: float = 1.0,
) -> FloatArray:
    """``d selected_logp[t] / d logits[t, v] = ([v == target] - exp(z_v - LSE)) / T``, ``[N, V]``.

    Each element is correctly rounded. Padding columns and inactive rows are
    ``0.0``. In a row whose ``selected_logp`` is NaN (a NaN or ``+inf`` live
    value, or no finite live value) every live column is NaN, as torch's
    ``log_softmax`` backward gives; a ``-inf`` column contributes
    ``[v == target]``.

    >>> exact_logprob_grad([[0.0, 0.0]], [1]).tolist()
    [[-0.5, 0.5]]
    """
    return _logprob_grad(
        logits,
        targets,
        active_mask=active_mask,
        real_vocab_size=real_vocab_size,
        temperature=temperature,
    )


def exact_entropy(
    logits: ArrayLike,
    *,
    active_mask: ArrayLike | None = None,
    real_vocab_size: int | None = None,
    temperature: float = 1.0,
) -> FloatArray:
    """Per-token softmax entropy ``LSE(z) - sum_v p_v z_v``, correctly rounded to float64.

    Over the live columns of ``z``: a ``-inf`` value contributes exactly 0, one
    finite live value gives ``0.0``, and a NaN or ``+inf`` live value, or no
    finite live value, gives NaN. Inactive tokens give ``0.0``.

    >>> exact_entropy([[0.0, 0.0], [5.0, -float("inf")]]).tolist()
    [0.6931471805599453, 0.0]
    """
    return _entropy(
        logits, active_mask=active_mask, real_vocab_size=real_vocab_size, temperature=temperature
    )


def exact_entropy_grad(
    logits: ArrayLike,
    *,
    active_mask: ArrayLike | None = None,
    real_vocab_size: int | None = None,
    temperature: float = 1.0,
) -> FloatArray:
    """``d entropy[t] / d logits[t, v] = -p_v (z_v - LSE + entropy) / T``, ``[N, V]``.

    Each element is correctly rounded. Padding columns, ``-inf`` columns and
    inactive rows are ``0.0``; a row whose entropy is NaN is NaN on every live
    column (as :func:`exact_logprob_grad` does for NaN rows).

    >>> exact_entropy_grad([[0.0, 0.0]]).tolist()
    [[0.0, 0.0]]
    """
    return _entropy_grad(
        logits, active_mask=active_mask, real_vocab_size=real_vocab_size, temperature=temperature
    )


def _logsumexp(
    row: ArrayLike,
    *,
    real_vocab_size: int | None,
    temperature: float = 1.0,
    precision_scale: int = 1,
) -> float:
    t32 = checked_temperature(temperature)
    given = as_exact_array(row, "row", 1)
    rv = as_real_vocab_size(real_vocab_size, given.shape[0])
    # At temperature 1 the fast path reads the caller's own values (a float32 or
    # bfloat16 row's bits before any float64 copy); otherwise the scaled row.
    x = given if t32 == 1.0 else scaled_live(as_float64(given, "row", 1), rv, t32, "row")
    if precision_scale == 1 and fast_path_enabled():
        certified = fast.logsumexp(x[:rv], _bits_source(given, t32, rv))
        if certified is not None:
            return certified
    special, finite = finite_part(np.ascontiguousarray(x[:rv], dtype=np.float64))
    if special is not None:
        return _SPECIAL_LSE[special]
    engine = RowLSE(finite)
    return certified_lse(engine, precision_scale * start_bits(engine.num_values))


def _logsumexp_rows(
    logits: ArrayLike, *, real_vocab_size: int | None, temperature: float
) -> FloatArray:
    """:func:`_logsumexp` of every row of ``[N, V]`` logits: the fast path on the whole batch,
    then the Ziv loop for the rows it left."""
    t32 = checked_temperature(temperature)
    x = as_float64(logits, "row", 2)
    n, v = x.shape
    rv = as_real_vocab_size(real_vocab_size, v)
    x = scaled_live(x, rv, t32, "row")
    lse = np.empty(n)
    done = np.zeros(n, dtype=np.bool_)
    if fast_path_enabled():
        quick = fast.selected_logprob(
            x[:, :rv], np.zeros(n), np.zeros(n, dtype=np.bool_), _bits_source(logits, t32, rv)
        )
        lse[quick.lse_ok], done = quick.lse[quick.lse_ok], quick.lse_ok
    for i in np.flatnonzero(~done).tolist():
        special, finite = finite_part(x[i, :rv])
        if special is not None:
            lse[i] = _SPECIAL_LSE[special]
            continue
        engine = RowLSE(finite)
        lse[i] = certified_lse(engine, start_bits(engine.num_values))
    return lse


def _selected_logprob(
    logits: ArrayLike,
    targets: ArrayLike,
    *,
    active_mask: ArrayLike | None,
    real_vocab_size: int | None,
    temperature: float = 1.0,
    precision_scale: int = 1,
) -> tuple[FloatArray, FloatArray]:
    t32 = checked_temperature(temperature)
    x = as_float64(logits, "logits", 2)
    n, v = x.shape
    rv = as_real_vocab_size(real_vocab_size, v)
    active = as_active_mask(active_mask, n)
    t = checked_targets(as_targets(targets, n), active, rv)
    x = scaled_live(x, rv, t32, "logits")
    selected = np.zeros(n)
    lse = np.empty(n)
    quick = None
    if precision_scale == 1 and fast_path_enabled():
        target_values = x[np.arange(n), t] if rv else np.zeros(n)
        source = _bits_source(logits, t32, rv)
        quick = fast.selected_logprob(x[:, :rv], target_values, active, source)
        lse[quick.lse_ok] = quick.lse[quick.lse_ok]
        selected[active & quick.selected_ok] = quick.selected[active & quick.selected_ok]
    for i in range(n):
        lse_done = quick is not None and bool(quick.lse_ok[i])
        selected_done = not active[i] or (quick is not None and bool(quick.selected_ok[i]))
        if lse_done and selected_done:
            continue
        special, finite = finite_part(x[i, :rv])
        if special is not None:
            lse[i] = _SPECIAL_LSE[special]
            if active[i]:
                selected[i] = math.nan
            continue
        engine = RowLSE(finite)
        first = precision_scale * start_bits(engine.num_values)
        if not lse_done:
            lse[i] = certified_lse(engine, first)
        if not selected_done:
            target_value = float(x[i, t[i]])
            selected[i] = (
                -math.inf
                if target_value == -math.inf
                else certified_selected(engine, target_value, first)
            )
    return selected, lse


def _logprob_grad(
    logits: ArrayLike,
    targets: ArrayLike,
    *,
    active_mask: ArrayLike | None,
    real_vocab_size: int | None,
    temperature: float = 1.0,
    precision_scale: int = 1,
) -> FloatArray:
    t32 = checked_temperature(temperature)
    x = as_float64(logits, "logits", 2)
    n, v = x.shape
    rv = as_real_vocab_size(real_vocab_size, v)
    active = as_active_mask(active_mask, n)
    t = checked_targets(as_targets(targets, n), active, rv)
    x = scaled_live(x, rv, t32, "logits")
    grad = np.zeros((n, v))
    done = np.zeros(n, dtype=np.bool_)
    if precision_scale == 1 and fast_path_enabled():
        live_grad = np.zeros((n, rv))
        source = _bits_source(logits, t32, rv)
        done = fast.logprob_grad(x[:, :rv], t, active, t32, live_grad, source)
        grad[:, :rv] = live_grad
    for i in np.flatnonzero(active & ~done).tolist():
        live = x[i, :rv]
        special, finite = finite_part(live)
        if special is not None:
            grad[i, :rv] = math.nan
            continue
        engine = RowLSE(finite)
        first = precision_scale * start_bits(engine.num_values)
        target_value = float(live[t[i]])
        target_index = (
            None if target_value == -math.inf else int(np.searchsorted(engine.values, target_value))
        )
        neg_q, target_grad = certified_probabilities(engine, target_index, first, t32)
        is_finite = live > -math.inf
        row = np.zeros(rv)
        row[is_finite] = neg_q[np.searchsorted(engine.values, live[is_finite])]
        row[t[i]] = 1.0 / t32 if target_grad is None else target_grad
        grad[i, :rv] = row
    return grad


def _entropy_rows(
    logits: ArrayLike,
    active_mask: ArrayLike | None,
    real_vocab_size: int | None,
    temperature: float,
) -> tuple[FloatArray, int, BoolArray, float]:
    t32 = checked_temperature(temperature)
    x = as_float64(logits, "logits", 2)
    n, v = x.shape
    rv = as_real_vocab_size(real_vocab_size, v)
    active = as_active_mask(active_mask, n)
    return scaled_live(x, rv, t32, "logits"), rv, active, t32


def _entropy(
    logits: ArrayLike,
    *,
    active_mask: ArrayLike | None,
    real_vocab_size: int | None,
    temperature: float = 1.0,
    precision_scale: int = 1,
) -> FloatArray:
    x, rv, active, t32 = _entropy_rows(logits, active_mask, real_vocab_size, temperature)
    out = np.zeros(x.shape[0])
    done = np.zeros(x.shape[0], dtype=np.bool_)
    if precision_scale == 1 and fast_path_enabled():
        certified, done = fast.entropy(x[:, :rv], active, _bits_source(logits, t32, rv))
        out[done] = certified[done]
    for i in np.flatnonzero(active & ~done).tolist():
        special, finite = finite_part(x[i, :rv])
        if special is not None:
            out[i] = math.nan
            continue
        engine = RowEntropy(finite)
        out[i] = certified_entropy(engine, precision_scale * start_bits(engine.num_values))
    return out


def _entropy_grad(
    logits: ArrayLike,
    *,
    active_mask: ArrayLike | None,
    real_vocab_size: int | None,
    temperature: float = 1.0,
    precision_scale: int = 1,
) -> FloatArray:
    x, rv, active, t32 = _entropy_rows(logits, active_mask, real_vocab_size, temperature)
    grad = np.zeros(x.shape)
    done = np.zeros(x.shape[0], dtype=np.bool_)
    if precision_scale == 1 and fast_path_enabled():
        live_grad = np.zeros((x.shape[0], rv))
        source = _bits_source(logits, t32, rv)
        done = fast.entropy_grad(x[:, :rv], active, t32, live_grad, source)
        grad[:, :rv] = live_grad
    for i in np.flatnonzero(active & ~done).tolist():
        live = x[i, :rv]
        special, finite = finite_part(live)
        if special is not None:
            grad[i, :rv] = math.nan
            continue
        engine = RowEntropy(finite)
        first = precision_scale * start_bits(engine.num_values)
        per_value = certified_entropy_grad(engine, first, t32)
        is_finite = live > -math.inf
        row = np.zeros(rv)
        row[is_finite] = per_value[np.searchsorted(engine.values, live[is_finite])]
        grad[i, :rv] = row
    return grad
