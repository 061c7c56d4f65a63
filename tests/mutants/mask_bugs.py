"""Mutants with one bug in input checking or in the handling of inactive tokens.

Each private function is a copy of a step of torch_native (``check_op_inputs``,
``native_forward``) with one change, marked ``# BUG:``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tests.mutants._compose import forward_from, mutant
from tp_logprob.contract import LogprobContract
from tp_logprob.errors import LogprobContractError
from tp_logprob.kernels.merge import gather, merge_partials
from tp_logprob.kernels.native import native_forward
from tp_logprob.kernels.partials import local_partial
from tp_logprob.kernels.shards import owner_ranks
from tp_logprob.kernels.validation import active_mask_tensor, check_op_inputs


def _merge_without_mask(
    partials: Sequence[torch.Tensor], owners: torch.Tensor, active: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    # BUG: the mask is not passed on, so inactive rows get target - LSE from a garbage owner.
    return merge_partials(partials, owners, torch.ones_like(active))


def _forward_masking_lse(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    selected, lse, _ = native_forward(local_logits, targets, active, contract, group)
    return selected, torch.where(active, lse, 0.0)  # BUG: an inactive row's lse is its LSE too


def _check_every_target(
    local_logits: Any, targets: Any, contract: Any, group: Any = None
) -> torch.Tensor:
    active = check_op_inputs(local_logits, targets, contract, group)
    real = contract.sharding.real_vocab_size
    bad = (targets < 0) | (targets >= real)  # BUG: inactive targets checked (and read) too
    if bool(bad.any()):
        index = int(torch.nonzero(bad)[0, 0])
        raise LogprobContractError(
            f"targets[{index}]={int(targets[index])}: outside [0, real_vocab_size={real})"
        )
    return active


def _mask_only(local_logits: Any, targets: Any, contract: Any, group: Any = None) -> torch.Tensor:
    return active_mask_tensor(contract, local_logits.device)  # checked in the forward


def _forward_checking_late(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    partials = gather(local_partial(local_logits, targets, contract), group)
    # BUG: inputs checked after the collective: a rank with a bad input leaves its
    # peers waiting in the all-gather (or crashes) before it can raise.
    check_op_inputs(local_logits, targets, contract, group)
    return merge_partials(partials, owner_ranks(targets, contract), active)


inactive_not_zeroed = mutant("inactive_not_zeroed", forward=forward_from(merge=_merge_without_mask))
inactive_lse_zeroed = mutant("inactive_lse_zeroed", forward=_forward_masking_lse)
inactive_target_checked = mutant("inactive_target_checked", check=_check_every_target)
check_after_collective = mutant(
    "check_after_collective", check=_mask_only, forward=_forward_checking_late
)
