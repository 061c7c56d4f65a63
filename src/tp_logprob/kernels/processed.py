"""A processed op's partial and merge in torch: the support's partial and the full one,
one all-gather.

``docs/semantics.md``, "Processed logprobs". With a support, a rank's partial is
torch_native's ``(m_r, s_r, t_r[, q_r])`` over its live columns with the columns
outside ``S`` set to ``-inf`` (as padding counts), so ``t_r`` is ``-inf`` when the
target lies outside ``S``; when the full ``lse`` is exported and ``S`` is not every
live column, the full partial's ``(m_r, s_r, t_r)`` follows in the same tensor.
Both travel in one all-gather and the existing merge (``kernels/merge.py``) folds
them: ``selected_logp = z_y - LSE_S``, ``support_lse``, the entropy over ``S`` and
the full ``lse``. With every rule off the support partial is the raw partial, so
the outputs are bitwise the op without a support.

:func:`support_block` gives a block of rows' mask, size and threshold (recomputed,
or a replayed mask's rows); torch_native runs :func:`processed_forward` on its live
``z``, torch_native_fused builds :func:`processed_partial` per chunk and ends with
:func:`merge_processed`.
"""

from __future__ import annotations

import torch

from tp_logprob.comm import GroupHandle
from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.merge import (
    PARTIAL_FIELDS,
    gather,
    merge_gathered,
    merge_partials,
    pack_partial,
)
from tp_logprob.kernels.partials import (
    compute_dtype,
    identity_partial,
    live_partial,
    scaled_logits,
    shift_by_max,
    sparse_tree_sum,
    tree_sum,
)
from tp_logprob.kernels.results import ProcessedOutputs
from tp_logprob.kernels.shards import owned_local_targets, owner_ranks
from tp_logprob.kernels.support_mask import ReplayedSupport, threshold_keep
from tp_logprob.kernels.support_threshold import sampling_rules, support_threshold
from tp_logprob.support import SupportMode

__all__ = [
    "SupportBlock",
    "merge_processed",
    "processed_fields",
    "processed_forward",
    "processed_partial",
    "replayed_forward",
    "replayed_partial",
    "separate_lse",
    "support_block",
]

_NEG_INF = float("-inf")

SupportBlock = tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]
"""``(keep, size, threshold)`` of a block of rows: the bool ``[rows, w]`` mask (None:
every live column), int64 ``|S|`` and the threshold (empty for a replayed mask)."""


def separate_lse(contract: LogprobContract) -> bool:
    """Whether the partial carries the full partial too: ``lse`` is exported and ``S`` may
    differ from the live vocabulary (a replayed mask, or a sampling rule that is on)."""
    if not contract.export_lse or contract.support is None:
        return False
    if contract.support_mode is SupportMode.REPLAYED_MASK:
        return True
    return not sampling_rules(contract).all_off


def processed_fields(contract: LogprobContract) -> int:
    """Columns of a :func:`processed_partial`: the support's partial, then the full one's
    ``(m_r, s_r, t_r)`` when :func:`separate_lse`."""
    fields = PARTIAL_FIELDS + int(contract.export_entropy)
    return fields + PARTIAL_FIELDS * int(separate_lse(contract))


def support_block(
    z: torch.Tensor,
    contract: LogprobContract,
    group: GroupHandle | None,
    replayed: ReplayedSupport | None = None,
    begin: int = 0,
) -> SupportBlock:
    """The support of rows ``begin:begin + len(z)`` from their live tempered logits ``z``.

    Sampling parameters: :func:`~tp_logprob.kernels.support_threshold.support_threshold`
    (collectives: every rank calls it on the same rows), ``keep`` None when every rule is
    off. A replayed mask (``replayed`` given): its rows, no collective.
    """
    if replayed is not None:
        end = begin + z.shape[0]
        empty = z.new_empty(0)
        return replayed.keep(begin, end), replayed.sizes[begin:end], empty
    tau, size = support_threshold(z, contract, group)
    keep = None if sampling_rules(contract).all_off else threshold_keep(z, tau)
    return keep, size, tau


def processed_partial(
    z: torch.Tensor, targets: torch.Tensor, contract: LogprobContract, keep: torch.Tensor | None
) -> torch.Tensor:
    """The packed partial of live tempered logits ``z`` over the support ``keep``, followed
    by the full partial's ``(m_r, s_r, t_r)`` when :func:`separate_lse`.

    A recomputed support is an upper set of ``z``: a rank that holds a column of ``S``
    holds its own maximum in ``S``, so both partials share ``exp(z - m_r)`` (one ``exp``
    instead of two) and the support's is bitwise the masked one a replayed mask takes.
    """
    if keep is None:
        return live_partial(z, targets, contract)
    if contract.support_mode is SupportMode.SAMPLING_PARAMS and z.shape[1] > 0:
        return _upper_set_partials(z, targets, contract, keep)
    support = live_partial(torch.where(keep, z, _NEG_INF), targets, contract)
    if not separate_lse(contract):
        return support
    return torch.cat([support, live_partial(z, targets, contract, entropy=False)], dim=1)


