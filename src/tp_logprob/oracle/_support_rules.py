"""The support rules: the exact support, and the certain sets under margins, as prefixes.

Every rule keeps an upper set of ``z``, so per row every set here is a prefix
of the descending order, given by its length, always a group boundary
(decisions are per value, and equal values get equal decisions):

1. min-p: ``n1`` values with ``d >= log(min_p)``, decided on the row as it
   lies (no order needed). ``log(min_p)`` is enclosed once per call between two
   floats a few ulps apart, ``d = dh + dl`` is compared with both exactly, and a
   ``d`` between them goes to :func:`._support_exact.min_p_keeps`;
2. top-k: ``nK`` values with ``z >= z_(k)`` (the k-th of the whole row: the
   survivors of 1 are an upper set, so their k-th largest, when they have
   ``k``, is the row's), and ``n2 = min(n1, nK)``;
3. top-p: position ``i < n2`` is kept iff ``A_i < p Z`` with ``Z`` the prefix
   at ``n2``; the enclosures of :mod:`._support_rows` settle most positions,
   truth is monotone, so the unsettled ones lie between the last certain keep
   and the first certain drop and are bisected with :class:`._support_exact.TopPRow`.

Only 3 reads the descending order, and only its first ``n2_max + 1``
positions: :func:`counts` gives 1 and 2 from the unsorted row, and
:func:`top_p_prefixes` reads the sorted top (:func:`._support_rows.top_values`). A test
that :func:`counts` evaluates per value reads as it would at each sorted
position: the first position where it fails is the number of values above the
largest failing one.

With :class:`SupportMargins` the same prefixes are computed for the certain
sets (``docs/tolerances.md``, "Processed logprobs: the support"): ``sure_in``
(certainly in) and ``maybe_in`` (not certainly out), with
``sure_in <= kept <= maybe_in``.
Each test there is evaluated in float64 with a relative slack of ``2^-40`` on
both sides (it covers the few roundings of each side and numpy's ``exp`` on a
tiny argument), so a test that cannot be decided that way leaves the token
borderline; with zero margins the certain sets are the exact ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tp_logprob.oracle._eft import U
from tp_logprob.oracle._fast_exp import D_MIN
from tp_logprob.oracle._fast_rows import SCALE, TAIL
from tp_logprob.oracle._fast_stats import record
from tp_logprob.oracle._inputs import BoolArray, FloatArray, IntArray
from tp_logprob.oracle._mpfloat import from_float, mpf_log, to_float64, widen
from tp_logprob.oracle._support_exact import TopPRow, min_p_keeps
from tp_logprob.oracle._support_rows import (
    SortedRows,
    exact_differences,
    head_terms,
    term_rel,
    top_values,
)
from tp_logprob.oracle.support_tolerance import SupportMargins

_SLACK_REL = 2.0**-40


@dataclass(frozen=True)
class Rules:
    """Checked sampling parameters; None = the rule is off."""

    top_k: int | None
    top_p: float | None
    min_p: float | None


@dataclass
class Prefixes:
    """Per row of a block: the exact support's length, and the certain sets' (margins given)."""

    kept: IntArray
    sure_in: IntArray
    maybe_in: IntArray


def counts(
    z: FloatArray, m: FloatArray, rules: Rules, margins: SupportMargins | None, fast: bool
) -> tuple[Prefixes, FloatArray | None]:
    """``(n2, n2_in, n2_max)`` of a block of rows ``z`` (``[R, W]``, unsorted) with maxima ``m``:
    min-p, then top-k; and the sorted top that top-k read (its ``k + 1`` largest), if any."""
    count, width = z.shape
    full = np.full(count, width, dtype=np.int64)
    n1 = n1_in = n1_max = full
    if rules.min_p is not None:
        dh, dl = exact_differences(z, m)
        n1 = _min_p_kept(z, dh, dl, m, rules.min_p, fast)
        n1_in = n1_max = n1
        if margins is not None and not margins.min_p_exact:
            n1_in, n1_max = _min_p_certain(z, dh, dl, rules.min_p, margins, n1)
    n_k, top = full, None
    if rules.top_k is not None and rules.top_k < width:
        k = rules.top_k
        top = top_values(z, np.full(count, k + 1))
        kth = top[:, k - 1]
        # Below the k-th value at k + 1: exactly k values reach it; else count the tie.
        n_k = np.full(count, k, dtype=np.int64)
        tied = np.flatnonzero(top[:, k] == kth)
        n_k[tied] = (z[tied] >= kth[tied, None]).sum(axis=1)
    prefixes = Prefixes(np.minimum(n1, n_k), np.minimum(n1_in, n_k), np.minimum(n1_max, n_k))
    return prefixes, top


def top_p_prefixes(
    rows: SortedRows, top_p: float, margins: SupportMargins | None, fast: bool, found: Prefixes
) -> Prefixes:
    """The top-p prefixes of a block's sorted tops ``rows`` (each row's first
    ``found.maybe_in + 1`` positions at least) after min-p and top-k (``found``)."""
    n2, n2_in, n2_max = found.kept, found.sure_in, found.maybe_in
    n3 = _top_p_kept(rows, top_p, n2, fast)
    if margins is None:
        return Prefixes(n3, n3, n3)
    mu = margins.top_p_margin(top_p)
    n3_in, n3_max = _top_p_certain(rows, top_p, mu, n2_in, n2_max, n3)
    if mu == 0.0:
        settled = n2_in == n2_max  # no min-p borderline: the exact decisions stand
        n3_in, n3_max = np.where(settled, n3, n3_in), np.where(settled, n3, n3_max)
    return Prefixes(n3, n3_in, n3_max)


def _first_false(z: FloatArray, flags: BoolArray) -> IntArray:
    """Per row, the first sorted position whose value fails ``flags`` (the width when none
    does): the number of values above the largest failing one."""
    failing = ~flags
    largest = np.where(failing, z, -math.inf).max(axis=1)
    above = (z > largest[:, None]).sum(axis=1)
    first: IntArray = np.where(failing.any(axis=1), above, z.shape[1])
    return first


def _after_last_false(z: FloatArray, flags: BoolArray) -> IntArray:
    """Per row, one past the last sorted position whose value fails ``flags`` (0 when none
    does): the number of values at or above the least failing one."""
    failing = ~flags
    least = np.where(failing, z, math.inf).min(axis=1)
    reached = (z >= least[:, None]).sum(axis=1)
    last: IntArray = np.where(failing.any(axis=1), reached, 0)
    return last


def _first_false_position(flags: BoolArray) -> IntArray:
    """Per row of sorted positions, the index of the first False (the width when there is none)."""
    first: IntArray = np.where(flags.all(axis=1), flags.shape[1], np.argmin(flags, axis=1))
    return first


def _after_last_false_position(flags: BoolArray) -> IntArray:
    """Per row of sorted positions, one past the index of the last False (0 when there is none)."""
    width = flags.shape[1]
    last: IntArray = np.where(flags.all(axis=1), 0, width - np.argmin(flags[:, ::-1], axis=1))
    return last


def log_bounds(min_p: float) -> tuple[float, float]:
    """Floats ``lo <= log(min_p) <= hi`` (equal, 0, for ``min_p = 1``)."""
    if min_p == 1.0:
        return 0.0, 0.0
    bits = 96
    log_p = mpf_log(from_float(min_p), bits, "n")
    lo = to_float64(widen(log_p, bits, up=False))
    hi = to_float64(widen(log_p, bits, up=True))
    return float(np.nextafter(lo, -math.inf)), float(np.nextafter(hi, math.inf))


def _min_p_kept(
    z: FloatArray, dh: FloatArray, dl: FloatArray, m: FloatArray, min_p: float, fast: bool
) -> IntArray:
    """``n1``: values with ``d >= log(min_p)``, decided exactly (once per distinct value)."""
    if fast or min_p == 1.0:
        lo, hi = log_bounds(min_p)
        keep = (dh > hi) | ((dh == hi) & (dl >= 0.0))
        drop = (dh < lo) | ((dh == lo) & (dl < 0.0))
    else:
        keep = dh == 0.0
        drop = dh == -math.inf
    unsure = ~keep & ~drop
    pending = np.flatnonzero(unsure.any(axis=1))
    for r in pending.tolist():
        row, top = z[r], float(m[r])
        for value in np.unique(row[unsure[r]]).tolist():
            keep[r, row == value] = min_p_keeps(value, top, min_p)
    record("support_min_p", dh.shape[0] - pending.size, pending.size)
    kept: IntArray = keep.sum(axis=1)
    return kept


def _min_p_certain(
    z: FloatArray,
    dh: FloatArray,
    dl: FloatArray,
    min_p: float,
    margins: SupportMargins,
    n1: IntArray,
) -> tuple[IntArray, IntArray]:
    """``(n1_in, n1_max)``: min-p survivors for every backend within the margins, and for some."""
    eps = term_rel()
    head, yh = head_terms(dh, dl)
    is_max = dh == 0.0
    tail = (z > -math.inf) & ~head & ~is_max
    mass_lo = np.where(head, yh * (1.0 - eps), 0.0) + np.where(is_max, SCALE, 0.0)
    mass_hi = np.where(head, yh * (1.0 + 2.0 * eps), 0.0) + np.where(is_max, SCALE, 0.0)
    mass_hi = np.where(tail, TAIL, mass_hi)
    # exp(d (1 +- a)) within exp(-+a |d|) of exp(d); a tail term's |d| counts as -D_MIN
    # (its bound TAIL is exp(D_MIN + 1) 2^SHIFT, and exp(d (1 - a)) grows with d).
    spread = margins.arg_rel * np.minimum(-dh, -D_MIN)
    tau = margins.abs_error * SCALE
    low = mass_lo * np.exp(-spread) * (1.0 - margins.term_rel) * (1.0 - _SLACK_REL) - tau
    high = mass_hi * np.exp(spread) * (1.0 + margins.term_rel) * (1.0 + _SLACK_REL) + tau
    threshold = min_p * SCALE
    t_lo = threshold * (1.0 - margins.threshold_rel) * (1.0 - _SLACK_REL) - tau
    t_hi = threshold * (1.0 + margins.threshold_rel) * (1.0 + _SLACK_REL) + tau
    sure_in = (low >= t_hi) | is_max
    sure_out = (high < t_lo) & ~is_max
    return np.minimum(_first_false(z, sure_in), n1), np.maximum(_after_last_false(z, sure_out), n1)


def _top_p_kept(rows: SortedRows, top_p: float, n2: IntArray, fast: bool) -> IntArray:
    """``n3``: the exact top-p prefix of the first ``n2`` positions."""
    count, width = rows.values.shape
    inside = np.arange(width) < n2[:, None]
    if fast:
        # p Z rounded twice: the factors 1 -+ 4u put each bound on the safe side of it.
        z_lo = rows.at(rows.prefix_lo, n2) * top_p * (1.0 - 4.0 * U)
        z_hi = rows.at(rows.prefix_hi, n2) * top_p * (1.0 + 4.0 * U)
        keep = inside & (rows.above_hi < z_lo[:, None])
        drop = ~inside | (rows.above_lo > z_hi[:, None])
    else:
        keep = inside & (rows.group_start == 0)
        drop = ~inside
    keep[:, 0] = True  # the maximum: A = 0 < p Z
    drop |= rows.values == -math.inf  # A = Z >= p Z
    picked = np.arange(count)
    last_keep = width - 1 - np.argmax(keep[:, ::-1], axis=1)
    low = rows.group_end[picked, last_keep]
    first_drop = np.argmax(drop, axis=1)
    high = np.where(drop.any(axis=1), rows.group_start[picked, first_drop], width)
    if (low > high).any():
        raise RuntimeError("exact oracle: certified top-p decisions contradict each other")
    pending = np.flatnonzero(low < high)
    for r in pending.tolist():
        values = rows.values[r, : n2[r]]
        exact = TopPRow(values[values > -math.inf], top_p)
        lo, hi = int(low[r]), int(high[r])
        while lo < hi:
            middle = (lo + hi) // 2
            if exact.keeps(float(rows.values[r, middle])):
                lo = int(rows.group_end[r, middle])
            else:
                hi = int(rows.group_start[r, middle])
        low[r] = lo
    record("support_top_p", count - pending.size, pending.size)
    kept: IntArray = low
    return kept


def _top_p_certain(
    rows: SortedRows,
    top_p: float,
    mu: float,
    n2_in: IntArray,
    n2_max: IntArray,
    n3: IntArray,
) -> tuple[IntArray, IntArray]:
    """``(n3_in, n3_max)`` for survivor totals anywhere in ``[Z(n2_in), Z(n2_max)]``."""
    positions = np.arange(rows.width)
    z_min = rows.at(rows.prefix_lo, n2_in)[:, None]
    z_max = rows.at(rows.prefix_hi, n2_max)[:, None]
    with np.errstate(over="ignore", invalid="ignore"):
        lhs = (rows.above_hi + mu * z_max) * (1.0 + _SLACK_REL)
        sure_in = (positions < n2_in[:, None]) & (lhs < top_p * z_min * (1.0 - _SLACK_REL))
        drop = rows.above_lo * (1.0 - _SLACK_REL) >= (top_p + mu) * z_max * (1.0 + _SLACK_REL)
    sure_in[:, 0] = True
    sure_out = (positions >= n2_max[:, None]) | drop
    sure_out[:, 0] = False
    # The top reaches past n2_max (or is the whole row), so both prefixes end inside it.
    n3_in = _first_false_position(sure_in)
    return np.minimum(n3_in, n3), np.maximum(_after_last_false_position(sure_out), n3)


def float_values(values: FloatArray, index: IntArray) -> FloatArray:
    """``values[r, index[r]]`` per row, NaN where ``index`` is past the row."""
    width = values.shape[1]
    inside = index < width
    picked = np.take_along_axis(values, np.minimum(index, width - 1)[:, None], axis=1)[:, 0]
    out: FloatArray = np.where(inside, picked, math.nan)
    return out
