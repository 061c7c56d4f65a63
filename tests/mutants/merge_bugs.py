"""Mutants with one bug in the cross-rank exchange or merge (``native_forward``, ``merge.py``).

Each private function is a copy of ``merge_partials``, ``owner_ranks`` or
``native_forward`` with one change, marked ``# BUG:``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tests.mutants._compose import forward_from, mutant
from tp_logprob.contract import DeterminismScope, LogprobContract
from tp_logprob.kernels.merge import finish_selected, gather, merge_partials
from tp_logprob.kernels.native import native_forward
from tp_logprob.kernels.partials import local_partial
from tp_logprob.kernels.shards import owner_ranks

_INF = float("inf")


def _global_max(maxima: torch.Tensor) -> torch.Tensor:
    global_max = maxima[0]
    for rank_max in maxima[1:]:
        global_max = torch.maximum(global_max, rank_max)
    return global_max


def _finish(
    stacked: torch.Tensor,
    global_max: torch.Tensor,
    total: torch.Tensor,
    owners: torch.Tensor,
    active: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """merge_partials after the sum: ``LSE = M + log S``, +inf kept, the owner's target."""
    lse = global_max + torch.log(total)
    lse = torch.where(global_max == _INF, global_max, lse)
    target_logit = stacked[..., 2].gather(0, owners.long().unsqueeze(0)).squeeze(0)
    return finish_selected(target_logit, lse, active), lse


