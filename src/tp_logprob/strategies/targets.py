"""Target token ids: valid where a row is active, anything at all where it is not."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from tp_logprob.contract import LogprobContract, SupportMode

__all__ = ["ACTIVE_TARGET_KINDS", "INACTIVE_TARGET_KINDS", "shard_edge_columns", "targets"]

ACTIVE_TARGET_KINDS = ("any", "shard_edge", "row_max", "row_min")
"""How an active row's target is chosen: any live column, the first or last live
column of some rank's shard, or (given the logits) the row's largest or smallest
live logit, which puts ``selected_logp`` near 0 or at its most negative."""

INACTIVE_TARGET_KINDS = ("ignore_index", "in_range", "negative", "past_vocab")
"""What an inactive row's target holds: it must never be read for a value."""


def shard_edge_columns(contract: LogprobContract) -> tuple[int, ...]:
    """The first and last live column of every rank that owns live columns."""
    sharding = contract.sharding
    edges: set[int] = set()
    for rank in range(sharding.tp_world_size):
        start, end = sharding.live_bounds(rank)
        if end > start:
            edges.update((start, end - 1))
    return tuple(sorted(edges))


def _extreme_live_column(row: npt.NDArray[np.float32], real: int, largest: bool) -> int:
    live = np.nan_to_num(row[:real].astype(np.float64), nan=-np.inf if largest else np.inf)
    return int(np.argmax(live) if largest else np.argmin(live))


@st.composite
def _targets(
    draw: Any, contract: LogprobContract, logits: npt.NDArray[np.float32] | None
) -> npt.NDArray[np.int64]:
    real = contract.sharding.real_vocab_size
    edges = shard_edge_columns(contract)
    active_kinds = ACTIVE_TARGET_KINDS if logits is not None else ACTIVE_TARGET_KINDS[:2]
    ignore = contract.mask.ignore_index
    inactive = st.one_of(
        st.just(ignore),
        st.integers(0, real - 1),
        st.integers(-(2**40), -1),
        st.integers(real, 2**40),
    )
    replayed = contract.support_mode is SupportMode.REPLAYED_MASK
    result = np.empty(contract.num_tokens, dtype=np.int64)
    for row, active in enumerate(contract.mask.dense()):
        if not active:
            result[row] = draw(inactive)
            continue
        if replayed:
            result[row] = _kept_target(draw, contract, row, logits)
            continue
        kind = draw(st.sampled_from(active_kinds))
        if kind == "any":
            result[row] = draw(st.integers(0, real - 1))
        elif kind == "shard_edge":
            result[row] = draw(st.sampled_from(edges))
        else:
            assert logits is not None  # only drawn when logits were given
            result[row] = _extreme_live_column(logits[row], real, kind == "row_max")
    result.flags.writeable = False
    return result


def _kept_target(
    draw: Any, contract: LogprobContract, row: int, logits: npt.NDArray[np.float32] | None
) -> int:
    """An active row's target under a replayed mask: one of its kept ids (the engine sampled
    it from them), often the kept id with the largest or smallest logit."""
    assert contract.support is not None
    kept = contract.support.kept_row(row)
    kinds = ["any", "first", "last"] + (["row_max", "row_min"] if logits is not None else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "any":
        return int(draw(st.sampled_from(kept.tolist())))
    if kind in ("first", "last"):
        return int(kept[0] if kind == "first" else kept[-1])
    assert logits is not None
    values = np.nan_to_num(
        logits[row, kept].astype(np.float64), nan=-np.inf if kind == "row_max" else np.inf
    )
    return int(kept[np.argmax(values) if kind == "row_max" else np.argmin(values)])


def targets(
    contract: LogprobContract, *, logits: npt.NDArray[np.float32] | None = None
) -> st.SearchStrategy[npt.NDArray[np.int64]]:
    """Global target ids, int64 ``[num_tokens]``.

    Active rows get a live column (see :data:`ACTIVE_TARGET_KINDS`; pass
    ``logits`` to also aim at each row's largest and smallest logit); with a
    replayed support, one of the row's kept ids (the engine sampled it). Inactive
    rows get ``ignore_index``, an in-range id, a negative id or an id past the
    vocabulary (:data:`INACTIVE_TARGET_KINDS`).
    """
    if not isinstance(contract, LogprobContract):
        raise InvalidArgument(f"contract={contract!r}: expected a LogprobContract")
    expected = (contract.num_tokens, contract.sharding.padded_vocab_size)
    if logits is not None and np.shape(logits) != expected:
        raise InvalidArgument(f"logits: shape {np.shape(logits)}, expected {expected}")
    return _targets(contract, logits)
