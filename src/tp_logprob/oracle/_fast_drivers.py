"""The fast path's drivers: rows in, certified results and a mask of what was certified out.

Rows are taken in blocks of about :data:`_BLOCK_VALUES` values. A wide row whose
values are all bfloat16 values is first reduced to its distinct values and
their counts with one count over its 16-bit patterns (values are exact, so
``+0.0`` and ``-0.0`` may sit in two slots: both are counted), one row at a
time. One such row's LSE (:func:`logsumexp`) takes a short way: its maximum read
from its patterns, the first phase on its distinct values, then the stage on
plain floats, without the batch's bookkeeping. A row is
attempted when its live maximum is finite; each quantity the caller asks for
is counted as a hit (certified here) or a fallback (the caller runs the Ziv
loop for it). The elementwise rules the Ziv loop applies before certifying
anything (values far below the maximum give a signed zero, ``-inf`` columns
``0.0``) are applied here in the same form, so the two paths agree bit for bit.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np
from numpy.typing import NDArray

from tp_logprob.oracle import _fast_bins as bins
from tp_logprob.oracle import _fast_grads as grads
from tp_logprob.oracle import _fast_rows as rows
from tp_logprob.oracle._eft import U, gamma, tree_error_factor, tree_sum
from tp_logprob.oracle._exact_entropy import ENTROPY_UNDERFLOW_D
from tp_logprob.oracle._exact_row import UNDERFLOW_D, underflow_cutoff
from tp_logprob.oracle._fast_stats import record
from tp_logprob.oracle._inputs import BoolArray, FloatArray, IntArray

_F = TypeVar("_F", bound=Callable[..., Any])
_T = TypeVar("_T", bound=np.generic)


def _quiet(func: _F) -> _F:
    """Overflow and invalid operations only ever put inf or NaN in an enclosure, which
    :func:`._fast_rows.certify` refuses: those rows go to the Ziv loop."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            return func(*args, **kwargs)

    return cast(_F, wrapper)


_BLOCK_VALUES = 1 << 16
# The binned phase bins a block in row groups and keeps only per-bin arrays for
# the whole block: larger blocks mean fewer calls.
_BIN_BLOCK_VALUES = 1 << 18
_BINS_PER_VALUE = 2
_DEDUP_MIN = 8192
_KEYS = 1 << 16


@dataclass
class _Block:
    """Rows ``rows`` of the batch as ``values [R, K]`` (``counts`` for a deduplicated row)."""

    rows: IntArray
    values: FloatArray
    counts: FloatArray | None = None
    keys: IntArray | None = None  # deduplicated: each live column's 16-bit pattern
    present: IntArray | None = None  # and the patterns present, in slot order

    def expand(self, per_value: NDArray[_T]) -> NDArray[_T]:
        """Per-value results ``[R, K]`` as per-column results ``[R, V]``."""
        if self.keys is None or self.present is None:
            return per_value
        slot_of_key = np.zeros(_KEYS, dtype=np.intp)
        slot_of_key[self.present] = np.arange(self.present.size)
        return per_value[:, slot_of_key[self.keys]]

    @property
    def patterns(self) -> IntArray | None:
        """Each value's 16-bit pattern (``[1, K]``), for a deduplicated row."""
        return None if self.present is None else self.present[None, :]

    def column(self, columns: IntArray) -> IntArray:
        """The index into ``values[row]`` of one column per row."""
        if self.keys is None or self.present is None:
            return columns
        return np.searchsorted(self.present, self.keys[columns])


def _bf16_keys(row: FloatArray | None, source: NDArray[Any] | None) -> IntArray | None:
    """The 16-bit patterns of ``row`` when every value is a bfloat16 value, else None.

    ``source`` is the caller's array for the same values (float32 or bfloat16,
    or None): its bits give the patterns without a conversion (``row`` may then
    be None).
    """
    if source is not None and source.dtype.itemsize == 2:
        return source.view(np.uint16).astype(np.intp)
    if source is not None and source.dtype == np.float32:
        bits = source.view(np.uint32)
        # A bfloat16 value's low 16 bits are zero: so are those of the bits' OR.
        if bits[:64].astype(np.uint16).any() or int(np.bitwise_or.reduce(bits)) & 0xFFFF:
            return None
        return np.right_shift(bits, 16, out=np.empty(bits.size, np.intp), casting="unsafe")
    if row is None:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        probe = row[:64].astype(np.float32)
        if (probe.view(np.uint32) & 0xFFFF).any() or not np.array_equal(probe, row[:64]):
            return None
        as32 = row.astype(np.float32)
    bits = as32.view(np.uint32)
    if (bits & 0xFFFF).any() or not np.array_equal(as32, row):
        return None
    return (bits >> 16).astype(np.intp)


