"""Float64 numpy reference for the softmax entropy and its gradient.

Same semantics as :func:`tp_logprob.oracle.exact_entropy`. For each shard of
live columns of ``z`` the partial is ``m = max z``, ``s = sum exp(z - m)`` and
``q = sum exp(z - m) (z - m)``, a ``-inf`` value contributing exactly 0 (never
``0 * -inf``); a shard with no finite live value is the identity ``(-inf, 0, 0)``
and is skipped. Partials are merged in shard-index order::

    M = max m_r,  S = sum s_r exp(m_r - M),  Q = sum exp(m_r - M) (q_r + (m_r - M) s_r)
    entropy = log S - Q / S

Error bound: the entropy model of :mod:`tp_logprob.oracle.tolerance`
(``docs/tolerances.md``, section "Entropy") with the float64 parameters of
:func:`tp_logprob.oracle.reference_error_bounds`;
:func:`reference_entropy_error_bounds` evaluates it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tp_logprob.oracle._entropy_error import entropy_error, ratio_upper
from tp_logprob.oracle._inputs import (
    BoolArray,
    FloatArray,
    as_active_mask,
    as_exact_array,
    as_real_vocab_size,
    as_shard_bounds,
)
from tp_logprob.oracle.reference import reference_model
from tp_logprob.oracle.temperature import checked_temperature, scaled_live

# Values per chunk of rows: keeps the float64 working copies cache-sized.
_CHUNK_VALUES = 1 << 19


def reference_entropy(
    logits: ArrayLike,
    *,
    active_mask: ArrayLike | None = None,
    real_vocab_size: int | None = None,
    temperature: float = 1.0,
) -> FloatArray:
    """Per-token entropy in float64 (see :func:`exact_entropy`).

    >>> reference_entropy([[0.0, 0.0]]).tolist()
    [0.6931471805599453]
    """
    z, active, rv, _ = _prepare(logits, active_mask, real_vocab_size, temperature)
    _, entropy = _merged(z, [(0, rv)] if rv else [])
    return np.where(active, entropy, 0.0)


def reference_sharded_entropy(
    logits: ArrayLike,
    vocab_shard_bounds: Sequence[Sequence[int]],
    *,
    active_mask: ArrayLike | None = None,
    real_vocab_size: int | None = None,
    temperature: float = 1.0,
) -> FloatArray:
    """Entropy through per-shard float64 partials ``(m_r, s_r, q_r)`` merged in shard order.

    ``vocab_shard_bounds`` are contiguous ``(start, end)`` pairs partitioning the
    columns, one per TP rank (see :func:`reference_sharded_logprob`).

    >>> reference_sharded_entropy([[0.0, 0.0, 5.0]], [(0, 1), (1, 3)], real_vocab_size=2).tolist()
    [0.6931471805599453]
    """
    z, active, rv, _ = _prepare(logits, active_mask, real_vocab_size, temperature)
    bounds = as_shard_bounds(vocab_shard_bounds, z.shape[1])
    _, entropy = _merged(z, [(a, min(b, rv)) for a, b in bounds])
    return np.where(active, entropy, 0.0)


def reference_entropy_grad(
    logits: ArrayLike,
    *,
    active_mask: ArrayLike | None = None,
    real_vocab_size: int | None = None,
    temperature: float = 1.0,
) -> FloatArray:
    """``-p_v (z_v - lse + entropy) / T`` in float64, ``[N, V]`` (see :func:`exact_entropy_grad`).

    >>> reference_entropy_grad([[0.0, 0.0]]).tolist()
    [[-0.0, -0.0]]
    """
    z, active, rv, t32 = _prepare(logits, active_mask, real_vocab_size, temperature)
    n, v = z.shape
    grad = np.zeros((n, v))
    rows = np.flatnonzero(active)
    if rv == 0 or rows.size == 0:
        return grad
    block = np.asarray(z[rows, :rv], dtype=np.float64)
    lse, entropy = _merged(block, [(0, rv)])
    with np.errstate(invalid="ignore", over="ignore"):
        shifted = block - lse[:, None]
        g = -(np.exp(shifted) * (shifted + entropy[:, None])) / t32
    g[block == -math.inf] = 0.0
    g[np.isnan(entropy)] = math.nan
    grad[rows, :rv] = g
    return grad


def reference_entropy_error_bounds(
    entropy: ArrayLike,
    num_values: int,
    *,
    num_shards: int = 1,
    lse: ArrayLike | None = None,
    row_max: ArrayLike | None = None,
) -> FloatArray:
    """Bounds on ``|reference - true|`` for the entropy (module docstring).

    ``entropy`` holds the exact (finite) values; ``lse`` and ``row_max`` (both or
    neither) tighten the bound through ``log S = lse - row_max``.
    """
    model = reference_model(num_values, num_shards)
    h = np.asarray(entropy, dtype=np.float64)
    log_sum, ratio = ratio_upper(model, h, lse, row_max)
    return entropy_error(model, h, log_sum, ratio)


def _prepare(
    logits: ArrayLike,
    active_mask: ArrayLike | None,
    real_vocab_size: int | None,
    temperature: float,
) -> tuple[NDArray[np.floating], BoolArray, int, float]:
    t32 = checked_temperature(temperature)
    x = as_exact_array(logits, "logits", 2)
    n, v = x.shape
    rv = as_real_vocab_size(real_vocab_size, v)
    active = as_active_mask(active_mask, n)
    return scaled_live(x, rv, t32, "logits"), active, rv, t32


def _merged(
    z: NDArray[np.floating], live_bounds: list[tuple[int, int]]
) -> tuple[FloatArray, FloatArray]:
    """``(lse, entropy)`` of every row; entropy is NaN for NaN, ``+inf`` or empty rows."""
    n = z.shape[0]
    shards = [(a, b) for a, b in live_bounds if b > a]
    width = max((b - a for a, b in shards), default=1)
    chunk = max(1, _CHUNK_VALUES // width)
    m = np.full((len(shards), n), -math.inf)
    s = np.zeros((len(shards), n))
    q = np.zeros((len(shards), n))
    for r0 in range(0, n, chunk):
        r1 = min(n, r0 + chunk)
        for k, (a, b) in enumerate(shards):
            m[k, r0:r1], s[k, r0:r1], q[k, r0:r1] = _partial(z[r0:r1, a:b])
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        special = np.isnan(m).any(axis=0) | (m == math.inf).any(axis=0)
        big_m = m.max(axis=0, initial=-math.inf)
        special |= big_m == -math.inf
        shift = np.where(np.isfinite(big_m), big_m, 0.0)
        total_s = np.zeros(n)
        total_q = np.zeros(n)
        for k in range(len(shards)):
            # Absent shards are skipped: no 0 * -inf, no exp(-inf - (-inf)).
            present = np.isfinite(m[k])
            gap = np.where(present, m[k] - shift, 0.0)
            scale = np.exp(gap)
            total_s += np.where(present, s[k] * scale, 0.0)
            total_q += np.where(present, scale * (q[k] + gap * s[k]), 0.0)
        log_s = np.log(total_s)
        lse = shift + log_s
        entropy = log_s - total_q / total_s
    return np.where(special, math.nan, lse), np.where(special, math.nan, entropy)


def _partial(block: NDArray[np.floating]) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Shard partial ``(m, s, q)`` of a ``[rows, width]`` block, ``width >= 1``."""
    work = block.astype(np.float64)
    m = work.max(axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        work -= np.where(np.isfinite(m), m, 0.0)[:, None]
        e = np.exp(work)
        s = e.sum(axis=1)
        # exp(d) d with d = -inf is 0 (and so is any term whose exp underflows).
        q = np.multiply(e, work, out=np.zeros_like(e), where=e > 0.0).sum(axis=1)
    empty = m == -math.inf
    return m, np.where(empty, 0.0, s), np.where(empty, 0.0, q)
