"""The sampling support of a processed logprob: the tokens a rollout engine sampled from.

Rollout engines sample after truncating the distribution (top-k, top-p, min-p).
A trainer that compares its logprob with the engine's must normalise over the
same support ``S``. :class:`SupportSpec` gives ``S`` one of two ways:

* **sampling parameters** (``top_k``, ``top_p``, ``min_p``): ``S`` is recomputed
  from the logits by the rules of ``docs/semantics.md``, "Processed logprobs";
  each is one value for the batch or one value per row (a heterogeneous engine
  batch, where every request brings its own);
* **a replayed mask**: the engine's kept token ids per row, as CSR offsets and
  global vocabulary ids (what vLLM's ``--return-sampling-mask`` and SGLang's
  ``output_token_sampling_mask`` return).

The spec is checked here on its own (types, ranges, sorted unique ids); what
needs the rest of the contract (one row per token, ids inside the real
vocabulary, a kept id for every active token) is checked by the contract.

Pure Python and numpy: importing it never imports torch.
"""

from __future__ import annotations

import hashlib
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob._validation import check_int, check_int_array
from tp_logprob.errors import LogprobContractError

__all__ = ["RowRules", "SupportMode", "SupportSpec", "kept_rows_csr"]

IntArray = npt.NDArray[np.int64]

RowRules = tuple[int | None, float | None, float | None]
"""One row's ``(top_k, top_p, min_p)``; None leaves a rule off."""


class SupportMode(str, Enum):
    """Over which tokens a row's distribution is normalised.

    ``full``: every live column (the raw logprob; a contract without a support).
    ``sampling_params``: the support recomputed from ``top_k`` / ``top_p`` / ``min_p``.
    ``replayed_mask``: the rollout engine's kept token ids, replayed.
    """

    FULL = "full"
    SAMPLING_PARAMS = "sampling_params"
    REPLAYED_MASK = "replayed_mask"


def _check_fraction(name: str, value: object, *, low_open: bool) -> float | None:
    """None, or a real in ``(0, 1]`` (``low_open``) or ``[0, 1]``; bools and NaN refused."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise LogprobContractError(
            f"{name}={value!r}: expected None or a float, got {type(value).__name__}"
        )
    number = float(value)
    low_ok = number > 0.0 if low_open else number >= 0.0
    if not (math.isfinite(number) and low_ok and number <= 1.0):
        interval = "(0, 1]" if low_open else "[0, 1]"
        raise LogprobContractError(
            f"{name}={value!r}: must lie in {interval} (None leaves the rule off)"
        )
    return number


def _check_top_k(name: str, value: object) -> int | None:
    return None if value is None else check_int(name, value, min_value=1)


def _check_top_p(name: str, value: object) -> float | None:
    return _check_fraction(name, value, low_open=True)


def _check_min_p(name: str, value: object) -> float | None:
    return _check_fraction(name, value, low_open=False)


def _rule(name: str, value: object, check: Callable[[str, object], Any]) -> Any:
    """One checked value, or a tuple of one checked value per row (a list, tuple or 1-D
    array)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if not isinstance(value, (list, tuple, np.ndarray)):
        return check(name, value)
    if len(value) == 0:
        raise LogprobContractError(
            f"{name}={value!r}: per-row values need one entry per row (got none)"
        )
    return tuple(check(f"{name}[row {row}]", item) for row, item in enumerate(value))


def kept_rows_csr(name: str, rows: object, row_label: str = "row") -> tuple[IntArray, IntArray]:
    """CSR ``(offsets, ids)`` of one sequence (or int array) of kept ids per row.

    An id that is not an integer is refused with its row and position, a row that is
    not a sequence with its row; nothing is dropped or rounded.
    """
    if isinstance(rows, (str, bytes)) or not isinstance(rows, (Sequence, np.ndarray)):
        raise LogprobContractError(f"{name}={rows!r}: expected one sequence of ids per row")
    lengths = np.zeros(len(rows), dtype=np.int64)
    parts: list[IntArray] = []
    for row, kept in enumerate(rows):
        ids = check_int_array(f"{name}[{row_label} {row}]", kept)
        lengths[row] = ids.size
        parts.append(ids)
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return offsets, flat.astype(np.int64)