# numpy 1.25 gave ``add.at`` a fast loop for an integer index: then it counts
# 16-bit patterns about 15% faster than ``bincount``, which first scans for the
# extremes. Both give the same counts.
_ADD_AT_COUNTS = np.lib.NumpyVersion(np.__version__) >= "1.25.0"


def _count(keys: IntArray) -> NDArray[np.signedinteger[Any]]:
    """How many of ``keys`` (each in ``[0, 2^16)``) hold each 16-bit pattern: int32
    counts where no count can reach ``2^31`` (half the memory to scan afterwards)."""
    if not _ADD_AT_COUNTS or keys.size >= 2**31:
        return np.bincount(keys, minlength=_KEYS)
    counts = np.zeros(_KEYS, dtype=np.int32)
    np.add.at(counts, keys, np.int32(1))
    return counts


@dataclass
class _Patterns:
    """A bfloat16-valued row as 16-bit patterns: each column's (``keys``), the distinct
    ones (``present``, ascending) and how often each occurs (``counts``, float64)."""

    keys: IntArray
    present: IntArray
    counts: FloatArray

    def top(self) -> float:
        """The row's maximum, read from its patterns; NaN when a NaN is present (a
        negative NaN sorts last, a positive one is the highest pattern's value)."""
        if self.present[-1] > bins.NEGATIVE_INF:
            return math.nan
        return float(bins.bf16_grid()[0][self.present[bins.highest(self.present)]])


def _patterns(row: FloatArray | None, source: NDArray[Any] | None) -> _Patterns | None:
    """The :class:`_Patterns` of a bfloat16-valued row, else None (see :func:`_bf16_keys`)."""
    keys = _bf16_keys(row, source)
    if keys is None:
        return None
    counts = _count(keys)
    present = np.flatnonzero(counts != 0)
    return _Patterns(keys, present, counts[present].astype(np.float64))


def _deduplicated(
    row_index: int, row: FloatArray | None, source: NDArray[Any] | None
) -> _Block | None:
    found = _patterns(row, source)
    if found is None:
        return None
    values = bins.bf16_grid()[0][found.present]
    return _Block(
        np.array([row_index]), values[None, :], found.counts[None, :], found.keys, found.present
    )


