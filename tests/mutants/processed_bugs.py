"""Mutants with one bug in a processed logprob (a sampling support), each a real engine or
trainer difference (issue 20): how engines truncate, and how trainers apply the mask.

Each private function is a step of torch_native's processed op (``support_block``,
``merge_processed``, ``ReplayedSupport`` of ``kernels/processed.py`` and
``kernels/support_mask.py``, around ``support_threshold``) with one change, marked
``# BUG:``; :func:`~tests.mutants._compose.processed_forward_from` puts it in
native's place. Every mutant claims what torch_native claims (temperature, entropy,
both sampling supports, per-row parameters); ``control_processed``, the unmutated
composition, must pass the whole suite. ``first_row_temperature`` is the unmutated op
behind a front that, as the Triton backends do, serves an engine batch one set of
rules at a time with each row's own temperature, except that it divides every row by
row 0's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from tests.mutants._compose import MutantPair, compose_processed, processed_forward_from
from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.heterogeneous import by_rule_groups
from tp_logprob.kernels.merge import PARTIAL_FIELDS, gather, merge_gathered, merge_partials
from tp_logprob.kernels.partials import live_logits
from tp_logprob.kernels.processed import SupportBlock, separate_lse, support_block
from tp_logprob.kernels.results import ProcessedOutputs
from tp_logprob.kernels.shards import owner_ranks
from tp_logprob.kernels.support_mask import ReplayedSupport, threshold_keep
from tp_logprob.kernels.support_threshold import sampling_rules, support_threshold
from tp_logprob.support import SupportMode, SupportSpec

_INF = float("inf")


def _processed_mutant(name: str, **steps: Any) -> MutantPair:
    return compose_processed(f"mutant_{name}", processed_forward_from(**steps))


def _rank(group: Any) -> int:
    return 0 if group is None else int(group.rank)


def _gathered(values: torch.Tensor, group: Any) -> torch.Tensor:
    """Every rank's per-row ``values``, stacked ``[R, N]`` in rank order."""
    return torch.stack(gather(values.contiguous(), group))


def _row_extreme(values: torch.Tensor, largest: bool) -> torch.Tensor:
    """Each row's max (or min) of ``values`` ``[N, w]``; ``-inf`` (``+inf``) for ``w = 0``."""
    if values.shape[1] == 0:
        return values.new_full((values.shape[0],), -_INF if largest else _INF)
    return values.amax(dim=1) if largest else values.amin(dim=1)


def _rebuilt(
    z: torch.Tensor, keep: torch.Tensor, undefined: torch.Tensor, group: Any
) -> SupportBlock:
    """``(keep, size, threshold)`` of a support given as a mask: the size and the least kept
    ``z`` over every rank (NaN and 0 where the support is undefined)."""
    size = _gathered(keep.sum(dim=1), group).sum(dim=0)
    least = _gathered(_row_extreme(torch.where(keep, z, _INF), False), group).amin(dim=0)
    least = torch.where(least == 0.0, 0.0, least)  # -0.0 as +0.0, as the threshold is
    return (
        keep,
        torch.where(undefined, 0, size),
        torch.where(undefined, float("nan"), least),
    )


def _block_cutting_ties(
    local_logits: torch.Tensor,
    z: torch.Tensor,
    contract: LogprobContract,
    group: Any,
    replayed: ReplayedSupport | None,
) -> SupportBlock:
    keep, size, tau = support_block(z, contract, group, replayed)
    top_k = None if replayed is not None else sampling_rules(contract).top_k
    if top_k is None or keep is None:
        return keep, size, tau
    above = z > tau.unsqueeze(1)
    tied = keep & ~above
    room = top_k - _gathered(above.sum(dim=1), group).sum(dim=0)
    before = _gathered(tied.sum(dim=1), group)[: _rank(group)].sum(dim=0)
    order = before.unsqueeze(1) + torch.cumsum(tied, dim=1) - 1
    # BUG: exactly top_k tokens, as torch.topk keeps them: the tie at the k-th value cut by
    # vocabulary id (the lowest ids kept), where every token tied with the k-th is kept.
    cut = above | (tied & (order < room.unsqueeze(1)))
    keep = torch.where(torch.isnan(tau).unsqueeze(1), keep, cut)  # undefined rows as native
    return keep, torch.minimum(size, torch.full_like(size, top_k)), tau


