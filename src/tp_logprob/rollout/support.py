"""The returned mask against the sampling rules, the op's numerics and the logit noise.

With sampling parameters given, each mask is first screened against the rules on
the trainer's logits with the op's error margins
(:func:`~tp_logprob.oracle.classify_support`, :func:`~tp_logprob.oracle.admissible_support`):
a mask they admit is fine. A mask they refuse is judged again under the logit
noise (:mod:`tp_logprob.rollout.borderline`): ``borderline`` where every decision
the rules refuse can flip within ``eps``, else ``support``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.engine_formats import EngineRollout
from tp_logprob.oracle import (
    SupportClassification,
    admissible_support,
    classify_support,
)
from tp_logprob.oracle.temperature import checked_temperature
from tp_logprob.rollout.trainer import dense_mask, logit_rows

__all__ = [
    "kth_largest",
    "screen_masks",
    "screened_columns",
    "tempered_top_columns",
    "top_columns",
]

SAMPLE_STRIDE = 16
""":func:`kth_largest` reads every this-many-th column first."""


def screen_masks(
    columns: list[Any],
    rollout: EngineRollout,
    margins: Any,
    rv: int,
    temperature: float,
    params: dict[str, Any],
    rows_per_block: int,
) -> dict[int, str]:
    """:func:`_support_problems` of every block of rows."""

    problems: dict[int, str] = {}
    for start in range(0, rollout.num_tokens, rows_per_block):
        end = min(rollout.num_tokens, start + rows_per_block)
        x = logit_rows(columns, slice(start, end))
        problems.update(_support_problems(x, rollout, start, margins, rv, temperature, params))
    return problems


def _support_problems(
    x: npt.NDArray[np.float32],
    rollout: EngineRollout,
    begin: int,
    margins: Any,
    rv: int,
    temperature: float,
    params: dict[str, Any],
) -> dict[int, str]:
    """Per active row of rows ``begin:begin + len(x)`` whose mask is not an admissible
    support of ``params``: what differs.

    The rows are screened at once, from their kept ids, for what :func:`admissible_support`
    refuses: a kept column where the support is undefined, on padding or certainly out; a
    certainly-in column not kept (more certainly-in columns than kept ones among them); a
    kept set that is not an upper set of ``z`` (more live columns at or above its least
    value than it keeps). With top-k they are screened on each row's top columns
    (:func:`screened_columns`), which give the whole row's answers. The few rows it flags
    are explained."""
    count = x.shape[0]
    offsets = rollout.support.kept_offsets
    sizes = np.diff(offsets[begin : begin + count + 1])
    row = np.repeat(np.arange(count), sizes)
    ids = np.asarray(rollout.support.kept_ids[offsets[begin] : offsets[begin + count]])
    narrowed = screened_columns(x, row, ids, rv, temperature, params.get("top_k"))
    if narrowed is None:
        c = classify_support(
            x, margins=margins, real_vocab_size=rv, temperature=temperature, **params
        )
        columns, local = None, ids
    else:
        z, columns = narrowed
        c = classify_support(
            z, margins=margins, real_vocab_size=z.shape[1], row_width=rv, **params
        )  # z is tempered already: T = 1 divides by nothing
        local = _places(columns, row, ids)
    values = c.z[row, local]
    live = ~np.isnan(values)
    lowest = np.full(count, math.inf)
    np.minimum.at(lowest, row[live], values[live])
    with np.errstate(invalid="ignore"):
        reached = (c.z >= lowest[:, None]).sum(axis=1)
    flagged = (
        (~c.defined & (sizes > 0))
        | (np.bincount(row, ~live, minlength=count) > 0)
        | (np.bincount(row, c.certainly_out[row, local], minlength=count) > 0)
        | (
            c.certainly_in.sum(axis=1)
            > np.bincount(row, c.certainly_in[row, local], minlength=count)
        )
        | (reached > np.bincount(row, live, minlength=count))
    )
    found = {}
    for offset in np.flatnonzero(rollout.has_mask[begin : begin + count] & flagged).tolist():
        kept = np.zeros(c.z.shape[1], dtype=np.bool_)
        kept[local[row == offset]] = True
        missing = np.flatnonzero(c.certainly_in[offset] & ~kept)
        extra = np.flatnonzero(c.certainly_out[offset] & kept)
        if columns is not None:
            missing, extra = columns[offset, missing], columns[offset, extra]
        upper: list[str] = []
        if not (missing.size or extra.size):
            # Its columns up to its largest id narrowed to: none past it reaches the kept
            # values (:func:`screened_columns`), so the same message.
            width = x.shape[1] if columns is None else int(columns[offset].max()) + 1
            whole = dense_mask(rollout, np.array([begin + offset]), width)
            one = _one_row(c, offset) if columns is None else _widened(c, offset, columns, whole)
            upper = admissible_support(one, whole)
        if missing.size or extra.size or upper:
            found[begin + offset] = support_detail(missing, extra, upper)
    return found


def screened_columns(
    x: npt.NDArray[np.float32],
    row: npt.NDArray[np.int64],
    ids: npt.NDArray[Any],
    rv: int,
    temperature: float,
    top_k: int | None,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]] | None:
    """Each row's tempered logits ``z = fp32(x) / fp32(T)`` on the columns where its mask
    can be refused, with their ids (:func:`top_columns`: at or above the row's k-th largest
    ``z``, and its kept ids ``ids`` on rows ``row``); None where the whole rows are needed
    (no top-k, a kept id on padding, or a row whose maximum is not finite).

    Why these columns give the whole row's classification (the margins widen the mass
    comparisons of min-p and top-p only, never top-k's comparison of values):

    * every rule keeps an upper set of ``z``, and top-k keeps none below the k-th
      largest ``z_(k)``: the not-certainly-out prefix (``maybe_in``) is at most top-k's
      ``nK`` columns, the certainly-in one too, so every column below ``z_(k)`` is
      certainly out, and every certainly-in column is among the columns kept here;
    * every prefix of the rules is ``min(|U|, nK)`` for an upper set ``U`` of ``z``, or
      one within ``nK`` decided by the sorted top's first ``nK`` values and their masses,
      which the columns kept here hold in full; the value past ``nK`` (the first
      certainly-out one) is below ``z_(k)`` in both, so each column kept here gets the
      same certainly-in and certainly-out as in the whole row, the padding ``-inf``
      columns certainly out;
    * the prefix sums' error bound is stated for the whole row (``row_width``).

    So the screen's tests read the same answers: each kept id's, the count of
    certainly-in columns, and the columns at or above the least kept ``z`` (all kept here
    when that ``z`` reaches ``z_(k)``; below it the kept id is certainly out, and the row
    is refused either way). ``z`` is narrowed, not ``x``: ``fl(x / T)`` can tie two
    values of ``x`` at the boundary."""
    if top_k is None or top_k >= rv or (ids >= rv).any():
        return None
    z = x[:, :rv]
    t32 = checked_temperature(temperature)
    if t32 != 1.0:
        with np.errstate(over="ignore", under="ignore"):
            z = np.divide(z, np.float32(t32), dtype=np.float32)
    if not np.isfinite(z.max(axis=1)).all():
        return None
    kth, rows, columns = _kth_and_candidates(z, top_k)
    if rows is None or columns is None:
        mask = np.zeros(z.shape, dtype=np.bool_)
        mask[row, ids] = True
        return top_columns(z, top_k, mask)
    # The columns at or above the k-th are among the candidates: with the kept ids, each
    # row's in column order (the keys sort by row, then column).
    width = z.shape[1]
    reach = z[rows, columns] >= kth[rows]
    keys = np.unique(np.concatenate([rows[reach] * width + columns[reach], row * width + ids]))
    rows, columns = np.divmod(keys, width)
    return _padded(z, rows, columns)


def _places(
    columns: npt.NDArray[np.int64], row: npt.NDArray[np.int64], ids: npt.NDArray[Any]
) -> npt.NDArray[np.int64]:
    """Where each kept id (on row ``row``) sits among its row's ``columns`` (in column
    order, padded with -1, every kept id among them)."""
    width = int(columns.max(initial=0)) + 2
    keys = np.where(columns < 0, width - 1, columns) + width * np.arange(len(columns))[:, None]
    found = np.searchsorted(keys.ravel(), ids + width * row)
    return np.asarray(found - columns.shape[1] * row, dtype=np.int64)


def _widened(
    c: SupportClassification,
    row: int,
    columns: npt.NDArray[np.int64],
    whole: npt.NDArray[np.bool_],
) -> SupportClassification:
    """Row ``row`` of ``c``, classified on its ``columns``, as a row as wide as ``whole``
    (at least its largest id): every other column certainly out with no ``z`` (none of
    them reaches the row's kept values, :func:`screened_columns`)."""
    width = whole.shape[1]
    picked = columns[row] >= 0
    where = columns[row, picked]
    certainly_in = np.zeros((1, width), dtype=np.bool_)
    certainly_out = np.ones((1, width), dtype=np.bool_)
    z = np.full((1, width), math.nan)
    exact = np.zeros((1, width), dtype=np.bool_)
    certainly_in[0, where] = c.certainly_in[row, picked]
    certainly_out[0, where] = c.certainly_out[row, picked]
    z[0, where] = c.z[row, picked]
    exact[0, where] = c.exact.mask[row, picked]
    e = c.exact
    return SupportClassification(
        certainly_in, certainly_out, c.defined[row : row + 1],
        type(e)(exact, e.threshold[row : row + 1], e.defined[row : row + 1],
                e.size[row : row + 1]),
        z,
    )  # fmt: skip


def _one_row(c: Any, row: int) -> Any:
    exact = c.exact
    return SupportClassification(
        c.certainly_in[row : row + 1],
        c.certainly_out[row : row + 1],
        c.defined[row : row + 1],
        type(exact)(exact.mask[row : row + 1], exact.threshold[row : row + 1],
                    exact.defined[row : row + 1], exact.size[row : row + 1]),
        c.z[row : row + 1],
    )  # fmt: skip


def support_detail(missing: Any, extra: Any, upper: list[str]) -> str:
    parts = []
    if missing.size:
        parts.append(f"the mask drops {_ids(missing)}, which the rules keep")
    if extra.size:
        parts.append(f"the mask keeps {_ids(extra)}, which the rules drop")
    if not parts:
        parts.append(upper[0].partition(": ")[2])
    return "; ".join(parts)


def _ids(values: Any, limit: int = 6) -> str:
    shown = ", ".join(str(int(v)) for v in values[:limit])
    more = f" and {values.size - limit} more" if values.size > limit else ""
    return f"token{'s' if values.size > 1 else ''} {shown}{more}"


def tempered_top_columns(
    x: npt.NDArray[np.float32], top_k: int, temperature: float
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]] | None:
    """Each row's columns of ``x`` at or above its ``top_k``-th largest tempered logit
    ``fl(x / T)``, the values top-k ranks (:func:`top_columns` on ``z``, the values read
    back from ``x``); None where a row's largest ``z`` is not finite, which only the whole
    row decides."""
    z = x
    t32 = checked_temperature(temperature)
    if t32 != 1.0:
        with np.errstate(over="ignore", under="ignore"):
            z = np.divide(x, np.float32(t32), dtype=np.float32)
    if not np.isfinite(z.max(axis=1)).all():
        return None
    _, ids = top_columns(z, top_k)
    values = np.take_along_axis(x, np.maximum(ids, 0), axis=1)
    return np.where(ids >= 0, values, np.float32(-np.inf)).astype(np.float32), ids


