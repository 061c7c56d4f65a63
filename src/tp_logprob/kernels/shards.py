"""Where one rank's columns lie: its live width, the targets it owns, each target's owner.

The logits backends, the fused LM head and their mutants all slice a shard to its
live (real-vocabulary) columns and find the rank that owns each target; this is
that arithmetic, written once.
"""

from __future__ import annotations

import torch

from tp_logprob.contract import LogprobContract

__all__ = ["live_width", "owned_local_targets", "owner_ranks"]


def live_width(contract: LogprobContract) -> int:
    """How many of this rank's columns are real vocabulary (its leading columns; may be 0)."""
    live_start, live_end = contract.sharding.live_bounds()
    return live_end - live_start


def owned_local_targets(
    targets: torch.Tensor, contract: LogprobContract
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which rows' targets lie in this rank's live columns, and their clamped local index."""
    start, live_end = contract.sharding.live_bounds()
    owned = (targets >= start) & (targets < live_end)
    local = (targets.long() - start).clamp(0, max(live_end - start - 1, 0))
    return owned, local


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
