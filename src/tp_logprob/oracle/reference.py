"""Float64 numpy reference: fast, vectorised, max-shifted, within a proven bound of exact.

Same signatures and semantics as :mod:`tp_logprob.oracle.exact` (``temperature``
included: the logits are ``z = fp32(x) / fp32(T)``, formed exactly as the exact
oracle forms them, and gradients are divided by ``fp32(T)``). Rows are
processed in chunks of about a million values so the float64 working copy stays
in cache. For each shard of columns (one shard, ``[0, real_vocab_size)``, for
the unsharded functions) the partial is ``m = max x`` and
``s = sum exp(x - m)``; a shard with no live column, or only ``-inf``, is the
identity ``(-inf, 0)`` and never evaluates ``exp(-inf - (-inf))``. Partials are
merged in shard-index order: ``M = max m_r``, ``S = sum s_r exp(m_r - M)``,
``lse = M + log S``, ``selected = x_t - lse``.

Error bound: the model of :class:`tp_logprob.oracle.tolerance.ErrorModel`
(derived in ``docs/tolerances.md``) with ``u = 2^-53``, numpy's float64 ``exp``
and ``log`` within 1 ulp (relative error ``<= 2u``), no argument scaling and no
absolute log error. For ``n`` live columns and ``R`` shards, with
``L = lse - M <= log n``::

    theta_S = (1 + 2u)^2 (1 + u)^(n + R - 1) - 1 + min(n/e, log(n)) u (1 + O(u))
    Delta_L = -log(1 - theta_S) + 2u (L - log(1 - theta_S))
    |lse_ref - lse| <= Delta_L + u (|lse| + Delta_L)
    |sel_ref - sel| <= E_lse + u (|sel| + E_lse)

:func:`reference_error_bounds` evaluates it. It holds for any summation order,
so it grows like ``n u``; numpy's pairwise summation stays far below it (1 ulp
of ``lse`` on 152,064-column rows, ``benchmarks/bench_oracle.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tp_logprob.oracle._error_model import ErrorModel
from tp_logprob.oracle._inputs import (
    BoolArray,
    FloatArray,
    IntArray,
    as_active_mask,
    as_exact_array,
    as_real_vocab_size,
    as_shard_bounds,
    as_targets,
    checked_targets,
    row_dimensions,
)
from tp_logprob.oracle.formats import FORMATS, U64
from tp_logprob.oracle.temperature import checked_temperature, scaled_live

# Values per chunk of rows: keeps the float64 working copy cache-sized.
_CHUNK_VALUES = 1 << 20


def reference_logsumexp(
    row: ArrayLike, *, real_vocab_size: int | None = None, temperature: float = 1.0
) -> float | FloatArray:
    """``log(sum(exp(row[:real_vocab_size])))`` in float64, max-shifted.

    ``row`` is 1-D (a float), or ``[N, V]`` for one value per row along the last
    axis (float64 ``[N]``, row for row the bits of the 1-D call).

    >>> reference_logsumexp([0.0, 0.0])
    0.6931471805599453
    """
    t32 = checked_temperature(temperature)
    batched = row_dimensions(row, "row") == 2
    x = as_exact_array(row, "row", 2 if batched else 1)
    rv = as_real_vocab_size(real_vocab_size, x.shape[-1])
    x = scaled_live(x, rv, t32, "row")
    _, lse = _merged(x if batched else x[None, :], [(0, rv)] if rv else [])
    return lse if batched else float(lse[0])


def reference_selected_logprob(
    logits: ArrayLike,
    targets: ArrayLike,
    *,
    active_mask: ArrayLike | None = None,
    real_vocab_size: int | None = None,
    temperature: float = 1.0,
) -> tuple[FloatArray, FloatArray]:
    """Per-token ``(selected_logp, lse)`` in float64 (see :func:`exact_selected_logprob`).

    >>> sel, lse = reference_selected_logprob([[0.0, 0.0]], [1])
    >>> float(sel[0]), float(lse[0])
    (-0.6931471805599453, 0.6931471805599453)
    """
    x, t, active, rv, _ = _prepare(logits, targets, active_mask, real_vocab_size, temperature)
    return _selected(x, t, active, [(0, rv)] if rv else [])


def reference_sharded_logprob(
    logits: ArrayLike,
    targets: ArrayLike,
    vocab_shard_bounds: Sequence[Sequence[int]],
    *,
    active_mask: ArrayLike | None = None,
    real_vocab_size: int | None = None,
    temperature: float = 1.0,
) -> tuple[FloatArray, FloatArray]:
    """``(selected_logp, lse)`` through per-shard float64 partials merged in shard order.

    ``vocab_shard_bounds`` are contiguous ``(start, end)`` pairs partitioning the
    columns, one per TP rank; padding columns inside a shard are excluded, and a
    shard with no live column contributes the identity ``(-inf, 0)``.

    >>> sel, lse = reference_sharded_logprob([[0.0, 0.0, 5.0]], [1], [(0, 1), (1, 3)],
    ...                                      real_vocab_size=2)
    >>> float(lse[0])
    0.6931471805599453
    """
    x, t, active, rv, _ = _prepare(logits, targets, active_mask, real_vocab_size, temperature)
    bounds = as_shard_bounds(vocab_shard_bounds, x.shape[1])
    live = [(a, min(b, rv)) for a, b in bounds]
    return _selected(x, t, active, live)


def reference_logprob_grad(
    logits: ArrayLike,
    targets: ArrayLike,
    *,
    active_mask: ArrayLike | None = None,
    real_vocab_size: int | None = None,
    temperature: float = 1.0,
) -> FloatArray:
    """``([v == target] - exp(z_v - lse)) / T`` in float64, ``[N, V]`` (``exact_logprob_grad``).

    >>> reference_logprob_grad([[0.0, 0.0]], [1]).tolist()
    [[-0.5, 0.5]]
    """
    x, t, active, rv, t32 = _prepare(logits, targets, active_mask, real_vocab_size, temperature)
    n, v = x.shape
    grad = np.zeros((n, v))
    rows = np.flatnonzero(active)
    if rv == 0 or rows.size == 0:
        return grad
    selected, lse = _selected(x[rows], t[rows], np.ones(rows.size, np.bool_), [(0, rv)])
    target_logit = x[rows, t[rows]].astype(np.float64)
    block = np.asarray(x[rows, :rv], dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        block -= lse[:, None]
        np.exp(block, out=block)
        np.negative(block, out=block)
        block[np.arange(rows.size), t[rows]] = 1.0 - np.exp(target_logit - lse)
    block[np.isnan(selected)] = math.nan
    if t32 != 1.0:
        block /= t32
    grad[rows, :rv] = block
    return grad


def reference_error_bounds(
    selected: ArrayLike,
    lse: ArrayLike,
    num_values: int,
    *,
    num_shards: int = 1,
    row_max: ArrayLike | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Bounds on ``|reference - true|`` for ``(selected, lse)`` (module docstring)."""
    model = reference_model(num_values, num_shards)
    s = np.asarray(selected, dtype=np.float64)
    e = np.asarray(lse, dtype=np.float64)
    log_sum = model.log_sum_upper(e, row_max)
    return model.selected_error(s, e, log_sum), model.lse_error(e, log_sum)


