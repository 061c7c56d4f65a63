"""Which mask decisions a logit perturbation of ``eps`` can flip: exact, token by token.

The engine chose its mask from logits within ``eps`` of the trainer's
(:mod:`tp_logprob.rollout.noise`). A token's decision can go the mask's way when
some perturbation ``|d|_inf <= eps`` makes the rules (min-p, then top-k, then
top-p; ``docs/semantics.md``) decide it so. Every rule keeps token ``v`` more
readily the higher ``z_v``, the lower every token above it and the higher every
token at or below it (top-p's mass above ``v`` shrinks and the total grows; top-k
counts fewer tokens above ``v``; min-p's maximum drops; the survivors of min-p and
top-k that top-p reads only gain tokens below ``v``). So one perturbation is the
best there is for all three rules at once, and checking it is exact:

* to **keep** ``v`` (:func:`keep_favoured`): ``v`` raised by ``eps``; every token
  that can reach it (``x_u <= x_v + 2 eps``) as high as it can go without passing
  it (``min(x_u + eps, x_v + eps)``: tied with ``v`` counts as not above it); every
  other token lowered by ``eps``;
* to **drop** ``v`` (:func:`drop_favoured`): ``v`` lowered by ``eps``; every token
  that can pass it (``x_u + eps > x_v - eps``) raised by ``eps``; every other token
  lowered by ``eps``.

Written as conditions (``docs/semantics.md``, "The mask"), with ``e = eps / T``
and ``M_v`` the largest ``z`` but ``v``'s: min-p keeps ``v`` iff
``z_v - M_v + 2e >= log min_p`` and drops it iff ``z_v - M_v - 2e < log min_p``;
top-p keeps ``v`` iff ``e^{-e} A_v < p (e^{-e} A_v + B_v)``, ``A_v`` the mass of
the tokens above ``z_v + 2e`` and ``B_v = e^e sum min(w_u, w_v)`` over the rest,
and drops it iff ``e^e A'_v >= p (e^e A'_v + e^{-e} B'_v)``, ``A'_v`` the mass of
the others above ``z_v - 2e`` and ``B'_v`` the rest with ``v``.

A returned mask is ``borderline`` when each token where it differs from the rules
(certainly kept or certainly dropped under the op's margins) can flip, each under
its own perturbation, and its kept and dropped tokens can be ordered as the rules
need (no dropped token ``2 eps`` or more above a kept one); else ``support``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.oracle import SupportMargins, classify_support
from tp_logprob.rollout.support import kth_largest

__all__ = [
    "drop_favoured",
    "flippable",
    "judge_under_noise",
    "keep_favoured",
    "reachable",
    "supports_under_noise",
]

BATCH_VALUES = 1 << 20  # logits per batch of perturbed rows
ALL_AT_ONCE = 1024  # a row this narrow has every column's flip tried in one batch
Floats32 = npt.NDArray[np.float32]
Bools = npt.NDArray[np.bool_]


def keep_favoured(x: Floats32, v: int, eps: float) -> Floats32:
    """The logits within ``eps`` of the row ``x`` most favourable to keeping column ``v``."""
    row = np.asarray(x, dtype=np.float64)
    top = row[v] + eps
    with np.errstate(invalid="ignore"):
        reach = row <= top + eps
        moved = np.where(reach, np.minimum(row + eps, top), row - eps)
    moved[v] = top
    return np.asarray(moved, dtype=np.float32)


def drop_favoured(x: Floats32, v: int, eps: float) -> Floats32:
    """The logits within ``eps`` of the row ``x`` most favourable to dropping column ``v``."""
    row = np.asarray(x, dtype=np.float64)
    low = row[v] - eps
    with np.errstate(invalid="ignore"):
        moved = np.where(row + eps > low, row + eps, row - eps)
    moved[v] = low
    return np.asarray(moved, dtype=np.float32)


def flippable(
    x: Floats32,
    columns: npt.NDArray[np.int64],
    keep: Bools,
    eps: float,
    margins: SupportMargins,
    rv: int,
    temperature: float,
    params: dict[str, Any],
) -> Bools:
    """Per column in ``columns`` of the row ``x``: can a perturbation of ``eps`` make the
    rules (within the op's ``margins``) keep it (where ``keep``) or drop it (elsewhere)?"""
    rows = np.zeros(columns.size, dtype=np.int64)
    sizes = np.full(columns.size, float(eps))
    return _flippable_pairs(x[None], rows, columns, keep, sizes, margins, rv, temperature, params)


def _flippable_pairs(
    x: Floats32,
    rows: npt.NDArray[np.int64],
    columns: npt.NDArray[np.int64],
    keep: Bools,
    eps: npt.NDArray[np.float64],
    margins: SupportMargins,
    rv: int,
    temperature: float,
    params: dict[str, Any],
) -> Bools:
    """:func:`flippable` of each ``(row, column)`` pair of ``x``, each at its ``eps``."""
    if not columns.size:
        return np.zeros(0, dtype=np.bool_)
    moved = np.stack(
        [
            keep_favoured(x[r], c, e) if k else drop_favoured(x[r], c, e)
            for r, c, k, e in zip(
                rows.tolist(), columns.tolist(), keep.tolist(), eps.tolist(), strict=True
            )
        ]
    )
    if rv < moved.shape[1]:
        moved[:, rv:] = x[rows, rv:]  # padding is not logits: nothing perturbs it
    c = classify_support(
        moved, margins=margins, real_vocab_size=rv, temperature=temperature, **params
    )
    place = np.arange(columns.size)
    return np.where(keep, ~c.certainly_out[place, columns], ~c.certainly_in[place, columns])


def judge_under_noise(
    x: Floats32,
    mask: Bools,
    margins: SupportMargins,
    rv: int,
    temperature: float,
    eps: npt.NDArray[np.float64],
    params: dict[str, Any],
) -> list[bool]:
    """Per row: can each of ``mask``'s decisions that the rules refuse on ``x`` flip within
    the row's ``eps``, and its kept and dropped tokens be ordered as the rules need?

    With top-k each row is judged on its columns within ``2 eps`` of its k-th largest or
    above (:func:`reachable`): a column lower stays below k columns under every
    perturbation, so top-k drops it, and min-p and top-p never read it. The narrowed rows
    are padded with -inf (a column the rules drop and that moves nothing) and judged at
    once."""
    eps = np.asarray(eps, dtype=np.float64)
    top_k = params.get("top_k")
    if top_k is None or top_k >= rv:
        return _judge_rows(x, mask, margins, rv, temperature, eps, params).tolist()
    keeps_padding = mask[:, rv:].any(axis=1)
    reach = reachable(x[:, :rv], mask[:, :rv], int(top_k), eps)
    width = max(int(reach.sum(axis=1).max(initial=1)), 1)
    rows = np.full((len(x), width), -np.inf, dtype=np.float32)
    kept = np.zeros((len(x), width), dtype=np.bool_)
    for r in range(len(x)):
        columns = np.flatnonzero(reach[r])
        rows[r, : columns.size] = x[r, columns]
        kept[r, : columns.size] = mask[r, columns]
    found = _judge_rows(rows, kept, margins, width, temperature, eps, params)
    return (found & ~keeps_padding).tolist()


def _judge_row(
    row: Floats32,
    kept: Bools,
    margins: SupportMargins,
    rv: int,
    temperature: float,
    eps: float,
    params: dict[str, Any],
) -> bool:
    """:func:`_judge_rows` of one row."""
    found = _judge_rows(row[None], kept[None], margins, rv, temperature, np.array([eps]), params)
    return bool(found[0])


def _judge_rows(
    x: Floats32,
    kept: Bools,
    margins: SupportMargins,
    rv: int,
    temperature: float,
    eps: npt.NDArray[np.float64],
    params: dict[str, Any],
) -> Bools:
    """Per row of ``x`` (live width ``rv``), as :func:`judge_under_noise` says; every
    refused decision of every row is tried in one batch of perturbed rows."""
    live = np.arange(x.shape[1]) < rv
    c = classify_support(x, margins=margins, real_vocab_size=rv, temperature=temperature, **params)
    found = c.defined & ~(kept & ~live).any(axis=1)
    with np.errstate(invalid="ignore"):
        lowest = np.min(np.where(kept, x, np.inf), axis=1, initial=np.inf).astype(np.float64)
        dropped = live & ~kept
        highest = np.max(np.where(dropped, x, -np.inf), axis=1, initial=-np.inf)
        found &= highest.astype(np.float64) - lowest < 2.0 * eps
    wrong = live & ((c.certainly_in & ~kept) | (c.certainly_out & kept)) & found[:, None]
    pairs_row, pairs_column = np.nonzero(wrong)
    step = max(1, BATCH_VALUES // max(x.shape[1], 1))
    for begin in range(0, pairs_row.size, step):
        rows, columns = pairs_row[begin : begin + step], pairs_column[begin : begin + step]
        ok = _flippable_pairs(x, rows, columns, kept[rows, columns], eps[rows], margins, rv,
                              temperature, params)  # fmt: skip
        np.logical_and.at(found, rows, ok)
    return np.asarray(found, dtype=np.bool_)


def reachable(x: Floats32, mask: Bools, top_k: int, eps: npt.NDArray[np.float64]) -> Bools:
    """Per row: its columns within ``2 eps`` (the row's) of its ``top_k``-th largest or
    above, and its kept ones.

    The floor is taken in float64 and a few fp32 steps lower still: ``fl((x + d) / T)``
    can round a column that ends just below the k-th onto it, and a tie is kept."""
    kth = kth_largest(x, top_k)[:, None].astype(np.float64)
    step = 4.0 * np.spacing(np.abs(kth).astype(np.float32)).astype(np.float64)
    floor = kth - 2.0 * np.asarray(eps, dtype=np.float64)[:, None] - step
    return np.asarray((x >= floor) | mask, dtype=np.bool_)


def supports_under_noise(
    x: Floats32,
    kept: Bools,
    margins: SupportMargins,
    rv: int,
    temperature: float,
    eps: float,
    params: dict[str, Any],
) -> tuple[npt.NDArray[np.int64], int, int]:
    """The supports the rules can give the row ``x`` under a perturbation of ``eps``, as
    ``(order, low, high)``: ``order`` the live columns, ``kept`` ones first, each part by
    ``x`` descending; every such support holds ``order[:low]`` and lies within
    ``order[:high]``.

    Dropping is easier the lower a column and keeping the higher (module docstring), so
    the kept columns that can drop are the lowest few and the others that can be kept the
    highest few: on a wide row each count is found by a galloping search, one perturbed
    row per step.
    """
    live = np.arange(rv)
    inside = live[kept[:rv]]
    outside = live[~kept[:rv]]
    inside = inside[np.argsort(-x[inside], kind="stable")]
    outside = outside[np.argsort(-x[outside], kind="stable")]

    if rv <= ALL_AT_ONCE:  # a narrowed row: every column tried in one batch
        columns = np.concatenate([inside[::-1], outside]).astype(np.int64)
        keep = np.arange(columns.size) >= inside.size
        flips = flippable(x, columns, keep, eps, margins, rv, temperature, params)
        droppable = _leading(lambda i: bool(flips[i]), inside.size)
        keepable = _leading(lambda i: bool(flips[inside.size + i]), outside.size)
    else:

        def can(column: int, keep: bool) -> bool:
            one = np.array([column], dtype=np.int64)
            flag = np.array([keep], dtype=np.bool_)
            return bool(flippable(x, one, flag, eps, margins, rv, temperature, params)[0])

        droppable = _leading(lambda i: can(int(inside[-1 - i]), False), inside.size)
        keepable = _leading(lambda i: can(int(outside[i]), True), outside.size)
    order = np.concatenate([inside, outside]).astype(np.int64)
    return order, inside.size - droppable, inside.size + keepable


def _leading(test: Any, n: int) -> int:
    """How many of ``0 .. n-1`` pass ``test``, which passes a leading run of them (a
    galloping search, then bisection)."""
    if n == 0 or not test(0):
        return 0
    good, step = 0, 1
    while good + step < n and test(good + step):
        good, step = good + step, step * 2
    bad = min(good + step, n)  # test fails at bad, or bad == n
    while bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if test(middle) else (good, middle)
    return good + 1
