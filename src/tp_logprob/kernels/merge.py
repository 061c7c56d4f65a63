"""The cross-rank merge of per-shard partials, in global shard-index order.

``docs/semantics.md``, "The per-rank partial and the merge", states what it computes.

Every rank runs this on the same gathered partials in the same order, so every
rank gets the same bits. Each partial is an fp32 ``[N, 3]`` tensor of
``(m_r, s_r, t_r)``: the shard's max and ``sum exp(z - m_r)`` over live columns,
and the target logit where rank r owns the target column (anything elsewhere).
With entropy a fourth field carries ``q_r = sum exp(z - m_r) (z - m_r)``.

:func:`gather_and_merge` is the whole tail of a torch backend's forward (one
all-gather, then both merges); torch_native, torch_native_fused and their mutants
end with it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tp_logprob.comm import GroupHandle
from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.shards import owner_ranks

__all__ = [
    "ENTROPY_FIELD",
    "PARTIAL_FIELDS",
    "finish_selected",
    "gather",
    "gather_and_merge",
    "merge_entropy",
    "merge_gathered",
    "merge_partials",
    "pack_partial",
]

PARTIAL_FIELDS = 3
ENTROPY_FIELD = 3
"""Index of ``q_r`` in a partial that carries entropy (``PARTIAL_FIELDS + 1`` fields)."""


def pack_partial(
    row_max: torch.Tensor,
    sum_exp: torch.Tensor,
    target_logit: torch.Tensor,
    entropy_sum: torch.Tensor | None = None,
) -> torch.Tensor:
    """Stack one rank's fp32 partial for the all-gather: a single collective per call.

    float64 partials stay float64 (for gradcheck through the real code path).
    """
    dtype = torch.promote_types(row_max.dtype, torch.float32)
    fields = [row_max, sum_exp, target_logit]
    if entropy_sum is not None:
        fields.append(entropy_sum)
    return torch.stack([field.to(dtype) for field in fields], dim=1).contiguous()


def merge_partials(
    partials: Sequence[torch.Tensor], owners: torch.Tensor, active: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold gathered partials into ``(selected_logp, lse)`` in the partials' dtype, ``[N]``.

    ``M = max_r m_r``, ``S = sum_r s_r * exp(m_r - M)`` summed in rank order, and
    ``LSE = M + log S``. A shard whose max is ``-inf`` is the identity ``(-inf, 0)``
    and is skipped rather than evaluating ``exp(-inf - -inf)``.

    The fold runs in float64 and rounds once at the end, and ``selected_logp`` is
    formed as ``(t - M) - log S`` (Blanchard, Higham & Higham 2021), so a dominant
    logit's logprob near 0 keeps its relative accuracy instead of inheriting one
    ulp of LSE. It costs O(N * R) flops.
    """
    stacked = torch.stack(list(partials), dim=0)  # [R, N, 3]
    wide = stacked.to(torch.promote_types(stacked.dtype, torch.float64))
    maxima, sums = wide[..., 0], wide[..., 1]
    global_max = maxima[0]
    for rank_max in maxima[1:]:
        global_max = torch.maximum(global_max, rank_max)  # propagates NaN
    total = torch.zeros_like(global_max)
    for rank_max, rank_sum in zip(maxima, sums, strict=True):
        live = rank_max != float("-inf")
        scale = torch.exp(torch.where(live, rank_max - global_max, 0.0))
        total = total + torch.where(live, rank_sum * scale, 0.0)
    log_sum = torch.log(total)
    lse = torch.where(global_max == float("inf"), global_max, global_max + log_sum)
    target_logit = wide[..., 2].gather(0, owners.long().unsqueeze(0)).squeeze(0)
    # (t - M) - log S rather than t - LSE: when the target is the maximum, t - M is
    # exact and the logprob keeps its relative accuracy however large M is. With
    # M = +inf, S is NaN (inf - inf), so the result is NaN, as docs/semantics.md requires.
    selected = finish_selected(target_logit - global_max, log_sum, active)
    return selected.to(stacked.dtype), lse.to(stacked.dtype)


def finish_selected(
    target_logit: torch.Tensor, lse: torch.Tensor, active: torch.Tensor
) -> torch.Tensor:
    """``target - lse`` with the special values of ``docs/semantics.md``; exactly 0.0 when inactive.

    Also takes the split form ``(target - M, log S)``, which the merge uses.
    """
    selected = target_logit - lse
    selected = torch.where(lse == float("inf"), float("nan"), selected)
    return torch.where(active, selected, 0.0)


def merge_entropy(partials: Sequence[torch.Tensor], active: torch.Tensor) -> torch.Tensor:
    """Fold gathered ``[N, 4]`` partials into ``entropy = log S - Q / S``, in rank order.

    ``Q = sum_r exp(m_r - M) (q_r + (m_r - M) s_r)`` re-centres each shard's
    ``sum exp(z - m_r) (z - m_r)`` on the global max; shards without a live
    column are skipped. Runs in float64 and rounds once. NaN for rows with a NaN,
    a ``+inf`` or no finite live logit (``M`` not finite); exactly 0.0 when inactive.
    """
    stacked = torch.stack(list(partials), dim=0)  # [R, N, 4]
    wide = stacked.to(torch.promote_types(stacked.dtype, torch.float64))
    maxima, sums, shifted = wide[..., 0], wide[..., 1], wide[..., ENTROPY_FIELD]
    global_max = maxima[0]
    for rank_max in maxima[1:]:
        global_max = torch.maximum(global_max, rank_max)  # propagates NaN
    finite = torch.isfinite(global_max)
    total = torch.zeros_like(global_max)
    moment = torch.zeros_like(global_max)
    for rank_max, rank_sum, rank_moment in zip(maxima, sums, shifted, strict=True):
        live = finite & (rank_max != float("-inf"))
        gap = torch.where(live, rank_max - global_max, 0.0)
        scale = torch.exp(gap)
        total = total + torch.where(live, rank_sum * scale, 0.0)
        moment = moment + torch.where(live, scale * (rank_moment + gap * rank_sum), 0.0)
    safe_total = torch.where(finite, total, 1.0)
    entropy = torch.log(safe_total) - moment / safe_total
    entropy = torch.where(finite, entropy, float("nan"))
    return torch.where(active, entropy, 0.0).to(stacked.dtype)


def gather(partial: torch.Tensor, group: GroupHandle | None) -> list[torch.Tensor]:
    """Every rank's partial in rank order, by one all-gather (``group=None``: TP=1)."""
    return [partial] if group is None else group.all_gather(partial)


def merge_gathered(
    partials: Sequence[torch.Tensor],
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(selected_logp, lse, entropy)`` from gathered partials, in the partials' dtype.

    ``entropy`` is an empty tensor unless the contract exports it.
    """
    selected, lse = merge_partials(partials, owner_ranks(targets, contract), active)
    entropy = merge_entropy(partials, active) if contract.export_entropy else selected.new_empty(0)
    return selected, lse, entropy


def gather_and_merge(
    partial: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: GroupHandle | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's partial all-gathered once and merged: :func:`gather`, then
    :func:`merge_gathered`."""
    return merge_gathered(gather(partial, group), targets, active, contract)
