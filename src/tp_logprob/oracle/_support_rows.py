"""The top of each row, sorted by value, with certified masses: what top-p reads.

Each rule of a support (``docs/semantics.md``, "Processed logprobs") keeps an
upper set of ``z``, and top-p reads the masses of a prefix of the descending
order. Only a row's top is needed: its first ``need`` values (every decision and
the value just past the support, :mod:`._support_rules`), found by
:func:`top_values` without sorting the row: a threshold that at least ``need``
values reach (the least of ``need`` disjoint chunks' maxima), the values at or
above it, and a partition of those. :func:`sorted_rows` then gives, for a block
of such tops (every row's maximum ``M`` finite), per sorted position ``i``:

* ``d = z - M = dh + dl`` exactly (``TwoSum``; ``dh = -inf`` for a ``-inf``
  value or a difference past the float64 range);
* the group of equal values the position belongs to (``group_start``,
  ``group_end``): every decision is per value, so per group;
* the exp term ``y = exp(d) 2^SHIFT`` from :func:`._fast_exp.exp_terms`
  (relative error ``EXP_REL``; its high part alone is within ``u + EXP_REL``),
  exactly ``2^SHIFT`` at the maximum, exactly 0 for ``-inf``, and for
  ``d < D_MIN`` (the tail) 0 with an error below ``TAIL``;
* an enclosure ``[prefix_lo, prefix_hi]`` of the exact ``sum_{k <= i} exp(d_k) 2^SHIFT``
  and ``[above_lo, above_hi]`` of the exact mass strictly above the position's
  value, ``A = sum_{z_k > z_i} exp(d_k) 2^SHIFT``.

The prefixes are numpy's ``cumsum`` (strictly sequential) of the high parts, so a
prefix of the top has the bits it has in the whole sorted row. For nonnegative
terms each computed prefix is within ``gamma_W`` of the sum of its terms (``W``
the whole row's width), each term within ``eps = (u + EXP_REL)(1 + 2^-50)``
of the exact one, and the tail terms add at most ``TAIL`` each, so with
``rho = (gamma_W + eps)(1 + 2^-18) + 4u`` (the last part covers the two
roundings of each bound below)

    c (1 - rho)  <=  exact prefix  <=  (c + n_tail TAIL)(1 + rho).

The scale ``2^SHIFT`` keeps every computed term (``>= 2^-843``) and every sum
normal, so no rounding above underflows. ``docs/tolerances.md``, "Processed
logprobs: the support", states the argument with the rest of the support's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tp_logprob.oracle._eft import U, gamma
from tp_logprob.oracle._fast_exp import D_MIN, exp_rel, exp_terms
from tp_logprob.oracle._fast_rows import SCALE, SHIFT, TAIL
from tp_logprob.oracle._inputs import BoolArray, FloatArray, IntArray

_EXP_PIECE = 1 << 14


@dataclass
class SortedRows:
    """A block of rows' tops sorted descending, ``[R, W']`` arrays per sorted position.

    A row whose top is shorter than the block's width is padded with ``-inf``.
    """

    rows: IntArray
    values: FloatArray
    m: FloatArray
    dh: FloatArray
    dl: FloatArray
    head: BoolArray
    yh: FloatArray
    group_start: IntArray
    group_end: IntArray
    prefix_lo: FloatArray
    prefix_hi: FloatArray
    above_lo: FloatArray
    above_hi: FloatArray

    @property
    def width(self) -> int:
        return int(self.values.shape[1])

    def at(self, array: FloatArray, count: IntArray) -> FloatArray:
        """``array[r, count[r] - 1]`` per row (``count >= 1``): the value at a prefix's end."""
        picked: FloatArray = np.take_along_axis(array, (count - 1)[:, None], axis=1)[:, 0]
        return picked


def term_rel() -> float:
    """Relative error of a head term's high part ``yh`` against the exact ``exp(d) 2^SHIFT``."""
    return (U + exp_rel()) * (1.0 + 2.0**-50)


