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
from tp_logprob.rollout.trainer import dense_mask, logit_rows

__all__ = [
    "kth_largest",
    "screen_masks",
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
    value than it keeps). The few rows it flags are explained."""
    c = classify_support(x, margins=margins, real_vocab_size=rv, temperature=temperature, **params)
    count = x.shape[0]
    offsets = rollout.support.kept_offsets
    sizes = np.diff(offsets[begin : begin + count + 1])
    row = np.repeat(np.arange(count), sizes)
    ids = np.asarray(rollout.support.kept_ids[offsets[begin] : offsets[begin + count]])
    values = c.z[row, ids]
    live = ~np.isnan(values)
    lowest = np.full(count, math.inf)
    np.minimum.at(lowest, row[live], values[live])
    with np.errstate(invalid="ignore"):
        reached = (c.z >= lowest[:, None]).sum(axis=1)
    flagged = (
        (~c.defined & (sizes > 0))
        | (np.bincount(row, ~live, minlength=count) > 0)
        | (np.bincount(row, c.certainly_out[row, ids], minlength=count) > 0)
        | (c.certainly_in.sum(axis=1) > np.bincount(row, c.certainly_in[row, ids], minlength=count))
        | (reached > np.bincount(row, live, minlength=count))
    )
    found = {}
    for offset in np.flatnonzero(rollout.has_mask[begin : begin + count] & flagged).tolist():
        mask = dense_mask(rollout, np.array([begin + offset]), c.z.shape[1])
        missing = np.flatnonzero(c.certainly_in[offset] & ~mask[0])
        extra = np.flatnonzero(c.certainly_out[offset] & mask[0])
        upper = admissible_support(_one_row(c, offset), mask)
        if missing.size or extra.size or upper:
            found[begin + offset] = support_detail(missing, extra, upper)
    return found


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


def top_columns(
    x: npt.NDArray[np.float32], top_k: int, mask: npt.NDArray[np.bool_] | None = None
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """Each row's columns at or above its ``top_k``-th largest value (and those ``mask``
    keeps), in column order: their values, padded with -inf, and their column ids, padded
    with -1."""
    kth = kth_largest(x, top_k)[:, None]
    chosen = x >= kth if mask is None else (x >= kth) | mask
    rows, found = _where(chosen)
    sizes = np.bincount(rows, minlength=x.shape[0])
    places = np.arange(rows.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    width = int(sizes.max(initial=0))
    values = np.full((x.shape[0], width), -np.inf, dtype=np.float32)
    ids = np.full((x.shape[0], width), -1, dtype=np.int64)
    values[rows, places] = x[rows, found]
    ids[rows, places] = found
    return values, ids


def kth_largest(x: npt.NDArray[np.float32], k: int) -> npt.NDArray[np.float32]:
    """Each row's ``k``-th largest value (ties counted, as :func:`numpy.partition` does).

    The ``k``-th largest of every :data:`SAMPLE_STRIDE`-th column is a floor that at least
    ``k`` columns reach, so the row's ``k``-th largest is among the columns at or above it:
    one comparison over the row and a partition of a few thousand values, instead of a
    partition of the whole row."""
    width = x.shape[1]
    sample = x[:, ::SAMPLE_STRIDE]
    if sample.shape[1] < k:
        return np.asarray(np.partition(x, width - k, axis=1)[:, width - k], dtype=np.float32)
    floor = np.partition(sample, sample.shape[1] - k, axis=1)[:, sample.shape[1] - k]
    rows, columns = _where(x >= floor[:, None])
    sizes = np.bincount(rows, minlength=x.shape[0])
    places = np.arange(rows.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    reached = np.full((x.shape[0], int(sizes.max(initial=k))), -np.inf, dtype=np.float32)
    reached[rows, places] = x[rows, columns]
    last = reached.shape[1] - k
    return np.asarray(np.partition(reached, last, axis=1)[:, last], dtype=np.float32)


def _where(chosen: npt.NDArray[np.bool_]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """``np.nonzero`` of a 2-D array, from its flat one (several times faster)."""
    flat = np.flatnonzero(chosen)
    rows, columns = np.divmod(flat, chosen.shape[1])
    return rows, columns