def reference_model(num_values: int, num_shards: int) -> ErrorModel:
    """The float64 rounding model of the references (module docstring)."""
    return ErrorModel(
        unit=U64,
        exp_rel=2.0 * U64,
        arg_rel=U64,
        log_rel=2.0 * U64,
        log_abs=0.0,
        tiny=FORMATS["fp64"].smallest_normal,
        num_values=num_values,
        num_shards=num_shards,
        rescales=1,
    )


def _prepare(
    logits: ArrayLike,
    targets: ArrayLike,
    active_mask: ArrayLike | None,
    real_vocab_size: int | None,
    temperature: float,
) -> tuple[NDArray[np.floating], IntArray, BoolArray, int, float]:
    t32 = checked_temperature(temperature)
    x = as_exact_array(logits, "logits", 2)
    n, v = x.shape
    rv = as_real_vocab_size(real_vocab_size, v)
    active = as_active_mask(active_mask, n)
    t = checked_targets(as_targets(targets, n), active, rv)
    return scaled_live(x, rv, t32, "logits"), t, active, rv, t32


def _selected(
    x: NDArray[np.floating],
    t: IntArray,
    active: BoolArray,
    live_bounds: list[tuple[int, int]],
) -> tuple[FloatArray, FloatArray]:
    n = x.shape[0]
    special, lse = _merged(x, live_bounds)
    selected = np.zeros(n)
    rows = np.flatnonzero(active)
    if rows.size:
        target_logit = np.empty(rows.size)
        # The target logit comes from its owner shard.
        for start, end in live_bounds:
            own = (t[rows] >= start) & (t[rows] < end)
            target_logit[own] = x[rows[own], t[rows[own]]]
        with np.errstate(invalid="ignore", over="ignore"):
            value = target_logit - lse[rows]
        selected[rows] = np.where(special[rows], math.nan, value)
    return selected, lse


def _merged(
    x: NDArray[np.floating], live_bounds: list[tuple[int, int]]
) -> tuple[BoolArray, FloatArray]:
    """``(special, lse)``: ``special`` marks rows whose selected value is NaN."""
    n = x.shape[0]
    shards = [(a, b) for a, b in live_bounds if b > a]
    width = max((b - a for a, b in shards), default=1)
    chunk = max(1, _CHUNK_VALUES // width)
    m = np.full((len(shards), n), -math.inf)
    s = np.zeros((len(shards), n))
    for r0 in range(0, n, chunk):
        r1 = min(n, r0 + chunk)
        for k, (a, b) in enumerate(shards):
            m[k, r0:r1], s[k, r0:r1] = _partial(x[r0:r1, a:b])
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        has_nan = np.isnan(m).any(axis=0)
        has_inf = (m == math.inf).any(axis=0)
        big_m = m.max(axis=0, initial=-math.inf)
        shift = np.where(np.isfinite(big_m), big_m, 0.0)
        total = np.zeros(n)
        for k in range(len(shards)):
            present = m[k] > -math.inf
            scale = np.exp(np.where(present, m[k] - shift, 0.0))
            total += np.where(present, s[k] * scale, 0.0)
        lse = shift + np.log(total)
    empty = ~has_nan & ~has_inf & (big_m == -math.inf)
    lse = np.where(has_nan, math.nan, np.where(has_inf, math.inf, lse))
    lse[empty] = -math.inf
    return has_nan | has_inf | empty, lse


def _partial(block: NDArray[np.floating]) -> tuple[FloatArray, FloatArray]:
    """Shard partial ``(m, s)`` of a ``[rows, width]`` block, ``width >= 1``."""
    work = block.astype(np.float64)
    m = work.max(axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        # Rows whose max is not finite are special or identity: shift by 0 so
        # that no -inf - (-inf) is evaluated; their s is fixed below or unused.
        work -= np.where(np.isfinite(m), m, 0.0)[:, None]
        np.exp(work, out=work)
        s = work.sum(axis=1)
    return m, np.where(m == -math.inf, 0.0, s)
