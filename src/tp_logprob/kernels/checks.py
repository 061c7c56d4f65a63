"""Input checking at every backend op's boundary, shared by all backends.

Each check runs before any kernel and raises :class:`LogprobContractError` naming
the problem and the values. Inactive tokens' targets are never checked or read
for a value.
"""

from __future__ import annotations

from typing import Any

import torch

from tp_logprob.contract import LogprobContract
from tp_logprob.errors import LogprobContractError
from tp_logprob.kernels.dtypes import TORCH_DTYPES

__all__ = ["TORCH_DTYPES", "active_mask_tensor", "check_op_inputs", "owner_ranks"]


def check_op_inputs(
    local_logits: Any, targets: Any, contract: Any, group: Any = None
) -> torch.Tensor:
    """Validate one rank's op inputs against its contract; return the active mask on device."""
    if not isinstance(contract, LogprobContract):
        raise LogprobContractError(
            f"contract={contract!r}: expected a LogprobContract, got {type(contract).__name__}"
        )
    sharding = contract.sharding
    _check_group(group, contract)
    if not isinstance(local_logits, torch.Tensor):
        raise LogprobContractError(
            f"local_logits: expected a torch.Tensor, got {type(local_logits).__name__}"
        )
    if local_logits.dim() != 2:
        raise LogprobContractError(
            f"local_logits: expected 2 dims [num_tokens, local_vocab_size], got shape "
            f"{tuple(local_logits.shape)}"
        )
    rows, width = local_logits.shape
    start, end = sharding.local_bounds
    if width != end - start:
        raise LogprobContractError(
            f"local_logits: width {width} != rank {sharding.tp_rank}'s shard width "
            f"{end - start} (vocab_shard_bounds[{sharding.tp_rank}]={(start, end)})"
        )
    if rows != contract.num_tokens:
        raise LogprobContractError(
            f"local_logits: {rows} rows != mask.num_tokens={contract.num_tokens}"
        )
    expected_dtype = TORCH_DTYPES[contract.dtype]
    if local_logits.dtype != expected_dtype:
        raise LogprobContractError(
            f"local_logits.dtype={local_logits.dtype}: contract dtype is "
            f"{contract.dtype.value!r} ({expected_dtype})"
        )
    if not isinstance(targets, torch.Tensor):
        raise LogprobContractError(
            f"targets: expected a torch.Tensor, got {type(targets).__name__}"
        )
    if tuple(targets.shape) != (contract.num_tokens,):
        raise LogprobContractError(
            f"targets: shape {tuple(targets.shape)} != [num_tokens] = ({contract.num_tokens},)"
        )
    if targets.dtype not in (torch.int32, torch.int64):
        raise LogprobContractError(f"targets.dtype={targets.dtype}: expected torch.int64 or int32")
    if targets.device != local_logits.device:
        raise LogprobContractError(
            f"targets.device={targets.device} != local_logits.device={local_logits.device}"
        )
    active = active_mask_tensor(contract, local_logits.device)
    real = sharding.real_vocab_size
    bad = active & ((targets < 0) | (targets >= real))
    if bool(bad.any()):
        index = int(torch.nonzero(bad)[0, 0])
        raise LogprobContractError(
            f"targets[{index}]={int(targets[index])}: active target outside "
            f"[0, real_vocab_size={real}) ({int(bad.sum())} such active tokens)"
        )
    return active


def _check_group(group: Any, contract: LogprobContract) -> None:
    sharding = contract.sharding
    if group is None:
        if sharding.tp_world_size != 1:
            raise LogprobContractError(
                f"group=None: means TP=1, but the contract has "
                f"tp_world_size={sharding.tp_world_size}"
            )
        return
    world, rank = getattr(group, "world_size", None), getattr(group, "rank", None)
    if world != sharding.tp_world_size or rank != sharding.tp_rank:
        raise LogprobContractError(
            f"group (rank={rank!r}, world_size={world!r}) disagrees with the contract "
            f"(tp_rank={sharding.tp_rank}, tp_world_size={sharding.tp_world_size})"
        )


def active_mask_tensor(contract: LogprobContract, device: torch.device) -> torch.Tensor:
    """The contract's active mask as a bool tensor on ``device`` (all True when none)."""
    mask = contract.mask.active_mask
    if mask is None:
        return torch.ones(contract.num_tokens, dtype=torch.bool, device=device)
    return torch.tensor(mask, dtype=torch.bool, device=device)


def owner_ranks(targets: torch.Tensor, contract: LogprobContract) -> torch.Tensor:
    """For each token, the rank owning its target column (garbage for out-of-range targets).

    Callers must only use it where the token is active (targets checked in range).
    """
    ends = torch.tensor(
        [end for _, end in contract.sharding.vocab_shard_bounds],
        dtype=targets.dtype,
        device=targets.device,
    )
    owners = torch.bucketize(targets.contiguous(), ends, right=True)  # strided input warns
    return owners.clamp_(0, contract.sharding.tp_world_size - 1)