def exact_differences(values: FloatArray, m: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(dh, dl)``: ``values - m[:, None] = dh + dl`` exactly, ``dl = 0`` where ``dh`` is
    not finite (``TwoSum``)."""
    with np.errstate(invalid="ignore", over="ignore"):
        dh = values - m[:, None]
        back = dh - values
        dl = (values - (dh - back)) + (-m[:, None] - back)
    dl = np.where(np.isfinite(dh), dl, 0.0)
    return dh, dl


def head_terms(dh: FloatArray, dl: FloatArray) -> tuple[BoolArray, FloatArray]:
    """``(head, yh)``: the head positions (``D_MIN <= d < 0``) and every position's high
    term (``2^SHIFT`` at the maximum, 0 elsewhere outside the head)."""
    head = (dh >= D_MIN) & (dh < 0.0)
    yh = np.zeros(dh.shape)
    where = np.flatnonzero(head)
    flat_dh, flat_dl, flat_yh = dh.reshape(-1), dl.reshape(-1), yh.reshape(-1)
    # In cache-sized pieces: each term is its own (exp_terms works elementwise).
    for start in range(0, where.size, _EXP_PIECE):
        piece = where[start : start + _EXP_PIECE]
        low = flat_dl[piece]
        flat_yh[piece] = exp_terms(flat_dh[piece], low if low.any() else None, SHIFT)[0]
    yh[dh == 0.0] = SCALE
    return head, yh


def top_values(z: FloatArray, need: IntArray) -> FloatArray:
    """Each row's ``need[r]`` largest values of ``z`` (``[R, W]``, no NaN), sorted descending,
    as ``[R, max(need)]`` padded with ``-inf``."""
    count, width = z.shape
    out = np.full((count, int(need.max(initial=1))), -np.inf)
    for r, size in enumerate(need.tolist()):
        row = z[r]
        if 4 * size >= width:
            out[r, :size] = np.sort(row)[::-1][:size]
            continue
        # Each of `size` disjoint chunks holds its maximum, so `size` values reach the
        # least of them: the row's `size` largest are among the values at or above it.
        chunk = width // size
        floor = row[: size * chunk].reshape(size, chunk).max(axis=1).min()
        candidates = row[row >= floor]
        top = np.partition(candidates, candidates.size - size)[candidates.size - size :]
        out[r, :size] = np.sort(top)[::-1]
    return out


def sorted_rows(rows: IntArray, values: FloatArray, m: FloatArray, width: int) -> SortedRows:
    """The masses of ``values`` (``[R, W']``, each row's top sorted descending, no NaN or
    ``+inf``) for rows of ``width`` columns (the bounds' ``W``)."""
    top = values.shape[1]
    dh, dl = exact_differences(values, m)
    head, yh = head_terms(dh, dl)
    tail = (values > -np.inf) & ~head & (dh != 0.0)
    rho = (gamma(max(width, 1)) + term_rel()) * (1.0 + 2.0**-18) + 4.0 * U
    prefix = np.cumsum(yh, axis=1)
    tails = np.cumsum(tail, axis=1)
    prefix_lo = prefix * (1.0 - rho)
    prefix_hi = (prefix + tails * TAIL) * (1.0 + rho)
    positions = np.broadcast_to(np.arange(top), values.shape)
    starts = np.ones(values.shape, dtype=np.bool_)
    starts[:, 1:] = values[:, 1:] != values[:, :-1]
    group_start = np.maximum.accumulate(np.where(starts, positions, 0), axis=1)
    ends = np.ones(values.shape, dtype=np.bool_)
    ends[:, :-1] = starts[:, 1:]
    group_end = np.minimum.accumulate(np.where(ends, positions + 1, top)[:, ::-1], axis=1)[:, ::-1]
    before = np.maximum(group_start - 1, 0)
    above_lo = np.where(group_start > 0, np.take_along_axis(prefix_lo, before, axis=1), 0.0)
    above_hi = np.where(group_start > 0, np.take_along_axis(prefix_hi, before, axis=1), 0.0)
    return SortedRows(
        rows,
        values,
        m,
        dh,
        dl,
        head,
        yh,
        group_start,
        np.ascontiguousarray(group_end),
        prefix_lo,
        prefix_hi,
        above_lo,
        above_hi,
    )