@dataclass(frozen=True, eq=False)
class SupportSpec:
    """The per-row support ``S`` a rollout engine sampled from.

    Give sampling parameters (``S`` recomputed from the logits)::

        SupportSpec(top_k=50, top_p=0.9, min_p=0.05)

    one per row where the engine batched requests with their own (a list per
    rule, one entry per token; None in an entry leaves that row's rule off)::

        SupportSpec(top_k=[50, None, 5], top_p=0.9)

    or the engine's kept ids per row (``S`` replayed), as CSR: row ``t`` keeps
    ``kept_ids[kept_offsets[t]:kept_offsets[t + 1]]``, global vocabulary ids,
    sorted and unique::

        SupportSpec.from_kept_lists([[3, 7, 9], [0, 3]])

    ``top_k`` is an int ``>= 1``, ``top_p`` lies in ``(0, 1]`` and ``min_p`` in
    ``[0, 1]``; None leaves a rule off, as do ``top_p=1`` and ``min_p=0`` (a
    ``top_k`` at least the vocabulary keeps every token too). The support is part of the
    contract's fingerprint (the kept ids as a sha256 digest), so ranks that
    replay different masks disagree at preflight, before any collective.
    """

    top_k: int | Sequence[int | None] | None = None
    top_p: float | Sequence[float | None] | None = None
    min_p: float | Sequence[float | None] | None = None
    kept_offsets: Any = None
    kept_ids: Any = None
    _digest: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        top_k = _rule("support.top_k", self.top_k, _check_top_k)
        top_p = _rule("support.top_p", self.top_p, _check_top_p)
        min_p = _rule("support.min_p", self.min_p, _check_min_p)
        object.__setattr__(self, "top_k", top_k)
        object.__setattr__(self, "top_p", top_p)
        object.__setattr__(self, "min_p", min_p)
        self._check_row_counts()
        has_params = (top_k, top_p, min_p) != (None, None, None)
        given = (self.kept_offsets is not None, self.kept_ids is not None)
        if given[0] != given[1]:
            missing = "kept_ids" if given[0] else "kept_offsets"
            raise LogprobContractError(
                f"support.{missing}=None: a replayed mask needs both kept_offsets and kept_ids"
            )
        if has_params and given[0]:
            raise LogprobContractError(
                f"support: top_k={top_k!r}, top_p={top_p!r}, min_p={min_p!r} and kept ids "
                "given together; give sampling parameters (recomputed support) or the kept "
                "ids (replayed support), not both"
            )
        if not has_params and not given[0]:
            raise LogprobContractError(
                "support: neither sampling parameters (top_k, top_p, min_p) nor kept ids "
                "given; for the full vocabulary leave the contract's support at None"
            )
        if given[0]:
            offsets, ids = self._checked_csr()
            object.__setattr__(self, "kept_offsets", offsets)
            object.__setattr__(self, "kept_ids", ids)
        object.__setattr__(self, "_digest", self._compute_digest())

    def _check_row_counts(self) -> None:
        """Every per-row rule describes the same rows."""
        counts = {
            name: len(value)
            for name, value in (("top_k", self.top_k), ("top_p", self.top_p), ("min_p", self.min_p))
            if isinstance(value, tuple)
        }
        if len(set(counts.values())) > 1:
            described = ", ".join(f"support.{name} {count}" for name, count in counts.items())
            raise LogprobContractError(
                f"support: per-row rules describe different row counts ({described}); give "
                "each one entry per row"
            )

    def _checked_csr(self) -> tuple[IntArray, IntArray]:
        offsets = check_int_array("support.kept_offsets", self.kept_offsets)
        ids = check_int_array("support.kept_ids", self.kept_ids)
        if offsets.size == 0 or offsets[0] != 0:
            raise LogprobContractError(
                f"support.kept_offsets={offsets.tolist()!r}: must start at 0 (one more "
                "entry than rows)"
            )
        steps = np.diff(offsets)
        if steps.size and steps.min() < 0:
            row = int(np.flatnonzero(steps < 0)[0])
            raise LogprobContractError(
                f"support.kept_offsets[{row + 1}]={int(offsets[row + 1])!r}: offsets must not "
                f"decrease (previous {int(offsets[row])})"
            )
        if offsets[-1] != ids.size:
            raise LogprobContractError(
                f"support.kept_offsets[-1]={int(offsets[-1])!r}: must equal len(kept_ids)="
                f"{ids.size}"
            )
        if ids.size and ids.min() < 0:
            position = int(np.flatnonzero(ids < 0)[0])
            raise LogprobContractError(
                f"support.kept_ids[row {self._row_of(offsets, position)}]={int(ids[position])!r}: "
                "token ids must be >= 0"
            )
        rising = np.diff(ids) > 0
        row_starts = offsets[1:-1]
        rising[row_starts[(row_starts > 0) & (row_starts < ids.size)] - 1] = True
        if not rising.all():
            position = int(np.flatnonzero(~rising)[0]) + 1
            row = self._row_of(offsets, position)
            kept = ids[offsets[row] : offsets[row + 1]].tolist()
            raise LogprobContractError(
                f"support.kept_ids[row {row}]={_short(kept)}: ids must be strictly increasing "
                "(sorted and unique)"
            )
        return offsets, ids

    @staticmethod
    def _row_of(offsets: IntArray, position: int) -> int:
        return int(np.searchsorted(offsets, position, side="right")) - 1

    def _compute_digest(self) -> str:
        hasher = hashlib.sha256(b"tp-logprob-support:")
        hasher.update(repr((self.top_k, self.top_p, self.min_p)).encode())
        if self.kept_offsets is not None:
            hasher.update(np.asarray(self.kept_offsets, dtype="<i8").tobytes())
            hasher.update(b"|")
            hasher.update(np.asarray(self.kept_ids, dtype="<i8").tobytes())
        return hasher.hexdigest()

    @classmethod
    def from_kept_lists(cls, rows: Sequence[Sequence[int]]) -> SupportSpec:
        """A replayed support from one list of kept global ids per row (each sorted, unique).

        Every id must be an int: ``[[1.5], [0]]`` or ``[[True]]`` is refused with the row
        and position, never rounded.
        """
        offsets, ids = kept_rows_csr("rows", rows)
        return cls(kept_offsets=offsets, kept_ids=ids)

    @classmethod
    def from_mask(cls, mask: Any) -> SupportSpec:
        """A replayed support from a bool ``[num_tokens, vocab]`` mask (True = kept)."""
        if type(mask).__module__.startswith("torch"):
            mask = mask.detach().cpu().numpy()
        array = np.asarray(mask)
        if array.dtype != np.bool_ or array.ndim != 2:
            raise LogprobContractError(
                f"mask: expected a 2-D bool array [num_tokens, vocab], got shape {array.shape} "
                f"dtype {array.dtype}"
            )
        _, columns = np.nonzero(array)
        offsets = np.concatenate([[0], np.cumsum(array.sum(axis=1), dtype=np.int64)])
        return cls(kept_offsets=offsets.astype(np.int64), kept_ids=columns.astype(np.int64))

    @property
    def mode(self) -> SupportMode:
        """``replayed_mask`` with kept ids, else ``sampling_params``."""
        if self.kept_offsets is not None:
            return SupportMode.REPLAYED_MASK
        return SupportMode.SAMPLING_PARAMS

    @property
    def per_row(self) -> bool:
        """Whether some sampling parameter is given per row (a heterogeneous batch)."""
        return any(isinstance(value, tuple) for value in (self.top_k, self.top_p, self.min_p))

    @property
    def num_rows(self) -> int | None:
        """Rows of a replayed mask or of per-row parameters (None for one set per batch)."""
        if self.kept_offsets is not None:
            return len(self.kept_offsets) - 1
        for value in (self.top_k, self.top_p, self.min_p):
            if isinstance(value, tuple):
                return len(value)
        return None

    def batch_rules(self) -> RowRules:
        """``(top_k, top_p, min_p)`` of one set per batch; per-row rules have none (a backend
        serves them group by group of rows, :func:`tp_logprob.row_groups.row_groups`)."""
        if self.per_row:
            raise LogprobContractError(
                "support: per-row sampling parameters have no single set; split the batch "
                "with tp_logprob.row_groups.row_groups(contract)"
            )
        return self.row_rules(0)

    def row_rules(self, row: int) -> RowRules:
        """``(top_k, top_p, min_p)`` of ``row`` (the batch's own for one set per batch)."""
        if self.kept_offsets is not None:
            raise LogprobContractError("support: a replayed mask has no sampling parameters")

        def pick(value: Any) -> Any:
            return value[row] if isinstance(value, tuple) else value

        return pick(self.top_k), pick(self.top_p), pick(self.min_p)

    def kept_counts(self) -> IntArray:
        """``|S|`` of every row of a replayed mask, int64 ``[num_rows]``."""
        if self.kept_offsets is None:
            raise LogprobContractError("support: sampling parameters have no kept ids")
        counts: IntArray = np.diff(self.kept_offsets)
        return counts

    def kept_row(self, row: int) -> IntArray:
        """The kept global ids of ``row`` (a replayed mask)."""
        if self.kept_offsets is None:
            raise LogprobContractError("support: sampling parameters have no kept ids")
        return self.kept_ids[self.kept_offsets[row] : self.kept_offsets[row + 1]]  # type: ignore[no-any-return]

    def dense(self, width: int) -> npt.NDArray[np.bool_]:
        """A replayed mask as a bool ``[num_rows, width]`` array of global columns."""
        counts = self.kept_counts()
        mask = np.zeros((counts.size, width), dtype=np.bool_)
        mask[np.repeat(np.arange(counts.size), counts), self.kept_ids] = True
        return mask

    def local_kept(self, start: int, end: int) -> tuple[IntArray, IntArray]:
        """One rank's part of a replayed mask: CSR ``(offsets, local ids)`` of the kept ids
        in global columns ``[start, end)``, shifted by ``-start``."""
        counts = self.kept_counts()
        ids = self.kept_ids
        inside = (ids >= start) & (ids < end)
        rows = np.repeat(np.arange(counts.size), counts)
        local_counts = np.bincount(rows[inside], minlength=counts.size).astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(local_counts)]).astype(np.int64)
        return offsets, (ids[inside] - start).astype(np.int64)

    @property
    def digest(self) -> str:
        """sha256 of the parameters and kept ids: provenance without the per-token data."""
        return self._digest

    def rules(self) -> str:
        """The support in a few words, for reports."""
        if self.mode is SupportMode.REPLAYED_MASK:
            return f"replayed mask ({int(self.kept_offsets[-1])} kept ids)"
        if self.per_row:
            rules = (("min_p", self.min_p), ("top_k", self.top_k), ("top_p", self.top_p))
            named = [name for name, value in rules if value is not None]
            return f"per-row {'/'.join(named)} ({self.num_rows} rows)"
        parts = [
            f"{name}={value!r}"
            for name, value in (("min_p", self.min_p), ("top_k", self.top_k), ("top_p", self.top_p))
            if value is not None
        ]
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible provenance; kept ids appear as their count and a digest."""
        replayed = self.kept_offsets is not None
        return {
            "mode": self.mode.value,
            "top_k": _stored(self.top_k),
            "top_p": _stored(self.top_p),
            "min_p": _stored(self.min_p),
            "kept_rows": self.num_rows if replayed else None,
            "kept_count": int(self.kept_offsets[-1]) if replayed else None,
            "sha256": self._digest,
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SupportSpec):
            return NotImplemented
        return self._digest == other._digest

    def __hash__(self) -> int:
        return hash(self._digest)


def _stored(value: object) -> object:
    """A rule as JSON stores it: per-row values as a list."""
    return list(value) if isinstance(value, tuple) else value


def _short(values: list[int], limit: int = 8) -> str:
    if len(values) <= limit:
        return repr(values)
    return repr(values[:limit])[:-1] + ", ...]"
