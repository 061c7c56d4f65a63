"""The returned mask against the sampling rules, the op's numerics and the logit noise.

With sampling parameters given, each mask is first screened against the rules on
the trainer's logits with the op's error margins
(:func:`~tp_logprob.oracle.classify_support`, :func:`~tp_logprob.oracle.admissible_support`):
a mask they admit is fine. A mask they refuse is judged again under the logit
noise (:mod:`tp_logprob.rollout.noise`): the engine chose it from logits up to
``eps`` away, so the check tries the logits within ``eps`` that favour the mask
most (:func:`favoured_logits`) and widens the mass margins by ``exp(2 eps / T)``.
Admitted there, the row is ``borderline`` (a decision that flips within the
noise, not an engine fault); refused even there, it is ``support``.

The favoured logits are the trainer's with the kept ids raised by ``eps`` but
pulled down to a common floor (the lowest kept value plus ``eps``) where they can
reach it, and every other id lowered by ``eps``: the kept set becomes an upper set
with its tail tied wherever a perturbation of ``eps`` can make it one. For top-k
(with ties kept) and for the order of the ids this is the best perturbation there
is; for the mass rules (top-p, min-p) the widened margins cover the rest, so a
mask called ``support`` is refused by a wide margin.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.engine_formats import EngineRollout
from tp_logprob.oracle import (
    SupportClassification,
    SupportMargins,
    admissible_support,
    classify_support,
)
from tp_logprob.rollout.trainer import dense_mask, logit_rows

__all__ = [
    "favoured_logits",
    "judge_under_noise",
    "kth_largest",
    "noisy_margins",
    "screen_masks",
    "top_columns",
]

ROWS = 16
"""Rows judged at once under the noise: a few MiB at a 152k vocabulary."""
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


def noisy_margins(margins: SupportMargins, eps: float, temperature: float) -> SupportMargins:
    """``margins`` widened by a logit perturbation of ``eps``: every mass ``exp(z - M)`` and
    every sum of them moves by a factor within ``exp(+-2 eps / T)``."""
    factor = math.exp(2.0 * eps / temperature)
    return SupportMargins(
        sum_rel=(1.0 + margins.sum_rel) * factor - 1.0,
        term_rel=(1.0 + margins.term_rel) * factor - 1.0,
        arg_rel=margins.arg_rel,
        threshold_rel=(1.0 + margins.threshold_rel) * factor - 1.0,
        abs_error=margins.abs_error,
        unit=margins.unit,
    )


def favoured_logits(
    x: npt.NDArray[np.float32], mask: npt.NDArray[np.bool_], eps: float
) -> npt.NDArray[np.float32]:
    """The logits within ``eps`` of ``x`` (one row per mask row) that favour ``mask`` most."""
    step = np.float32(eps)
    with np.errstate(invalid="ignore"):
        floor = np.where(mask, x, np.float32(np.inf)).min(axis=1, keepdims=True) + step
        lowered = x - step
        raised = np.maximum(lowered, np.minimum(x + step, floor))
    return np.asarray(np.where(mask, raised, lowered), dtype=np.float32)


def judge_under_noise(
    x: npt.NDArray[np.float32],
    mask: npt.NDArray[np.bool_],
    margins: SupportMargins,
    rv: int,
    temperature: float,
    eps: float,
    params: dict[str, Any],
) -> list[bool]:
    """Per row: is ``mask`` admissible for some logits within ``eps`` of ``x``
    (:func:`favoured_logits`, :func:`noisy_margins`)?"""
    wide = noisy_margins(margins, eps, temperature)
    found = []
    for start in range(0, len(x), ROWS):
        part, kept = x[start : start + ROWS], mask[start : start + ROWS]
        width = rv
        top_k = params.get("top_k")
        if top_k is not None and top_k < rv and not kept[:, rv:].any():
            # The favoured logits' top k lie among x's own top columns and the kept ones
            # (every value moves down by eps at most, and a column outside them is below k
            # columns by more than that), so they are computed on those columns alone.
            part, kept = _top_columns(part[:, :rv], kept[:, :rv], top_k)
            favoured, kept = _top_columns(favoured_logits(part, kept, eps), kept, top_k)
            width = favoured.shape[1]
        else:
            favoured = favoured_logits(part, kept, eps)
        c = classify_support(
            favoured, margins=wide, real_vocab_size=width, temperature=temperature, **params
        )
        found += [not admissible_support(_one_row(c, r), kept[r : r + 1]) for r in range(len(part))]
    return found


def _top_columns(
    x: npt.NDArray[np.float32], mask: npt.NDArray[np.bool_], top_k: int
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
    """Each row's columns at or above its k-th largest value, and its kept ones, first, the
    rest -inf: top-k keeps none of the others (min-p's survivors are an upper set, so their
    top k are among these), and top-p reads the survivors of top-k only, so the decisions
    on these columns are the row's."""
    values, ids = top_columns(x, top_k, mask)
    return values, np.take_along_axis(mask, np.maximum(ids, 0), axis=1) & (ids >= 0)


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
