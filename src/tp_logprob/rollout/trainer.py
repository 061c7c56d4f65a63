"""The trainer's side: its backend's logprobs over the engine's masks, and its logits read back.

The trainer runs a registered backend on its own logits (its TP shards, merged
by the backend's own collectives), with the engine's mask replayed at the
trainer's temperature. Rows are processed in blocks, so a 4,096-token response
at V = 152,064 holds one block of tens of MiB besides the logits.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.accumulation import AccumulationOrder
from tp_logprob.contract import (
    DeterminismScope,
    LogprobContract,
    LogprobDType,
    LogprobRole,
    MaskSpec,
    ReductionSpec,
    ShardingSpec,
)
from tp_logprob.engine_formats import EngineRollout
from tp_logprob.support import SupportSpec

__all__ = ["dense_mask", "kept_values", "logit_rows", "trainer_contract", "trainer_logprobs"]

TRAINER_BLOCK_VALUES = 1 << 23  # logits per block of the trainer backend: 32 MiB of fp32

Floats = npt.NDArray[np.float64]


def trainer_contract(
    shards: list[Any],
    rollout: EngineRollout,
    dtype: str,
    temperature: float,
    real_vocab_size: int | None,
    group: Any,
) -> tuple[LogprobContract, list[Any]]:
    """The trainer's contract, and its logits as every rank's shard in rank order (on a real
    group, gathered from the ranks)."""
    import torch

    if group is None:
        widths = [int(s.shape[1]) for s in shards]
        rank, world = 0, len(shards)
        columns = [s.detach() for s in shards]
    else:
        import torch.distributed as dist

        rank, world = dist.get_rank(group), dist.get_world_size(group)
        counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(counts, torch.tensor([shards[0].shape[1]]), group=group)
        widths = [int(c.item()) for c in counts]
        gathered = [torch.empty(shards[0].shape[0], w, dtype=shards[0].dtype) for w in widths]
        dist.all_gather(gathered, shards[0].detach().contiguous(), group=group)
        columns = gathered
    ends = np.cumsum(widths).tolist()
    bounds = tuple(zip([0, *ends[:-1]], ends, strict=True))
    padded = int(sum(widths))
    rv = padded if real_vocab_size is None else real_vocab_size
    contract = LogprobContract(
        role=LogprobRole.INFER,
        dtype=LogprobDType(dtype),
        mask=MaskSpec(rollout.num_tokens, active_mask=rollout.has_mask.tolist()),
        sharding=ShardingSpec(rank, world, bounds, rv, padded),
        reduction=ReductionSpec(DeterminismScope.FIXED_TOPOLOGY),
        temperature=temperature,
        export_lse=False,  # the check reads selected_logp only: no full-vocabulary partial
        support=rollout.support,
    )
    return contract, columns


def trainer_logprobs(
    logits: Any, rollout: EngineRollout, contract: LogprobContract, backend: str, group: Any
) -> tuple[Floats, AccumulationOrder]:
    """The backend's processed logprobs, and the order its capability declares it sums in
    (its bound's): on every emulated rank of ``logits`` (the shards in
    rank order), or on this rank's shard of the real ``group``; each rank calls the backend
    on one block of rows after another (:func:`_blocked`). A CPU backend on a long response
    is slow, so the emulated ranks wait as long as it takes (10 minutes)."""
    import torch

    from tp_logprob.emulate import run_tp
    from tp_logprob.preflight import preflight
    from tp_logprob.registry import registry

    targets = torch.as_tensor(np.where(rollout.has_mask, rollout.token_ids, 0), dtype=torch.int64)
    world = contract.sharding.tp_world_size
    dispatch = registry.get_logprob_op(
        contract, backend, preflighted=group is not None or world > 1
    )
    op = _blocked(dispatch.op, rollout, contract)
    with torch.no_grad():
        if group is None:
            result = run_tp(op, logits, targets, contract, timeout=600.0)[0]
        else:
            preflight(contract, dispatch.capability.backend_id, group)
            result = op(logits, targets, contract, group=group)
    order = dispatch.capability.accumulation_order
    return result.selected_logp.double().numpy(), order


def _blocked(op: Any, rollout: EngineRollout, contract: LogprobContract) -> Any:
    """``op`` on the whole response as a run of calls on blocks of rows, each with its block's
    contract (its rows' active mask and kept ids); the result holds ``selected_logp``.

    A backend's row never depends on the other rows (its reductions run along the row), so
    the blocks' outputs are the bits of one call on every row. A block of tens of MiB is
    several times faster on a CPU backend than one call on the whole response, whose every
    temporary is the size of the logits, and than many small calls, each of which waits on
    its collectives (4,096 rows at V = 152,064, two emulated ranks, median of two: 2^19
    values per block 16 s, 2^21 8 s, 2^23 6 s, 2^24 8 s, 2^25 12 s, for a backend that reads
    every column; torch_native reads a replayed mask's kept columns only and takes 9.7 s,
    2.1 s, 0.6 s and 0.2 s at 2^19, 2^21, 2^23 and 2^25, median of three). The ranks start
    once; each block is one call and its collectives."""
    from tp_logprob.result import LogprobResult

    n = rollout.num_tokens
    step = max(1, TRAINER_BLOCK_VALUES // max(contract.sharding.padded_vocab_size, 1))
    blocks = [
        (
            begin,
            min(n, begin + step),
            _block_contract(contract, rollout, begin, min(n, begin + step)),
        )
        for begin in range(0, max(n, 1), step)
    ]

    def call(logits: Any, targets: Any, rank_contract: LogprobContract, group: Any) -> Any:
        import torch

        rank = rank_contract.sharding.tp_rank
        found = [
            op(logits[begin:end], targets[begin:end], block.with_rank(rank), group=group)
            for begin, end, block in blocks
        ]
        return LogprobResult(torch.cat([r.selected_logp for r in found]), None)

    return call


def _block_contract(
    contract: LogprobContract, rollout: EngineRollout, begin: int, end: int
) -> LogprobContract:
    """``contract`` on rows ``begin:end`` of the response: their active mask and kept ids."""
    if (begin, end) == (0, rollout.num_tokens):
        return contract
    offsets = rollout.support.kept_offsets
    low, high = int(offsets[begin]), int(offsets[end])
    support = SupportSpec(
        kept_offsets=offsets[begin : end + 1] - low, kept_ids=rollout.support.kept_ids[low:high]
    )
    mask = MaskSpec(end - begin, active_mask=rollout.has_mask[begin:end].tolist())
    return replace(contract, mask=mask, support=support)


def logit_rows(columns: list[Any], index: Any) -> npt.NDArray[np.float32]:
    """Rows ``index`` (a slice or an array of row numbers) of the logits given as shards in
    rank order, as one float32 ``[rows, V]`` array. An fp32 shard, strided views included,
    is read through numpy's indexing (several times faster than torch's row gather)."""
    import torch

    parts = []
    for part in columns:
        if part.dtype == torch.float32:
            parts.append(part.numpy()[index])
        else:
            rows = index if isinstance(index, slice) else torch.as_tensor(index)
            parts.append(part[rows].to(torch.float32).numpy())
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


def kept_values(columns: list[Any], rollout: EngineRollout) -> tuple[Floats, npt.NDArray[np.int64]]:
    """The logits of every row's kept ids, ``[N, max kept]`` float64 padded with -inf, and
    the sampled token's place among them (0 for a row without a mask). Each id is read
    from the shard that holds it."""
    import torch

    counts = rollout.support.kept_counts()
    rows = np.repeat(np.arange(counts.size), counts)
    places = np.arange(rows.size) - np.repeat(rollout.support.kept_offsets[:-1], counts)
    ids = np.array(rollout.support.kept_ids)  # writable: torch refuses read-only arrays
    values = np.empty(ids.size)
    start = 0
    for part in columns:
        inside = (ids >= start) & (ids < start + part.shape[1])
        picked = part[torch.as_tensor(rows[inside]), torch.as_tensor(ids[inside] - start)]
        values[inside] = picked.to(torch.float32).double().numpy()
        start += part.shape[1]
    kept = np.full((counts.size, max(int(counts.max(initial=0)), 1)), -math.inf)
    kept[rows, places] = values
    local = np.zeros(counts.size, dtype=np.int64)
    sampled = ids == rollout.token_ids[rows]
    local[rows[sampled]] = places[sampled]
    return kept, local


def dense_mask(
    rollout: EngineRollout, rows: npt.NDArray[np.int64], width: int
) -> npt.NDArray[np.bool_]:
    """The engine's mask of ``rows`` as bool ``[len(rows), width]``."""
    offsets = rollout.support.kept_offsets
    mask = np.zeros((rows.size, width), dtype=np.bool_)
    for index, row in enumerate(rows.tolist()):
        mask[index, rollout.support.kept_ids[offsets[row] : offsets[row + 1]]] = True
    return mask