def top_columns(
    x: npt.NDArray[np.float32], top_k: int, mask: npt.NDArray[np.bool_] | None = None
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """Each row's columns at or above its ``top_k``-th largest value (and those ``mask``
    keeps), in column order: their values, padded with -inf, and their column ids, padded
    with -1."""
    kth = kth_largest(x, top_k)[:, None]
    chosen = x >= kth if mask is None else (x >= kth) | mask
    rows, found = _where(chosen)
    return _padded(x, rows, found)


def _padded(
    x: npt.NDArray[np.float32], rows: npt.NDArray[Any], columns: npt.NDArray[Any]
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """The values of ``x`` at ``(rows, columns)`` (sorted by row, then column), each row's
    first, padded with -inf, and their column ids, padded with -1."""
    sizes = np.bincount(rows, minlength=x.shape[0])
    places = np.arange(rows.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    width = int(sizes.max(initial=0))
    values = np.full((x.shape[0], width), -np.inf, dtype=np.float32)
    ids = np.full((x.shape[0], width), -1, dtype=np.int64)
    values[rows, places] = x[rows, columns]
    ids[rows, places] = columns
    return values, ids


def kth_largest(x: npt.NDArray[np.float32], k: int) -> npt.NDArray[np.float32]:
    """Each row's ``k``-th largest value (ties counted, as :func:`numpy.partition` does).

    The ``k``-th largest of every :data:`SAMPLE_STRIDE`-th column is a floor that at least
    ``k`` columns reach, so the row's ``k``-th largest is among the columns at or above it:
    one comparison over the row and a partition of a few thousand values, instead of a
    partition of the whole row."""
    return _kth_and_candidates(x, k)[0]


def _kth_and_candidates(
    x: npt.NDArray[np.float32], k: int
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.intp] | None, npt.NDArray[np.intp] | None]:
    """:func:`kth_largest`, and the columns at or above the sampled floor it read (every
    column at or above the k-th among them; by row, then column), or None with a row too
    narrow to sample (the whole row was partitioned)."""
    width = x.shape[1]
    sample = x[:, ::SAMPLE_STRIDE]
    if sample.shape[1] < k:
        kth = np.partition(x, width - k, axis=1)[:, width - k]
        return np.asarray(kth, dtype=np.float32), None, None
    floor = np.partition(sample, sample.shape[1] - k, axis=1)[:, sample.shape[1] - k]
    rows, columns = _where(x >= floor[:, None])
    sizes = np.bincount(rows, minlength=x.shape[0])
    places = np.arange(rows.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    reached = np.full((x.shape[0], int(sizes.max(initial=k))), -np.inf, dtype=np.float32)
    reached[rows, places] = x[rows, columns]
    last = reached.shape[1] - k
    kth = np.partition(reached, last, axis=1)[:, last]
    return np.asarray(kth, dtype=np.float32), rows, columns


def _where(chosen: npt.NDArray[np.bool_]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """``np.nonzero`` of a 2-D array, from its flat one (several times faster)."""
    flat = np.flatnonzero(chosen)
    rows, columns = np.divmod(flat, chosen.shape[1])
    return rows, columns
