"""Mutants with one bug in the per-rank partial (``partials.local_partial``).

Each function is a copy of ``tp_logprob.kernels.partials.local_partial`` with one
change, marked ``# BUG:``, built from the same public pieces; everything else
(checks, all-gather, merge, backward) is torch_native's own.
"""

from __future__ import annotations

import torch

from tests.mutants._compose import forward_from, mutant
from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.merge import pack_partial
from tp_logprob.kernels.partials import (
    compute_dtype,
    identity_partial,
    owned_target_logit,
    shift_by_max,
    tree_sum,
)
from tp_logprob.kernels.shards import live_width


def _identity(rows: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The identity partial these mutants pack: three fields (they claim no entropy)."""
    return identity_partial(rows, dtype, device, entropy=False)


def _shifted_sum(live: torch.Tensor, row_max: torch.Tensor) -> torch.Tensor:
    return tree_sum(torch.exp(shift_by_max(live, row_max)))


def _pack(
    live: torch.Tensor, row_max: torch.Tensor, targets: torch.Tensor, contract: LogprobContract
) -> torch.Tensor:
    target_logit = owned_target_logit(live, targets, contract)
    return pack_partial(row_max, _shifted_sum(live, row_max), target_logit)


def _partial_padding_not_masked(
    local_logits: torch.Tensor, targets: torch.Tensor, contract: LogprobContract
) -> torch.Tensor:
    dtype = compute_dtype(local_logits.dtype)
    if live_width(contract) == 0:
        return _identity(local_logits.shape[0], dtype, local_logits.device)
    live = local_logits.to(dtype)  # BUG: the whole shard, padding columns included
    row_max = torch.amax(live, dim=1)
    return _pack(live, row_max, targets, contract)


def _partial_padding_in_max_only(
    local_logits: torch.Tensor, targets: torch.Tensor, contract: LogprobContract
) -> torch.Tensor:
    dtype = compute_dtype(local_logits.dtype)
    width = live_width(contract)
    if width == 0:
        return _identity(local_logits.shape[0], dtype, local_logits.device)
    live = local_logits[:, :width].to(dtype)
    row_max = torch.amax(local_logits.to(dtype), dim=1)  # BUG: max over the padding too
    return _pack(live, row_max, targets, contract)


def _partial_padding_last_rank_only(
    local_logits: torch.Tensor, targets: torch.Tensor, contract: LogprobContract
) -> torch.Tensor:
    sharding = contract.sharding
    dtype = compute_dtype(local_logits.dtype)
    start, end = sharding.local_bounds
    # BUG: assumes Megatron's layout, where all padding sits in the last shard.
    if sharding.tp_rank == sharding.tp_world_size - 1:
        end = max(start, sharding.real_vocab_size)
    if end == start:
        return _identity(local_logits.shape[0], dtype, local_logits.device)
    live = local_logits[:, : end - start].to(dtype)
    row_max = torch.amax(live, dim=1)
    return _pack(live, row_max, targets, contract)


def _partial_last_column_dropped(
    local_logits: torch.Tensor, targets: torch.Tensor, contract: LogprobContract
) -> torch.Tensor:
    sharding = contract.sharding
    dtype = compute_dtype(local_logits.dtype)
    start, end = sharding.local_bounds
    end = max(start, min(end, sharding.real_vocab_size - 1))  # BUG: the last id, not the end
    if end == start:
        return _identity(local_logits.shape[0], dtype, local_logits.device)
    live = local_logits[:, : end - start].to(dtype)
    row_max = torch.amax(live, dim=1)
    owned = (targets >= start) & (targets < end)
    local = (targets.long() - start).clamp(0, end - start - 1)
    target_logit = torch.where(owned, live.gather(1, local.unsqueeze(1)).squeeze(1), 0.0)
    return pack_partial(row_max, _shifted_sum(live, row_max), target_logit)


def _partial_target_local_index(
    local_logits: torch.Tensor, targets: torch.Tensor, contract: LogprobContract
) -> torch.Tensor:
    dtype = compute_dtype(local_logits.dtype)
    width = live_width(contract)
    if width == 0:
        return _identity(local_logits.shape[0], dtype, local_logits.device)
    live = local_logits[:, :width].to(dtype)
    row_max = torch.amax(live, dim=1)
    start, live_end = contract.sharding.live_bounds()
    owned = (targets >= start) & (targets < live_end)
    local = targets.long().clamp(0, width - 1)  # BUG: the global id used as a column index
    target_logit = torch.where(owned, live.gather(1, local.unsqueeze(1)).squeeze(1), 0.0)
    return pack_partial(row_max, _shifted_sum(live, row_max), target_logit)


def _partial_half_precision(
    local_logits: torch.Tensor, targets: torch.Tensor, contract: LogprobContract
) -> torch.Tensor:
    dtype = local_logits.dtype  # BUG: exp and sum in bf16/fp16, not promoted to fp32
    width = live_width(contract)
    if width == 0:
        return _identity(local_logits.shape[0], dtype, local_logits.device)
    live = local_logits[:, :width].to(dtype)
    row_max = torch.amax(live, dim=1)
    return _pack(live, row_max, targets, contract)


def _partial_no_max_shift(
    local_logits: torch.Tensor, targets: torch.Tensor, contract: LogprobContract
) -> torch.Tensor:
    dtype = compute_dtype(local_logits.dtype)
    width = live_width(contract)
    if width == 0:
        return _identity(local_logits.shape[0], dtype, local_logits.device)
    live = local_logits[:, :width].to(dtype)
    zero = torch.zeros(live.shape[0], dtype=dtype, device=live.device)
    sum_exp = tree_sum(torch.exp(live))  # BUG: no max shift: exp overflows past ~88.7
    return pack_partial(zero, sum_exp, owned_target_logit(live, targets, contract))


_SMALL_BATCH = 4


def _left_fold(values: torch.Tensor) -> torch.Tensor:
    total = values[:, 0]
    for column in range(1, values.shape[1]):
        total = total + values[:, column]
    return total


def _partial_tiling_by_n(
    local_logits: torch.Tensor, targets: torch.Tensor, contract: LogprobContract
) -> torch.Tensor:
    dtype = compute_dtype(local_logits.dtype)
    width = live_width(contract)
    if width == 0:
        return _identity(local_logits.shape[0], dtype, local_logits.device)
    live = local_logits[:, :width].to(dtype)
    row_max = torch.amax(live, dim=1)
    terms = torch.exp(shift_by_max(live, row_max))
    # BUG: a small-batch (decode) path sums left to right: a row's bits depend on N.
    sum_exp = _left_fold(terms) if live.shape[0] < _SMALL_BATCH else tree_sum(terms)
    return pack_partial(row_max, sum_exp, owned_target_logit(live, targets, contract))


padding_not_masked = mutant("padding_not_masked", forward=forward_from(_partial_padding_not_masked))
padding_in_max_only = mutant(
    "padding_in_max_only", forward=forward_from(_partial_padding_in_max_only)
)
padding_last_rank_only = mutant(
    "padding_last_rank_only", forward=forward_from(_partial_padding_last_rank_only)
)
last_column_dropped = mutant(
    "last_column_dropped", forward=forward_from(_partial_last_column_dropped)
)
target_local_index = mutant("target_local_index", forward=forward_from(_partial_target_local_index))
half_precision_accumulation = mutant(
    "half_precision_accumulation", forward=forward_from(_partial_half_precision)
)
no_max_shift = mutant("no_max_shift", forward=forward_from(_partial_no_max_shift))
tiling_depends_on_n = mutant("tiling_depends_on_n", forward=forward_from(_partial_tiling_by_n))


def _partial_sequential_sum(
    local_logits: torch.Tensor, targets: torch.Tensor, contract: LogprobContract
) -> torch.Tensor:
    dtype = compute_dtype(local_logits.dtype)
    width = live_width(contract)
    if width == 0:
        return _identity(local_logits.shape[0], dtype, local_logits.device)
    live = local_logits[:, :width].to(dtype)
    row_max = torch.amax(live, dim=1)
    terms = torch.exp(shift_by_max(live, row_max))
    # BUG: left to right, while the capability (torch_native's) declares a pairwise tree.
    return pack_partial(row_max, _left_fold(terms), owned_target_logit(live, targets, contract))


sequential_declared_tree = mutant(
    "sequential_declared_tree", forward=forward_from(_partial_sequential_sum)
)