def _block_dropping_crossing_token(
    local_logits: torch.Tensor,
    z: torch.Tensor,
    contract: LogprobContract,
    group: Any,
    replayed: ReplayedSupport | None,
) -> SupportBlock:
    keep, size, tau = support_block(z, contract, group, replayed)
    if replayed is not None or sampling_rules(contract).top_p is None:
        return keep, size, tau
    row_max = _gathered(_row_extreme(z, True), group).amax(dim=0)
    # BUG: top-p keeps a token when the cumulative mass through it, its own and its ties'
    # included, is <= top_p (cumsum <= p, without the shift by one), not when the mass
    # strictly above it is < top_p: the token that crosses top_p is dropped (the max kept).
    crossing_dropped = (z > tau.unsqueeze(1)) | (z == row_max.unsqueeze(1))
    undefined = torch.isnan(tau)
    keep = crossing_dropped | undefined.unsqueeze(1)  # undefined rows keep every column
    return _rebuilt(z, keep, undefined, group)


def _intersection(
    z: torch.Tensor, contract: LogprobContract, group: Any, parts: list[SupportSpec]
) -> SupportBlock:
    """The supports of ``parts``, each recomputed from ``z`` on its own, intersected."""
    taus = [
        support_threshold(z, dataclasses.replace(contract, support=part), group)[0]
        for part in parts
    ]
    tau = torch.stack(taus).amax(dim=0)  # NaN, where the support is undefined, propagates
    return _rebuilt(z, threshold_keep(z, tau), torch.isnan(tau), group)


def _block_rules_apart(
    local_logits: torch.Tensor,
    z: torch.Tensor,
    contract: LogprobContract,
    group: Any,
    replayed: ReplayedSupport | None,
) -> SupportBlock:
    if replayed is not None or sampling_rules(contract).all_off:
        return support_block(z, contract, group, replayed)
    spec = contract.support
    assert spec is not None
    rules = {"top_k": spec.top_k, "top_p": spec.top_p, "min_p": spec.min_p}
    # BUG: SGLang's joint rule: top-k, top-p and min-p each on the full distribution, their
    # supports intersected; top-p is not renormalised over min-p's and top-k's survivors.
    parts = [SupportSpec(**{rule: value}) for rule, value in rules.items() if value is not None]
    return _intersection(z, contract, group, parts)


def _block_min_p_last(
    local_logits: torch.Tensor,
    z: torch.Tensor,
    contract: LogprobContract,
    group: Any,
    replayed: ReplayedSupport | None,
) -> SupportBlock:
    spec = contract.support
    if replayed is not None or spec is None or spec.min_p is None:
        return support_block(z, contract, group, replayed)
    if spec.top_k is None and spec.top_p is None:
        return support_block(z, contract, group, replayed)
    # BUG: min-p applied after top-k and top-p (on their survivors), not first: top-p is
    # not renormalised over min-p's survivors.
    parts = [SupportSpec(top_k=spec.top_k, top_p=spec.top_p), SupportSpec(min_p=spec.min_p)]
    return _intersection(z, contract, group, parts)


def _block_min_p_local_max(
    local_logits: torch.Tensor,
    z: torch.Tensor,
    contract: LogprobContract,
    group: Any,
    replayed: ReplayedSupport | None,
) -> SupportBlock:
    native = support_block(z, contract, group, replayed)
    rules = sampling_rules(contract)
    if replayed is not None or rules.min_p is None:
        return native
    # BUG: min-p's bar from this rank's own max (exp(z - local max) >= min_p), not the
    # row's max over every rank; top-k and top-p then run across the ranks on the survivors.
    kept = torch.exp(z - _row_extreme(z, True).unsqueeze(1)) >= rules.min_p
    if rules.top_k is not None or rules.top_p is not None:
        rest = SupportSpec(top_k=rules.top_k, top_p=rules.top_p)
        survivors = torch.where(kept, z, -_INF)
        tau, _ = support_threshold(survivors, dataclasses.replace(contract, support=rest), group)
        kept = kept & threshold_keep(survivors, tau)
    undefined = torch.isnan(native[2])
    if bool(undefined.any()):  # rows without a support: as native
        return native
    return _rebuilt(z, kept, undefined, group)


def _block_untempered(
    local_logits: torch.Tensor,
    z: torch.Tensor,
    contract: LogprobContract,
    group: Any,
    replayed: ReplayedSupport | None,
) -> SupportBlock:
    if replayed is not None or sampling_rules(contract).all_off:
        return support_block(z, contract, group, replayed)
    # BUG: the support's rules read the logits before the temperature (truncate, then
    # divide by T), not z = x / T: min-p and top-p weigh other masses.
    x = live_logits(local_logits, dataclasses.replace(contract, temperature=1.0))
    tau_x, _ = support_threshold(x, contract, group)
    return _rebuilt(z, threshold_keep(x, tau_x), torch.isnan(tau_x), group)