def replayed_partial(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    replayed: ReplayedSupport,
    keep: torch.Tensor,
) -> torch.Tensor:
    """:func:`processed_partial` of a replayed mask ``keep`` (every row of ``replayed``)
    read from its kept columns alone, without :func:`separate_lse`: bitwise the dense
    partial of ``z`` with every other column ``-inf``, in O(kept) instead of O(width).

    The kept ``z`` sit in a ``[N, most kept]`` block padded with ``-inf`` (the max, and
    NaN's propagation, as over the row), and the sums run the row's own tree over the
    kept places alone (:func:`~tp_logprob.kernels.partials.sparse_tree_sum`)."""
    rows, ids, places = replayed.entries()
    count = local_logits.shape[0]
    entropy = contract.export_entropy
    dtype = compute_dtype(local_logits.dtype)
    if replayed.width == 0:
        return identity_partial(count, dtype, local_logits.device, entropy=entropy)
    most = int(places.max()) + 1 if places.numel() else 1
    kept = torch.full((count, most), _NEG_INF, dtype=dtype, device=local_logits.device)
    kept[rows, places] = local_logits[rows, ids].to(dtype)
    z = scaled_logits(kept, contract)
    row_max = torch.amax(z, dim=1)
    shifted = shift_by_max(z, row_max)[rows, places]
    terms = torch.exp(shifted)
    sum_exp = sparse_tree_sum(rows, ids, terms, count, replayed.width)
    owned, local = owned_local_targets(targets, contract)
    column = local.unsqueeze(1)
    logit = scaled_logits(local_logits.gather(1, column).to(dtype), contract).squeeze(1)
    target = torch.where(keep.gather(1, column).squeeze(1), logit, _NEG_INF)
    entropy_sum = None
    if entropy:
        # exp(d) * d with d = -inf is 0 * -inf: a -inf column adds exactly 0 instead.
        spread = torch.where(shifted == _NEG_INF, 0.0, terms * shifted)
        entropy_sum = sparse_tree_sum(rows, ids, spread, count, replayed.width)
    return pack_partial(row_max, sum_exp, torch.where(owned, target, 0.0), entropy_sum)


def _upper_set_partials(
    z: torch.Tensor, targets: torch.Tensor, contract: LogprobContract, keep: torch.Tensor
) -> torch.Tensor:
    """:func:`processed_partial` for a ``keep`` that holds each row's local maximum when it
    holds any column: ``live_partial`` of the masked ``z`` (and of ``z``), step by step."""
    row_max = torch.amax(z, dim=1)
    shifted = shift_by_max(z, row_max)
    terms = torch.exp(shifted)
    kept_max = torch.where(keep.any(dim=1), row_max, _NEG_INF)
    owned, local = owned_local_targets(targets, contract)
    kept_target = keep.gather(1, local.unsqueeze(1)).squeeze(1)
    target = torch.where(kept_target, z.gather(1, local.unsqueeze(1)).squeeze(1), _NEG_INF)
    entropy = None
    if contract.export_entropy:
        # Columns outside S, and -inf columns, add exactly 0 (never 0 * -inf).
        kept_live = keep & (shifted != _NEG_INF)
        entropy = tree_sum(torch.where(kept_live, terms * shifted, 0.0))
    kept_sum = tree_sum(torch.where(keep, terms, 0.0))
    support = pack_partial(kept_max, kept_sum, torch.where(owned, target, 0.0), entropy)
    if not separate_lse(contract):
        return support
    full_target = torch.where(owned, z.gather(1, local.unsqueeze(1)).squeeze(1), 0.0)
    full = pack_partial(row_max, tree_sum(terms), full_target)
    return torch.cat([support, full], dim=1)


def merge_processed(
    partial: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: GroupHandle | None,
    size: torch.Tensor,
    threshold: torch.Tensor,
) -> ProcessedOutputs:
    """One all-gather of the :func:`processed_partial`, then the merges, in the partials'
    dtype. ``support_lse`` is NaN where a recomputed support is undefined (``threshold``
    NaN); without :func:`separate_lse`, ``lse`` is the support's (every live column, or
    not exported)."""
    gathered = gather(partial, group)
    fields = PARTIAL_FIELDS + int(contract.export_entropy)
    support = [part[:, :fields] for part in gathered]
    selected, support_lse, entropy = merge_gathered(support, targets, active, contract)
    if separate_lse(contract):
        full = [part[:, fields:] for part in gathered]
        lse = merge_partials(full, owner_ranks(targets, contract), active)[1]
    else:
        lse = support_lse.clone()  # two outputs of an autograd Function: two tensors
    if contract.support_mode is SupportMode.SAMPLING_PARAMS:
        support_lse = torch.where(torch.isnan(threshold), float("nan"), support_lse)
    return selected, lse, entropy, support_lse, size, threshold


def processed_forward(
    z: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: GroupHandle | None,
) -> tuple[ProcessedOutputs, torch.Tensor | None]:
    """The processed outputs from this rank's live tempered logits ``z`` (all rows), and the
    support mask (None: every live column) for the backward."""
    replayed = None
    if contract.support_mode is SupportMode.REPLAYED_MASK:
        replayed = ReplayedSupport(contract, z.device)
    keep, size, threshold = support_block(z, contract, group, replayed)
    partial = processed_partial(z, targets, contract, keep)
    return merge_processed(partial, targets, active, contract, group, size, threshold), keep


def replayed_forward(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: GroupHandle | None,
) -> tuple[ProcessedOutputs, torch.Tensor]:
    """:func:`processed_forward` of a replayed mask without :func:`separate_lse`, from this
    rank's logits ``local_logits``: it reads the kept columns only (:func:`replayed_partial`),
    so a response of a few kept ids per row costs O(kept), not O(vocabulary)."""
    replayed = ReplayedSupport(contract, local_logits.device)
    keep = replayed.keep()
    partial = replayed_partial(local_logits, targets, contract, replayed, keep)
    empty = local_logits.new_empty(0)
    return merge_processed(partial, targets, active, contract, group, replayed.sizes, empty), keep
