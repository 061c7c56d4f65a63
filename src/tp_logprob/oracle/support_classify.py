"""Which tokens a backend must keep, must drop, or may do either with: the support under rounding.

A backend computes min-p and top-p masses in fp32, so a token whose exact
decision lies within the backend's error of the boundary may go either way.
:func:`classify_support` sorts every column into certainly in, certainly out
or borderline under a :class:`~tp_logprob.oracle.SupportMargins`, and
:func:`admissible_support` checks a backend's support against that: every
certainly-in token kept, no certainly-out token kept, and an upper set of
``z`` closed under ties (``docs/semantics.md``, "Processed logprobs"; the
margins are derived in ``docs/tolerances.md``, "Processed logprobs: the support").

Each certain set is itself an upper (in) or lower (out) set of ``z``: min-p
survivors, the top-k cut and top-p's mass above a token all move one way with
``z``. The uncertainty of the min-p survivors carries into top-p through the
survivors' total ``Z``, bounded between the certainly-in and the
not-certainly-out survivors; the mass strictly above a token does not depend
on the survivors, since any upper set holding the token holds everything above it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from tp_logprob.oracle._inputs import BoolArray, FloatArray, as_active_mask
from tp_logprob.oracle.support import ExactSupport, analyse
from tp_logprob.oracle.support_tolerance import SupportMargins

__all__ = ["SupportClassification", "admissible_support", "classify_support"]

_MAX_PROBLEMS = 20


@dataclass(frozen=True)
class SupportClassification:
    """Each column certainly in, certainly out, or neither (borderline), per row.

    ``certainly_in`` and ``certainly_out`` are bool ``[N, V]``; padding columns and
    every column of a row whose support is undefined (``defined`` False) are
    certainly out. ``exact`` is the exact support (inside the first, outside
    the second) and ``z`` the tempered logits the rules read (NaN on padding).
    """

    certainly_in: BoolArray
    certainly_out: BoolArray
    defined: BoolArray
    exact: ExactSupport
    z: FloatArray

    @property
    def borderline(self) -> BoolArray:
        """Columns a backend may keep or drop: neither certainly in nor certainly out."""
        return ~self.certainly_in & ~self.certainly_out


def classify_support(
    logits: ArrayLike,
    *,
    margins: SupportMargins,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    real_vocab_size: int | None = None,
    temperature: float = 1.0,
    row_width: int | None = None,
) -> SupportClassification:
    """Classify every column of ``logits`` (``[N, V]``) for a backend within ``margins``.

    Arguments as :func:`~tp_logprob.oracle.exact_support`; ``margins`` is the
    backend's error model, :func:`~tp_logprob.oracle.support_margins` for a
    contract. With :meth:`SupportMargins.zero` nothing is borderline.
    ``row_width``: when ``logits`` holds some columns of wider rows (their top), the
    live width of those rows, whose error bounds the classification then uses.

    >>> from tp_logprob.oracle import support_margins
    >>> c = classify_support([[0.0, -0.693147, -9.0]], min_p=0.5,
    ...                      margins=support_margins("fp32", 3))
    >>> c.certainly_in.tolist(), c.certainly_out.tolist()
    ([[True, False, False]], [[False, False, True]])
    """
    if not isinstance(margins, SupportMargins):
        raise TypeError(f"margins={margins!r} must be a SupportMargins (see support_margins)")
    found = analyse(
        logits, top_k, top_p, min_p, real_vocab_size, temperature, margins, row_width=row_width
    )
    certainly_in = found.live_mask(found.sure_threshold)
    n, width = certainly_in.shape
    live = found.z.shape[1]
    certainly_out = np.ones((n, width), dtype=np.bool_)
    with np.errstate(invalid="ignore"):
        # Undefined rows have a NaN threshold: every comparison is False, so all stay out.
        maybe = found.z > found.out_threshold[:, None]
        maybe |= np.isnan(found.out_threshold)[:, None] & found.defined[:, None]
    certainly_out[:, :live] = ~maybe
    z = found.z
    if live < width:
        z = np.full((n, width), np.nan)
        z[:, :live] = found.z
    return SupportClassification(certainly_in, certainly_out, found.defined, found.exact(), z)


def admissible_support(
    classification: SupportClassification,
    support_mask: ArrayLike,
    *,
    active_mask: ArrayLike | None = None,
) -> list[str]:
    """Why a backend's support (bool ``[N, V]``, True = kept) is not admissible; empty if it is.

    Admissible: every certainly-in column kept, no certainly-out column kept
    (padding included; nothing at all where the support is undefined), and an
    upper set of ``z`` closed under ties. One message per row and kind, each
    naming the row, the token and its ``z``; rows with ``active_mask`` False are
    not checked. At most 20 messages, then a count of the rest.

    >>> from tp_logprob.oracle import SupportMargins
    >>> c = classify_support([[0.0, 1.0, 1.0]], top_k=1, margins=SupportMargins.zero())
    >>> admissible_support(c, [[False, True, True]])
    []
    >>> for problem in admissible_support(c, [[False, True, False]]):
    ...     print(problem)  # doctest: +ELLIPSIS
    row 0: token 2 (z=1.0) is certainly in the support but was dropped (...)
    row 0: not an upper set of z closed under ties: token 1 (z=1.0) was kept but token 2 ...
    """
    mask = np.asarray(support_mask)
    shape = classification.certainly_in.shape
    if mask.dtype != np.bool_ or mask.shape != shape:
        raise ValueError(
            f"support_mask has shape {mask.shape} dtype {mask.dtype}; expected bool {shape}"
        )
    active = as_active_mask(active_mask, shape[0])
    problems: list[str] = []
    for row in np.flatnonzero(active).tolist():
        problems.extend(_row_problems(classification, mask, row))
    if len(problems) > _MAX_PROBLEMS:
        rest = len(problems) - _MAX_PROBLEMS
        problems = [*problems[:_MAX_PROBLEMS], f"... and {rest} more"]
    return problems


def _row_problems(c: SupportClassification, mask: BoolArray, row: int) -> list[str]:
    kept = mask[row]
    zs = c.z[row]
    if not c.defined[row]:
        if kept.any():
            return [
                f"row {row}: the support is undefined (a NaN or +inf live z, or no finite "
                f"value) and must be empty, but {int(kept.sum())} columns were kept "
                f"(first: token {int(np.flatnonzero(kept)[0])})"
            ]
        return []
    out: list[str] = []
    padding = kept & np.isnan(zs)
    if padding.any():
        out.append(f"row {row}: padding column {int(np.flatnonzero(padding)[0])} was kept")
    missing = c.certainly_in[row] & ~kept
    if missing.any():
        v = _extreme(zs, missing, highest=True)
        value = float(zs[v])
        out.append(
            f"row {row}: token {v} (z={value!r}) is certainly in the support but was dropped "
            "(the exact rules keep it by more than the backend's error bound)"
        )
    extra = c.certainly_out[row] & kept & ~padding
    if extra.any():
        v = _extreme(zs, extra, highest=False)
        value = float(zs[v])
        out.append(
            f"row {row}: token {v} (z={value!r}) is certainly out of the support but was kept "
            "(the exact rules drop it by more than the backend's error bound)"
        )
    live_kept = kept & ~np.isnan(zs)
    if live_kept.any():
        lowest = _extreme(zs, live_kept, highest=False)
        with np.errstate(invalid="ignore"):
            skipped = ~kept & (zs >= zs[lowest])
        if skipped.any():
            u = _extreme(zs, skipped, highest=True)
            low, high = float(zs[lowest]), float(zs[u])
            relation = "tied with it" if high == low else "larger"
            out.append(
                f"row {row}: not an upper set of z closed under ties: token {lowest} "
                f"(z={low!r}) was kept but token {u} (z={high!r}, {relation}) was dropped"
            )
    return out


def _extreme(z: FloatArray, where: BoolArray, *, highest: bool) -> int:
    """The column of the largest (or smallest) ``z`` among ``where`` (the first on a tie)."""
    columns = np.flatnonzero(where)
    values = z[columns]
    pick = np.argmax(values) if highest else np.argmin(values)
    return int(columns[pick])
