"""The exact sampling support of each row: min-p, then top-k, then top-p.

``docs/semantics.md``, "Processed logprobs": with ``z`` the tempered logits over
the live columns and ``M`` a row's maximum,

1. min-p keeps ``v`` iff ``exp(z_v - M) >= min_p``;
2. top-k keeps the survivors with ``z_v >= z_(k)``, the k-th largest survivor
   value counted with multiplicity (all of them when fewer than ``k`` survive);
3. top-p keeps the survivors whose strictly larger survivors hold less than
   ``top_p`` of the survivors' mass.

Every decision here is exact. Top-k compares values. Min-p compares
``z_v - M``, formed exactly, with ``log(min_p)``; top-p compares masses
computed with the proven double-double ``exp`` and error-bounded prefix sums.
A comparison those enclosures cannot settle is decided in multi-precision
(:mod:`._support_exact`, which also says why no exact tie can occur), and
:func:`tp_logprob.oracle.fast_path_stats` counts such rows under
``support_min_p`` and ``support_top_p``. Inside
:func:`tp_logprob.oracle.fast_path.slow_path_only` every mass comparison goes to
multi-precision.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from tp_logprob.oracle._fast_stats import enabled as fast_path_enabled
from tp_logprob.oracle._inputs import (
    BoolArray,
    FloatArray,
    IntArray,
    as_exact_array,
    as_real_vocab_size,
    as_sampling_params,
)
from tp_logprob.oracle._support_rows import sorted_rows, top_values
from tp_logprob.oracle._support_rules import Rules, counts, float_values, top_p_prefixes
from tp_logprob.oracle.support_tolerance import SupportMargins
from tp_logprob.oracle.temperature import checked_temperature, divided

__all__ = ["ExactSupport", "exact_support", "replayed_support_mask"]

# Values per block of rows: top-k alone reads a few passes over a block and then its
# sorted tops, so its blocks are large; min-p and a top-p over whole rows compute masses
# on every value, whose temporaries stay cache-sized in small blocks.
_BLOCK_VALUES = 1 << 21
_MASS_BLOCK_VALUES = 1 << 16


@dataclass(frozen=True)
class ExactSupport:
    """The exact support of each row (:func:`exact_support`).

    ``mask`` is bool ``[N, V]`` (padding columns always False), ``threshold`` the
    smallest kept ``z`` per row (float64; NaN where the support is undefined),
    ``defined`` bool ``[N]``: False for a row whose live ``z`` holds a NaN or
    ``+inf``, or no finite value (its mask is empty), and ``size`` the kept
    columns per row (int64).
    """

    mask: BoolArray
    threshold: FloatArray
    defined: BoolArray
    size: IntArray


@dataclass(frozen=True)
class Analysis:
    """What :func:`exact_support` and the classification share: the live ``z`` and thresholds."""

    z: FloatArray
    padded_width: int
    defined: BoolArray
    threshold: FloatArray
    sure_threshold: FloatArray
    out_threshold: FloatArray

    def live_mask(self, threshold: FloatArray) -> BoolArray:
        """``z >= threshold`` per row, as ``[N, V]`` with False padding."""
        mask = np.zeros((self.z.shape[0], self.padded_width), dtype=np.bool_)
        with np.errstate(invalid="ignore"):
            mask[:, : self.z.shape[1]] = self.z >= threshold[:, None]
        return mask

    def exact(self) -> ExactSupport:
        mask = self.live_mask(self.threshold)
        return ExactSupport(mask, self.threshold, self.defined, mask.sum(axis=1).astype(np.int64))


def exact_support(
    logits: ArrayLike,
    *,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    real_vocab_size: int | None = None,
    temperature: float = 1.0,
) -> ExactSupport:
    """The exact support of each row of ``logits`` (``[N, V]``) under the sampling parameters.

    ``None`` leaves a rule off, as do ``top_p=1`` and ``min_p=0``; ``top_k`` is an
    int ``>= 1``. Rules apply to ``z = fp32(x) / fp32(T)`` over the live columns,
    in vLLM's order (min-p, top-k, top-p), with ties at a boundary all kept.

    >>> s = exact_support([[0.0, 1.0, 1.0, 3.0]], top_k=2)
    >>> s.mask.tolist(), s.threshold.tolist(), s.size.tolist()
    ([[False, True, True, True]], [1.0], [3])
    """
    return analyse(logits, top_k, top_p, min_p, real_vocab_size, temperature, None).exact()


def analyse(
    logits: ArrayLike,
    top_k: Any,
    top_p: Any,
    min_p: Any,
    real_vocab_size: int | None,
    temperature: float,
    margins: SupportMargins | None,
    *,
    whole_rows: bool = False,
    row_width: int | None = None,
) -> Analysis:
    """Check the arguments and run the rules (and the margins' tests) on every defined row.

    ``whole_rows`` sorts every row whole instead of its top only: the same decisions, the
    reference the top is tested against. ``row_width`` is the live width of the rows the
    columns of ``logits`` were taken from (default: ``real_vocab_size``): the prefix sums'
    error bound is the one for that many terms, so a row's top columns alone get the
    enclosures, and so the certain sets, of the whole row."""
    t32 = checked_temperature(temperature)
    rules = Rules(*as_sampling_params(top_k, top_p, min_p))
    x = as_exact_array(logits, "logits", 2)
    n, width = x.shape
    rv = as_real_vocab_size(real_vocab_size, width)
    if row_width is not None and not (type(row_width) is int and row_width >= rv):
        raise ValueError(f"row_width={row_width!r} must be an int >= real_vocab_size={rv}")
    z = divided(x[:, :rv], t32, "logits")
    # A row's maximum is NaN with a NaN, +inf with a +inf, -inf with no finite value.
    row_max = z.max(axis=1) if rv else np.full(n, -math.inf)
    defined = np.isfinite(row_max)
    threshold, sure, out = np.full(n, math.nan), np.full(n, math.nan), np.full(n, math.nan)
    rows = np.flatnonzero(defined)
    masses = rules.min_p is not None or (rules.top_p is not None and rules.top_k is None)
    per_block = max(1, (_MASS_BLOCK_VALUES if masses else _BLOCK_VALUES) // max(rv, 1))
    fast = fast_path_enabled()
    for start in range(0, rows.size, per_block):
        chunk = rows[start : start + per_block]
        first, last = int(chunk[0]), int(chunk[-1]) + 1
        values = z[first:last] if last - first == chunk.size else z[chunk]  # a view if it can
        m = row_max[chunk]
        found, top = counts(values, m, rules, margins, fast)
        # The sorted top: every prefix end, and the value just past the widest prefix.
        need = np.minimum(found.maybe_in + 1, rv)
        if whole_rows:
            need = np.full(chunk.size, rv)
        if top is None or top.shape[1] < need.max():
            top = top_values(values, need)
        if rules.top_p is not None:
            block = sorted_rows(chunk, top, m, rv if row_width is None else row_width)
            found = top_p_prefixes(block, rules.top_p, margins, fast, found)
        threshold[chunk] = float_values(top, found.kept - 1)
        sure[chunk] = float_values(top, found.sure_in - 1)
        out[chunk] = float_values(top, found.maybe_in)
    return Analysis(z, width, defined, threshold, sure, out)


def replayed_support_mask(kept_offsets: ArrayLike, kept_ids: ArrayLike, width: int) -> BoolArray:
    """A replayed support as a bool ``[N, width]`` mask: row ``t`` keeps
    ``kept_ids[kept_offsets[t]:kept_offsets[t + 1]]`` (CSR, global column ids).

    >>> replayed_support_mask([0, 2, 3], [1, 3, 0], 4).astype(int).tolist()
    [[0, 1, 0, 1], [1, 0, 0, 0]]
    """
    columns = operator.index(width)
    if columns < 0:
        raise ValueError(f"width={width!r} must be >= 0")
    offsets = _int_vector(kept_offsets, "kept_offsets")
    ids = _int_vector(kept_ids, "kept_ids")
    if offsets.size == 0 or offsets[0] != 0:
        raise ValueError(
            f"kept_offsets={offsets.tolist()!r} must start at 0 (one entry per row + 1)"
        )
    steps = np.diff(offsets)
    if (steps < 0).any():
        row = int(np.flatnonzero(steps < 0)[0]) + 1
        raise ValueError(
            f"kept_offsets[{row}]={int(offsets[row])} is below kept_offsets[{row - 1}]"
        )
    if offsets[-1] != ids.size:
        raise ValueError(f"kept_offsets[-1]={int(offsets[-1])} must equal len(kept_ids)={ids.size}")
    bad = (ids < 0) | (ids >= columns)
    if bad.any():
        position = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"kept_ids[{position}]={int(ids[position])} is outside [0, width={columns})"
        )
    mask = np.zeros((steps.size, columns), dtype=np.bool_)
    mask[np.repeat(np.arange(steps.size), steps), ids] = True
    return mask


def _int_vector(value: ArrayLike, name: str) -> IntArray:
    arr = np.asarray(value)
    if arr.size == 0 and arr.ndim == 1:
        return np.zeros(0, dtype=np.int64)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise TypeError(
            f"{name} must be a 1-D integer array, got shape {arr.shape} dtype {arr.dtype}"
        )
    return arr.astype(np.int64)