def _merge_without_renormalising(
    partial: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: Any,
    size: torch.Tensor,
    threshold: torch.Tensor,
) -> ProcessedOutputs:
    gathered = gather(partial, group)
    fields = PARTIAL_FIELDS + int(contract.export_entropy)
    support = [part[:, :fields] for part in gathered]
    selected, support_lse, entropy = merge_gathered(support, targets, active, contract)
    if separate_lse(contract):
        full = [part[:, fields:] for part in gathered]
        full_selected, lse = merge_partials(full, owner_ranks(targets, contract), active)
        # BUG: the mask applied to the trainer's logprob without renormalising: z_y - LSE
        # over the whole vocabulary where the target is in S, not z_y - LSE_S.
        selected = torch.where(selected == -_INF, selected, full_selected)
    else:
        lse = support_lse.clone()
    if contract.support_mode is SupportMode.SAMPLING_PARAMS:
        support_lse = torch.where(torch.isnan(threshold), float("nan"), support_lse)
    return selected, lse, entropy, support_lse, size, threshold


def _block_per_shard(
    local_logits: torch.Tensor,
    z: torch.Tensor,
    contract: LogprobContract,
    group: Any,
    replayed: ReplayedSupport | None,
) -> SupportBlock:
    if replayed is not None:
        return support_block(z, contract, group, replayed)
    # BUG: the support recomputed from this rank's shard alone (a local top-k, top-p and
    # min-p), never across the ranks: group=None.
    tau, size = support_threshold(z, contract, None)
    keep = None if sampling_rules(contract).all_off else threshold_keep(z, tau)
    return keep, size, tau


class _LocalIdsReplayedSupport(ReplayedSupport):
    """ReplayedSupport reading the kept ids as this rank's local column ids."""

    def __init__(self, contract: LogprobContract, device: torch.device) -> None:
        support = contract.support
        assert support is not None
        start, live_end = contract.sharding.live_bounds()
        # BUG: the kept ids read as local column ids (the ids in [0, width) kept on every
        # rank), not as global ids shifted by the shard's start.
        offsets, ids = support.local_kept(0, live_end - start)
        self.width = live_end - start
        self._offsets = offsets
        rows = np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))
        self._rows = torch.from_numpy(rows).to(device)
        self._ids = torch.from_numpy(ids).to(device)
        self.sizes = torch.from_numpy(support.kept_counts().copy()).to(device)


control_processed = compose_processed("control_processed", processed_forward_from())
"""torch_native's processed op rebuilt from the same steps with none replaced: must pass."""

top_k_exactly_k = _processed_mutant("top_k_exactly_k", block=_block_cutting_ties)
top_p_inclusive_cumsum = _processed_mutant(
    "top_p_inclusive_cumsum", block=_block_dropping_crossing_token
)
rules_on_full_distribution = _processed_mutant(
    "rules_on_full_distribution", block=_block_rules_apart
)
min_p_last = _processed_mutant("min_p_last", block=_block_min_p_last)
temperature_after_truncation = _processed_mutant(
    "temperature_after_truncation", block=_block_untempered
)
mask_not_renormalised = _processed_mutant(
    "mask_not_renormalised", merge=_merge_without_renormalising
)
support_per_shard = _processed_mutant("support_per_shard", block=_block_per_shard)
min_p_local_max = _processed_mutant("min_p_local_max", block=_block_min_p_local_max)
replayed_local_ids = _processed_mutant(
    "replayed_local_ids", replayed_support=_LocalIdsReplayedSupport
)


def _first_row_temperature(op: Any) -> Any:
    """``op`` behind a per-row temperature front: one call per set of sampling rules
    (``by_rule_groups``), as the Triton backends launch their kernels."""

    def each_set_of_rules(
        local_logits: torch.Tensor,
        targets: torch.Tensor,
        contract: LogprobContract,
        group: Any = None,
    ) -> Any:
        if isinstance(contract.temperature, tuple) and contract.num_tokens:
            # BUG: one temperature per launch: every row is divided by row 0's (1 if greedy).
            contract = dataclasses.replace(contract, temperature=contract.temperature[0] or 1.0)
        return op(local_logits, targets, contract, group)

    each_set_of_rules.__qualname__ = each_set_of_rules.__name__ = "mutant_first_row_temperature"
    return by_rule_groups(each_set_of_rules)


first_row_temperature = (
    _first_row_temperature(control_processed[0]),
    dataclasses.replace(control_processed[1], backend_id="mutant_first_row_temperature"),
)
