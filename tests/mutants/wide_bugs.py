"""Mutants whose bug lives in a multi-block path: only rows wider than a block reach it.

Production kernels walk the vocabulary in blocks (here ``_BLOCK`` = 2048 columns)
with an online softmax, and keep a one-block fast path for narrow shards, which
is all the suite's usual shapes reach. These two copy torch_native's partial for
narrow shards and add the blocked path with one bug, marked ``# BUG:``; only the
wide sweep (``test_wide.py``) draws shards wide enough to run it.
"""

from __future__ import annotations

import torch

from tests.mutants._compose import forward_from, mutant
from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.merge import pack_partial
from tp_logprob.kernels.partials import (
    compute_dtype,
    local_partial,
    owned_target_logit,
    tree_sum,
)
from tp_logprob.kernels.shards import live_width

_BLOCK = 2048


def _blocked_partial(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    *,
    skip_last_partial: bool = False,
) -> torch.Tensor:
    width = live_width(contract)
    if width <= _BLOCK:
        return local_partial(local_logits, targets, contract)
    live = local_logits[:, :width].to(compute_dtype(local_logits.dtype))
    running_max = torch.full((live.shape[0],), float("-inf"), dtype=live.dtype)
    total = torch.zeros_like(running_max)
    starts = range(0, width, _BLOCK)
    for start in starts:
        if skip_last_partial and start + _BLOCK > width:
            break  # BUG: the last, partial block is never summed (a full-blocks-only loop)
        block = live[:, start : start + _BLOCK]
        block_max = torch.amax(block, dim=1)
        new_max = torch.maximum(running_max, block_max)
        shift = torch.where(new_max == float("-inf"), 0.0, new_max)
        rescale = torch.exp(
            torch.where(running_max == float("-inf"), float("-inf"), running_max - shift)
        )
        # The block is summed against its own max, then rescaled to the new one.
        block_sum = tree_sum(torch.exp(block - block_max.unsqueeze(1)))
        if not skip_last_partial:
            # BUG: a block with no finite value has block_max = -inf: exp(-inf - -inf) = NaN
            block_scale = torch.exp(block_max - shift)
        else:
            block_scale = torch.exp(
                torch.where(block_max == float("-inf"), float("-inf"), block_max - shift)
            )
            block_sum = torch.where(block_max == float("-inf"), 0.0, block_sum)
        total = total * rescale + block_sum * block_scale
        running_max = new_max
    return pack_partial(running_max, total, owned_target_logit(live, targets, contract))


def _partial_block_without_finite_value(
    local_logits: torch.Tensor, targets: torch.Tensor, contract: LogprobContract
) -> torch.Tensor:
    return _blocked_partial(local_logits, targets, contract)


def _partial_last_block_dropped(
    local_logits: torch.Tensor, targets: torch.Tensor, contract: LogprobContract
) -> torch.Tensor:
    return _blocked_partial(local_logits, targets, contract, skip_last_partial=True)


block_without_finite_value = mutant(
    "block_without_finite_value", forward=forward_from(_partial_block_without_finite_value)
)
last_block_dropped = mutant("last_block_dropped", forward=forward_from(_partial_last_block_dropped))
