"""Backends for tests/test_real_groups.py: torch_native with a bug only a real group shows,
one that raises on one rank, and one that talks to the default process group itself.

Named on the command line as ``tests/helpers/real_group_backends.py:ATTR`` (a file path,
so the torchrun processes need not import ``tests``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from tp_logprob.comm import TorchGroup
from tp_logprob.kernels.builtin import TORCH_NATIVE
from tp_logprob.kernels.native import torch_native_logprob


def _is_last_rank(group: Any) -> bool:
    return group is not None and group.rank == group.world_size - 1


def _writes_on_last_rank(local: Any, targets: Any, contract: Any, group: Any = None) -> Any:
    """Correct outputs, but the last rank then adds 1 to its first logit when the batch
    has two rows or more: a bug only that rank's inputs show."""
    result = torch_native_logprob(local, targets, contract, group)
    if _is_last_rank(group) and local.shape[0] >= 2 and local.shape[1] >= 1:
        local.data[0, 0] += 1.0  # behind autograd's back: no version bump either
    return result


def _bits_on_last_rank(local: Any, targets: Any, contract: Any, group: Any = None) -> Any:
    """The last rank returns the next float after its first selected_logp (two rows or more)."""
    result = torch_native_logprob(local, targets, contract, group)
    if not (_is_last_rank(group) and result.selected_logp.shape[0] >= 2):
        return result
    selected = result.selected_logp
    bumped = torch.nextafter(selected.detach(), torch.tensor(float("inf")))
    first = torch.arange(selected.shape[0], device=selected.device) == 0
    # Out of place, so that autograd still runs (row 0's gradient is then 0 on this rank).
    return type(result)(torch.where(first, bumped, selected), result.lse, result.entropy)


def _raises_on_rank_one(local: Any, targets: Any, contract: Any, group: Any = None) -> Any:
    """Rank 1 raises before reaching any collective; its peers wait in theirs."""
    if group is not None and group.rank == 1:
        raise RuntimeError("planted failure on rank 1, before any collective")
    return torch_native_logprob(local, targets, contract, group)


def _on_the_default_group(local: Any, targets: Any, contract: Any, group: Any = None) -> Any:
    """torch_native, communicating on torch.distributed's default group, not on ``group``."""
    return torch_native_logprob(local, targets, contract, TorchGroup())


def _variant(backend_id: str, **claims: Any) -> Any:
    return dataclasses.replace(TORCH_NATIVE, backend_id=backend_id, **claims)


writes_on_last_rank = (_writes_on_last_rank, _variant("writes_on_last_rank"))
bits_on_last_rank = (_bits_on_last_rank, _variant("bits_on_last_rank"))
raises_on_rank_one = (_raises_on_rank_one, _variant("raises_on_rank_one"))
default_group = (_on_the_default_group, _variant("default_group", real_group_only=True))
