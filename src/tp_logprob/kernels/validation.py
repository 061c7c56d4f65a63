"""Input validation at every backend op's boundary, shared by all backends and peers.

Each check runs before any kernel and any collective and raises
:class:`LogprobContractError` naming the problem and the values. Inactive tokens'
targets are never checked or read for a value. :func:`check_op_inputs` validates a
logits op's inputs, :func:`check_fused_inputs` a hidden-input (fused LM head) op's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tp_logprob.comm import GroupHandle
from tp_logprob.contract import LogprobContract, LogprobInputKind
from tp_logprob.errors import LogprobContractError
from tp_logprob.kernels.dtypes import TORCH_DTYPES
from tp_logprob.support import SupportMode

__all__ = [
    "active_mask_tensor",
    "check_contract",
    "check_fused_inputs",
    "check_hidden_op_targets",
    "check_op_inputs",
]


def check_op_inputs(
    local_logits: Any, targets: Any, contract: Any, group: GroupHandle | None = None
) -> torch.Tensor:
    """Validate one rank's op inputs against its contract; return the active mask on device."""
    contract = check_contract(contract)
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
    _check_replayed_targets(targets, active, contract)
    return active


def _check_replayed_targets(
    targets: torch.Tensor, active: torch.Tensor, contract: LogprobContract
) -> None:
    """Every active target of a replayed support is one of its row's kept ids.

    ``row * real_vocab_size + id`` names a (row, id) pair uniquely, so one vectorised
    membership test covers every active token.
    """
    support = contract.support
    if support is None or support.mode is not SupportMode.REPLAYED_MASK:
        return
    real = contract.sharding.real_vocab_size
    rows = np.flatnonzero(active.cpu().numpy())
    wanted = targets.cpu().numpy().astype(np.int64)[rows]
    counts = support.kept_counts()
    kept = np.repeat(np.arange(counts.size, dtype=np.int64), counts) * real + support.kept_ids
    queries = rows * real + wanted
    hit = np.isin(queries, kept, assume_unique=True)
    if not hit.all():
        missing = np.flatnonzero(~hit)
        row = int(rows[missing[0]])
        ids = support.kept_row(row).tolist()
        shown = repr(ids) if len(ids) <= 8 else repr(ids[:8])[:-1] + ", ...]"
        raise LogprobContractError(
            f"targets[{row}]={int(wanted[missing[0]])}: active target outside row {row}'s "
            f"replayed support (support.kept_ids[row {row}]={shown}; {missing.size} such "
            "active tokens); an engine never samples outside its own mask"
        )


def check_contract(contract: Any) -> LogprobContract:
    """``contract`` itself when it is a :class:`LogprobContract`; else the error every op raises."""
    if not isinstance(contract, LogprobContract):
        raise LogprobContractError(
            f"contract={contract!r}: expected a LogprobContract, got {type(contract).__name__}"
        )
    return contract


def _check_group(group: object, contract: LogprobContract) -> None:
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


def check_fused_inputs(
    hidden: Any,
    targets: Any,
    contract: Any,
    group: GroupHandle | None,
    weight: Any,
    bias: Any,
) -> torch.Tensor:
    """Validate a fused LM-head op's inputs (torch_native_fused's and triton_fused's
    signature); return the active mask on the inputs' device."""
    contract = check_contract(contract)
    if contract.input_kind is not LogprobInputKind.HIDDEN:
        raise LogprobContractError(
            f"input_kind={contract.input_kind.value!r}: torch_native_fused takes hidden states "
            "(input_kind='hidden'); use torch_native for logits"
        )
    if contract.allow_tf32:
        raise LogprobContractError(
            "allow_tf32=True: torch_native_fused computes fp32 dot products in full fp32 only"
        )
    size, local = contract.hidden_size, contract.sharding.local_vocab_size
    dtype = TORCH_DTYPES[contract.dtype]
    _check_tensor("hidden", hidden, (contract.num_tokens, size), dtype, None)
    _check_tensor("weight", weight, (local, size), dtype, hidden.device)
    if contract.has_bias:
        if bias is None:
            raise LogprobContractError("bias=None: the contract has has_bias=True")
        _check_tensor("bias", bias, (local,), dtype, hidden.device)
    elif bias is not None:
        raise LogprobContractError(
            "bias: given, but the contract has has_bias=False (set has_bias=True to add it)"
        )
    return check_hidden_op_targets(targets, contract, group, hidden.device)


def check_hidden_op_targets(
    targets: Any, contract: LogprobContract, group: GroupHandle | None, device: torch.device
) -> torch.Tensor:
    """:func:`check_op_inputs`' checks (group, targets, active target range) for an op that
    takes hidden states; return the active mask on ``device``.

    They run on a zero-stride stand-in of the logits shape: it has the right shape,
    dtype and device and no storage.
    """
    dtype, local = TORCH_DTYPES[contract.dtype], contract.sharding.local_vocab_size
    stand_in = torch.zeros((), dtype=dtype, device=device).expand(contract.num_tokens, local)
    return check_op_inputs(stand_in, targets, contract, group)


def _check_tensor(
    name: str,
    value: Any,
    shape: tuple[Any, ...],
    dtype: torch.dtype,
    device: torch.device | None,
) -> None:
    if not isinstance(value, torch.Tensor):
        raise LogprobContractError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    if tuple(value.shape) != shape:
        raise LogprobContractError(
            f"{name}.shape={tuple(value.shape)}: expected {shape} from the contract "
            "(num_tokens, local_vocab_size, hidden_size)"
        )
    if value.dtype != dtype:
        raise LogprobContractError(f"{name}.dtype={value.dtype}: contract dtype is {dtype}")
    if device is not None and value.device != device:
        raise LogprobContractError(f"{name}.device={value.device} != hidden.device={device}")
