"""The call an assert judges, as the suite's :class:`~tp_logprob.strategies.LogprobCase`.

The caller's arguments become one contract (so the contract's own checks name a
bad dtype, temperature, vocabulary size or mask) and one case: the tolerance, the
exact values and a failure artifact then come from the suite's own code.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob._validation import check_enum, check_int
from tp_logprob.contract import (
    DeterminismScope,
    LogprobContract,
    LogprobDType,
    LogprobRole,
    MaskSpec,
    ReductionSpec,
    ShardingSpec,
)
from tp_logprob.errors import LogprobContractError
from tp_logprob.strategies import LogprobCase, round_to_dtype
from tp_logprob.support import SupportMode, SupportSpec
from tp_logprob.testing._arrays import as_logits, as_numpy, joined_shards, shard_bounds


def full_logits(logits: Any, tp_shards: Any) -> tuple[npt.NDArray[np.float32], tuple[int, ...]]:
    """The ``[N, V]`` logits and the shard widths: ``logits`` alone, or ``tp_shards`` joined."""
    if tp_shards is None:
        if logits is None:
            raise LogprobContractError("logits=None: pass the [N, V] logits, or tp_shards=[...]")
        full = as_logits(logits)
        return full, (full.shape[1],)
    if logits is not None:
        raise LogprobContractError(
            "logits and tp_shards: both given; pass the full logits or the per-rank shards"
        )
    shards = joined_shards(tp_shards)
    return np.concatenate(shards, axis=1), tuple(shard.shape[1] for shard in shards)


def build_case(
    logits: npt.NDArray[np.float32],
    widths: tuple[int, ...],
    targets: Any,
    *,
    dtype: Any,
    temperature: Any,
    real_vocab_size: Any,
    active_mask: Any,
    support: Any,
    role: LogprobRole,
    export_entropy: bool,
) -> LogprobCase:
    """The case of one call, every argument checked (naming it) before anything is computed."""
    rows, padded = logits.shape
    name = check_enum("dtype", dtype, LogprobDType)
    real = padded if real_vocab_size is None else check_int("real_vocab_size", real_vocab_size)
    mask = None if active_mask is None else as_numpy(active_mask, "active_mask")
    if support is not None and not isinstance(support, SupportSpec):
        raise LogprobContractError(
            f"support={support!r}: expected a SupportSpec (SupportSpec.from_kept_lists(kept))"
        )
    contract = LogprobContract(
        role=role,
        dtype=name,
        mask=MaskSpec(rows, mask),
        sharding=ShardingSpec(0, len(widths), shard_bounds(widths), real, padded),
        reduction=ReductionSpec(DeterminismScope.RUN_TO_RUN),
        temperature=temperature,
        export_entropy=export_entropy,
        support=support,
    )
    _check_dtype_values(logits, contract.dtype)
    case = LogprobCase(contract, logits, _checked_targets(targets, contract))
    if support is not None and support.mode is SupportMode.REPLAYED_MASK:
        _check_kept_targets(case, support)
    return case


def _check_dtype_values(logits: npt.NDArray[np.float32], dtype: LogprobDType) -> None:
    if dtype is LogprobDType.FP32:
        return
    rounded = round_to_dtype(logits, dtype)
    off = ~((rounded == logits) | (np.isnan(rounded) & np.isnan(logits)))
    if off.any():
        row, column = (int(k) for k in np.argwhere(off)[0])
        raise LogprobContractError(
            f"logits[{row}, {column}]={float(logits[row, column])!r}: not a {dtype.value} value, "
            f"but dtype={dtype.value!r}; pass the {dtype.value} logits the kernel read (upcast "
            "to fp32), or dtype='fp32'"
        )


def _checked_targets(targets: Any, contract: LogprobContract) -> npt.NDArray[np.int64]:
    if targets is None:
        raise LogprobContractError("targets=None: pass the [N] target token ids")
    array = as_numpy(targets, "targets")
    rows, real = contract.num_tokens, contract.sharding.real_vocab_size
    if array.dtype.kind not in "iu":
        raise LogprobContractError(f"targets: dtype {array.dtype}, expected an integer dtype")
    if array.shape != (rows,):
        raise LogprobContractError(
            f"targets: shape {array.shape}, expected ({rows},): one per logits row"
        )
    bad = contract.mask.dense() & ((array < 0) | (array >= real))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise LogprobContractError(
            f"targets[{row}]={int(array[row])}: outside [0, real_vocab_size={real}) for an "
            f"active row ({int(bad.sum())} such rows); fix the target or mark the row inactive "
            "in active_mask"
        )
    return np.asarray(array, dtype=np.int64)


def _check_kept_targets(case: LogprobCase, support: SupportSpec) -> None:
    """An active target outside its row's kept ids is an error, as the ops raise it."""
    kept = support.dense(case.contract.sharding.padded_vocab_size)
    rows = np.arange(case.contract.num_tokens)
    outside = case.active & ~kept[rows, np.where(case.active, case.targets, 0)]
    if outside.any():
        row = int(np.flatnonzero(outside)[0])
        raise LogprobContractError(
            f"targets[{row}]={int(case.targets[row])}: not among row {row}'s kept ids "
            f"({support.kept_row(row).size} kept); a token the engine could not sample has no "
            "processed logprob"
        )