@dataclass
class _Batch:
    """A call's rows: their maxima (NaN for a NaN row), the rows whose maximum is
    finite (the attempted ones), and the caller's array for its bits."""

    live: FloatArray
    source: NDArray[Any] | None
    m: FloatArray
    attempt: IntArray

    def blocks(self, chosen: IntArray, block_values: int = _BLOCK_VALUES) -> Iterator[_Block]:
        """The rows ``chosen``: a wide bfloat16-valued row as one deduplicated block, made
        when it is reached (a batch holds one row's patterns at a time), the others
        in blocks of about ``block_values`` values."""
        width = self.live.shape[1]
        plain = chosen
        if width >= _DEDUP_MIN:
            rest = []
            for i in chosen.tolist():
                source = None if self.source is None else self.source[i]
                block = _deduplicated(i, self.live[i], source)
                if block is None:
                    rest.append(i)
                else:
                    yield block
            plain = np.array(rest, dtype=np.intp)
        per_block = max(1, block_values // max(width, 1))
        for start in range(0, plain.size, per_block):
            chunk = plain[start : start + per_block]
            first, last = int(chunk[0]), int(chunk[-1])
            # Consecutive rows are a view; a gather would copy the block.
            consecutive = last - first == chunk.size - 1
            yield _Block(chunk, self.live[first : last + 1] if consecutive else self.live[chunk])


def _batch(live: FloatArray, source: NDArray[Any] | None) -> _Batch:
    """The :class:`_Batch` of ``live`` (``source``: the caller's array, for its bits)."""
    if live.shape[1] == 0:
        return _Batch(live, source, np.full(live.shape[0], -math.inf), np.zeros(0, dtype=np.intp))
    m = live.max(axis=1)
    return _Batch(live, source, m, np.flatnonzero(np.isfinite(m)))


@dataclass
class Selected:
    """Per-row fast results; ``*_ok`` marks what was certified."""

    lse: FloatArray
    lse_ok: BoolArray
    selected: FloatArray
    selected_ok: BoolArray


def _settle(
    sums: rows.RowSum, target: FloatArray | None
) -> tuple[FloatArray, BoolArray, tuple[FloatArray, BoolArray] | None]:
    """``lse`` of each row and, given the rows' target values, ``selected_logp``, each
    with its certified mask. A single row runs on plain floats: the same IEEE
    operations on the same values, without the microsecond each array call costs."""
    if not isinstance(sums.m, float) and sums.m.size == 1:
        sums = rows.Sums(*(float(v[0]) for v in rows.fields(sums)))
    one = isinstance(sums.m, float)
    plain, scaled = rows.log_sum(sums)
    lse, lse_ok = rows.lse(sums, plain)
    if target is None:
        return lse, lse_ok, None
    finite = np.where(np.isfinite(target), target, sums.m)
    return lse, lse_ok, rows.selected(sums, plain, scaled, finite[0] if one else finite)


def _binned_row_sums(m_grid: FloatArray | float, w: rows.Enclosure) -> rows.Sums:
    """The first phase's ``W`` about ``M'`` as the stages' row sums (``c = 0``, ``T = W``),
    for rows (arrays) or one row (plain floats)."""
    scale = rows.SCALE
    zero = 0.0 if isinstance(m_grid, float) else np.zeros(m_grid.size)
    return rows.Sums(m_grid, zero, w.hi * scale, w.lo * scale, w.rad * scale)


def _binned_selected(
    batch: _Batch,
    target_values: FloatArray,
    active: BoolArray,
    out: Selected,
) -> IntArray:
    """The first phase (:mod:`._fast_bins`) on the attempted rows; returns the rows it
    left (an ``lse``, or an active finite target's ``selected_logp``, not certified)."""
    live, m, attempt = batch.live, batch.m, batch.attempt
    # Worth it when the row's bins (its range over 2^-Q, capped at the tail bin)
    # are not many more than its values; narrow rows go straight to the terms.
    low = live.min(axis=1) if live.shape[1] else m
    reach = np.minimum(np.floor(m * bins.SCALE_Q) + 1 - np.floor(low * bins.SCALE_Q), bins.TAIL_BIN)
    worth = (np.abs(m) < bins.M_LIMIT) & (reach <= _BINS_PER_VALUE * live.shape[1])
    tried = attempt[worth[attempt]]
    if tried.size == 0:
        return attempt
    size = live.shape[0]
    m_grid, w_h, w_l, w_rad = (np.zeros(size) for _ in range(4))
    usable = np.zeros(size, bool)
    for block in batch.blocks(tried, _BIN_BLOCK_VALUES):
        r = block.rows
        binned = bins.bin_sums(block.values, m[r], block.counts, low[r], block.patterns)
        m_grid[r], usable[r] = binned.m_grid, binned.ok
        w_h[r], w_l[r], w_rad[r] = binned.w.hi, binned.w.lo, binned.w.rad
    done = tried[usable[tried]]
    if done.size == 0:
        return attempt
    sums = _binned_row_sums(m_grid[done], rows.Enclosure(w_h[done], w_l[done], w_rad[done]))
    tv = target_values[done]
    lse, lse_ok, chosen = _settle(sums, tv if active[done].any() else None)
    out.lse[done], out.lse_ok[done] = lse, lse_ok
    if chosen is not None:
        sel, sel_ok = chosen
        out.selected[done] = np.where(tv == -math.inf, -math.inf, sel)
        out.selected_ok[done] = sel_ok | (tv == -math.inf)
    settled = out.lse_ok[attempt] & (out.selected_ok[attempt] | ~active[attempt])
    return attempt[~settled]


@_quiet
def selected_logprob(
    live: FloatArray,
    target_values: FloatArray,
    active: BoolArray,
    source: NDArray[Any] | None = None,
) -> Selected:
    """``lse`` for every row and ``selected_logp`` for active rows (``target_values`` = ``z_t``).

    The binned first phase settles most rows; the double-double terms of
    :mod:`._fast_rows` take the rest, keeping whatever the first phase certified.
    """
    n = live.shape[0]
    out = Selected(np.zeros(n), np.zeros(n, bool), np.zeros(n), np.zeros(n, bool))
    batch = _batch(live, source)
    m, attempt = batch.m, batch.attempt
    rest = _binned_selected(batch, target_values, active, out)
    for block in batch.blocks(rest):
        r = block.rows
        terms = rows.build_terms(block.values, m[r], block.counts, keep=False)
        tv = target_values[r]
        lse, lse_ok, chosen = _settle(terms, tv if active[r].any() else None)
        had = out.lse_ok[r]
        out.lse[r] = np.where(had, out.lse[r], lse)
        out.lse_ok[r] = had | lse_ok
        if chosen is None:
            continue
        sel, sel_ok = chosen
        had = out.selected_ok[r]
        out.selected[r] = np.where(had, out.selected[r], np.where(tv == -math.inf, -math.inf, sel))
        out.selected_ok[r] = had | sel_ok | (tv == -math.inf)
    asked = np.zeros(n, bool)
    asked[attempt] = True
    lse_hits = int(out.lse_ok[attempt].sum())
    record("lse", lse_hits, attempt.size - lse_hits)
    counted = asked & active & (target_values > -math.inf)
    sel_hits = int((out.selected_ok & counted).sum())
    record("selected_logp", sel_hits, int(counted.sum()) - sel_hits)
    return out


def _patterns_lse(found: _Patterns) -> float | None:
    """The first phase's certified LSE of one bfloat16-valued row, or None."""
    top = found.top()
    if not (math.isfinite(top) and abs(top) < bins.M_LIMIT):
        return None
    binned = bins.value_row_sums(top, found.counts, patterns=found.present)
    if not binned.ok:
        return None
    lse, ok, _ = _settle(_binned_row_sums(binned.m_grid, binned.w), None)
    return float(lse) if ok else None


@_quiet
def logsumexp(values: NDArray[Any], source: NDArray[Any] | None = None) -> float | None:
    """One row's certified LSE, or None (for the Ziv loop).

    ``values`` are the live values in any exact dtype, widened to float64 only if
    the batch's way needs them; ``source``, the caller's float32 or bfloat16 array
    for the same values, gives their bits. A wide bfloat16-valued row goes the
    short way first (its patterns, the first phase, the stage on plain floats):
    for one row, the batch's bookkeeping costs more than the arithmetic.
    """
    if values.size >= _DEDUP_MIN and source is not None:
        found = _patterns(None, source)
        value = None if found is None else _patterns_lse(found)
        if value is not None:
            record("lse", 1, 0)
            return value
    row = np.ascontiguousarray(values, dtype=np.float64)[None, :]
    wide = None if source is None else source[None, :]
    result = selected_logprob(row, np.zeros(1), np.zeros(1, bool), wide)
    return float(result.lse[0]) if result.lse_ok[0] else None


@_quiet
def logprob_grad(
    live: FloatArray,
    targets: IntArray,
    active: BoolArray,
    scale: float,
    grad: FloatArray,
    source: NDArray[Any] | None = None,
) -> BoolArray:
    """Write certified rows of ``([v == t] - p_v) / scale`` into ``grad``; return those rows."""
    n = live.shape[0]
    done = np.zeros(n, bool)
    batch = _batch(live, source)
    m, attempt = batch.m, batch.attempt
    attempt = attempt[active[attempt]]
    cutoff = underflow_cutoff(UNDERFLOW_D, scale)
    for block in batch.blocks(attempt):
        r = block.rows
        terms = rows.build_terms(block.values, m[r], block.counts)
        r_h, r_l, rel = grads.reciprocal(terms)
        probs = grads.probabilities(terms, r_h, r_l, rel)
        value, ok = grads.negated_quotient(probs, scale)
        values = live[r]
        with np.errstate(invalid="ignore"):
            approx_d = values - m[r][:, None]
        far = approx_d < cutoff
        row_vals = np.where(values == -math.inf, 0.0, np.where(far, -0.0, block.expand(value)))
        row_ok = (block.expand(ok) | far).all(axis=1)
        cols = targets[r]
        picked = np.arange(r.size)
        tv = values[picked, cols]
        index = block.column(cols)
        y_h = terms.yh[picked, index]
        y_l = terms.yl[picked, index]
        at_max = tv == m[r]
        t_val, t_ok = grads.target_gradient(terms, r_h, r_l, rel, y_h, y_l, at_max, scale)
        trivial = (tv == -math.inf) | (approx_d[picked, cols] < cutoff)
        row_vals[picked, cols] = np.where(trivial, 1.0 / scale, t_val)
        row_ok &= t_ok | trivial
        grad[r] = np.where(row_ok[:, None], row_vals, grad[r])
        done[r] = row_ok
    hits = int(done.sum())
    record("logprob_grad", hits, attempt.size - hits)
    return done


def _entropy_terms(
    block: _Block, m: FloatArray
) -> tuple[rows.Terms, rows.Enclosure, FloatArray, FloatArray, FloatArray, rows.Enclosure]:
    terms = rows.build_terms(block.values, m[block.rows], block.counts)
    _, scaled = rows.log_sum(terms)
    r_h, r_l, rel = grads.reciprocal(terms)
    rho = grads.ratio(grads.neg_q_terms(terms), r_h, r_l, rel)
    return terms, scaled, r_h, r_l, rel, rho


@_quiet
def entropy(
    live: FloatArray, active: BoolArray, source: NDArray[Any] | None = None
) -> tuple[FloatArray, BoolArray]:
    """Certified entropies of the active rows, and which rows they are."""
    n = live.shape[0]
    out, done = np.zeros(n), np.zeros(n, bool)
    batch = _batch(live, source)
    m, attempt = batch.m, batch.attempt
    attempt = attempt[active[attempt]]
    for block in batch.blocks(attempt):
        _, scaled, _, _, _, rho = _entropy_terms(block, m)
        out[block.rows], done[block.rows] = grads.entropy(scaled, rho)
    hits = int(done.sum())
    record("entropy", hits, attempt.size - hits)
    return out, done


@_quiet
def entropy_grad(
    live: FloatArray,
    active: BoolArray,
    scale: float,
    grad: FloatArray,
    source: NDArray[Any] | None = None,
) -> BoolArray:
    """Write certified rows of ``-p_v (z_v - LSE + H) / scale`` into ``grad``; return those rows."""
    n = live.shape[0]
    done = np.zeros(n, bool)
    batch = _batch(live, source)
    m, attempt = batch.m, batch.attempt
    attempt = attempt[active[attempt]]
    cutoff = underflow_cutoff(ENTROPY_UNDERFLOW_D, scale)
    for block in batch.blocks(attempt):
        r = block.rows
        terms, _, r_h, r_l, rel, rho = _entropy_terms(block, m)
        probs = grads.probabilities(terms, r_h, r_l, rel)
        value, ok = grads.entropy_gradient(terms, probs, rho, r_h, r_l, rel, scale)
        values = live[r]
        with np.errstate(invalid="ignore"):
            far = (values - m[r][:, None] < cutoff) | (values == -math.inf)
        row_vals = np.where(far, 0.0, block.expand(value))
        row_ok = (block.expand(ok) | far).all(axis=1)
        grad[r] = np.where(row_ok[:, None], row_vals, grad[r])
        done[r] = row_ok
    hits = int(done.sum())
    record("entropy_grad", hits, attempt.size - hits)
    return done


@_quiet
def exact_sums(terms: FloatArray) -> tuple[FloatArray, BoolArray]:
    """Row sums of float64 ``terms`` (``[R, K]``) correctly rounded, where certified.

    The pairwise :func:`._eft.tree_sum` keeps every rounding error, so
    ``root + err`` is within ``F u sum |terms|`` of the exact sum; sums that round to
    zero (exact cancellation included) and non-finite ones are left to the caller.
    """
    root, err = tree_sum(terms)
    size = terms.shape[1]
    magnitude = np.abs(terms).sum(axis=1) * (1.0 + gamma(size))
    rad = magnitude * U * tree_error_factor(size) * rows.SLACK
    value, ok, zero = rows.certify(rows.Enclosure(root, err, rad))
    ok &= ~zero
    hits = int(ok.sum())
    record("hidden_logits", hits, ok.size - hits)
    return value, ok