def _merge_lse_average(
    partials: Sequence[torch.Tensor], owners: torch.Tensor, active: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    stacked = torch.stack(list(partials), dim=0)
    maxima, sums = stacked[..., 0], stacked[..., 1]
    global_max = _global_max(maxima)
    lse = (maxima + torch.log(sums)).mean(dim=0)  # BUG: the mean of the per-rank LSEs
    lse = torch.where(global_max == _INF, global_max, lse)
    target_logit = stacked[..., 2].gather(0, owners.long().unsqueeze(0)).squeeze(0)
    return finish_selected(target_logit, lse, active), lse


def _merge_no_rescale(
    partials: Sequence[torch.Tensor], owners: torch.Tensor, active: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    stacked = torch.stack(list(partials), dim=0)
    maxima, sums = stacked[..., 0], stacked[..., 1]
    global_max = _global_max(maxima)
    total = torch.zeros_like(global_max)
    for rank_max, rank_sum in zip(maxima, sums, strict=True):
        live = rank_max != float("-inf")
        total = total + torch.where(live, rank_sum, 0.0)  # BUG: not rescaled by exp(m_r - M)
    return _finish(stacked, global_max, total, owners, active)


def _merge_identity_nan(
    partials: Sequence[torch.Tensor], owners: torch.Tensor, active: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    stacked = torch.stack(list(partials), dim=0)
    maxima, sums = stacked[..., 0], stacked[..., 1]
    global_max = _global_max(maxima)
    total = torch.zeros_like(global_max)
    for rank_max, rank_sum in zip(maxima, sums, strict=True):
        # BUG: no skip of identity partials: exp(-inf - -inf) is NaN when every m_r is -inf.
        total = total + rank_sum * torch.exp(rank_max - global_max)
    return _finish(stacked, global_max, total, owners, active)


def _merge_plus_inf_not_special(
    partials: Sequence[torch.Tensor], owners: torch.Tensor, active: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    stacked = torch.stack(list(partials), dim=0)
    maxima, sums = stacked[..., 0], stacked[..., 1]
    global_max = _global_max(maxima)
    total = torch.zeros_like(global_max)
    for rank_max, rank_sum in zip(maxima, sums, strict=True):
        live = rank_max != float("-inf")
        scale = torch.exp(torch.where(live, rank_max - global_max, 0.0))
        total = total + torch.where(live, rank_sum * scale, 0.0)
    lse = global_max + torch.log(total)  # BUG: no +inf case: M = +inf gives inf + log(NaN)
    target_logit = stacked[..., 2].gather(0, owners.long().unsqueeze(0)).squeeze(0)
    return finish_selected(target_logit, lse, active), lse


def _merge_reversed(
    partials: Sequence[torch.Tensor], owners: torch.Tensor, active: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    stacked = torch.stack(list(partials), dim=0)
    maxima, sums = stacked[..., 0], stacked[..., 1]
    global_max = _global_max(maxima)
    total = torch.zeros_like(global_max)
    # BUG (with the cross_tp_bitwise claim): a fixed order is not a fixed grouping across layouts.
    for rank_max, rank_sum in zip(maxima.flip(0), sums.flip(0), strict=True):
        live = rank_max != float("-inf")
        scale = torch.exp(torch.where(live, rank_max - global_max, 0.0))
        total = total + torch.where(live, rank_sum * scale, 0.0)
    return _finish(stacked, global_max, total, owners, active)


def _merge_from_rank(
    partials: Sequence[torch.Tensor], owners: torch.Tensor, active: torch.Tensor, first: int
) -> tuple[torch.Tensor, torch.Tensor]:
    stacked = torch.stack(list(partials), dim=0)
    maxima, sums = stacked[..., 0], stacked[..., 1]
    global_max = _global_max(maxima)
    total = torch.zeros_like(global_max)
    world = len(partials)
    for step in range(world):
        rank = (first + step) % world  # BUG: ring order, starting at this rank's own partial
        live = maxima[rank] != float("-inf")
        scale = torch.exp(torch.where(live, maxima[rank] - global_max, 0.0))
        total = total + torch.where(live, sums[rank] * scale, 0.0)
    return _finish(stacked, global_max, total, owners, active)


def _forward_ring_order(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    partials = gather(local_partial(local_logits, targets, contract), group)
    owners = owner_ranks(targets, contract)
    return _merge_from_rank(partials, owners, active, contract.sharding.tp_rank)


def _forward_rank1_last_bit(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    selected, lse, _ = native_forward(local_logits, targets, active, contract, group)
    if contract.sharding.tp_rank == 1:  # BUG: rank 1's log differs in the last bit
        lse = torch.nextafter(lse, torch.full_like(lse, _INF))
    return selected, lse


def _forward_bf16_transport(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    partial = local_partial(local_logits, targets, contract)
    if group is None:
        partials = [partial]
    else:
        # BUG: partials all-gathered in the logits dtype to halve the traffic.
        sent = partial.to(local_logits.dtype)
        partials = [gathered.to(partial.dtype) for gathered in group.all_gather(sent)]
    return merge_partials(partials, owner_ranks(targets, contract), active)


def _owners_off_by_one(targets: torch.Tensor, contract: LogprobContract) -> torch.Tensor:
    ends = torch.tensor(
        [end for _, end in contract.sharding.vocab_shard_bounds],
        dtype=targets.dtype,
        device=targets.device,
    )
    # BUG: right=False: a target equal to a shard's end (the next shard's first column)
    # is assigned to the shard before it.
    owners = torch.bucketize(targets.contiguous(), ends, right=False)
    return owners.clamp_(0, contract.sharding.tp_world_size - 1)


lse_average = mutant("lse_average", forward=forward_from(merge=_merge_lse_average))
merge_no_rescale = mutant("merge_no_rescale", forward=forward_from(merge=_merge_no_rescale))
identity_nan = mutant("identity_nan", forward=forward_from(merge=_merge_identity_nan))
plus_inf_not_special = mutant(
    "plus_inf_not_special", forward=forward_from(merge=_merge_plus_inf_not_special)
)
owner_off_by_one = mutant("owner_off_by_one", forward=forward_from(owners=_owners_off_by_one))
reverse_merge_cross_tp = mutant(
    "reverse_merge_cross_tp",
    forward=forward_from(merge=_merge_reversed),
    determinism_scopes=frozenset({DeterminismScope.CROSS_TP_BITWISE}),
)
ring_order_merge = mutant("ring_order_merge", forward=_forward_ring_order)
rank1_lse_last_bit = mutant("rank1_lse_last_bit", forward=_forward_rank1_last_bit)
partials_in_logits_dtype = mutant("partials_in_logits_dtype", forward=_forward_bf16_transport)
