"""What every Triton launcher needs from one rank's inputs, prepared once per call.

The kernels take raw pointers, so everything they index is made explicit here:
logits with unit column stride (any row stride), active flags as int8, this
rank's first global column, how many of its columns are live (real vocabulary),
and the shard boundaries used to find each target's owner during the merge.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from tp_logprob.contract import LogprobContract, LogprobDType

__all__ = ["Outputs", "RankInputs", "all_gather", "allocate_outputs", "prepare"]

_OUTPUT_DTYPES = {
    LogprobDType.BF16: torch.bfloat16,
    LogprobDType.FP16: torch.float16,
    LogprobDType.FP32: torch.float32,
}


@dataclass(frozen=True)
class RankInputs:
    """One rank's kernel-ready inputs (see the module docstring)."""

    logits: torch.Tensor
    targets: torch.Tensor
    active: torch.Tensor
    col_start: int
    live_width: int
    boundaries: torch.Tensor

    @property
    def num_rows(self) -> int:
        return int(self.logits.shape[0])

    @property
    def width(self) -> int:
        return int(self.logits.shape[1])


class Outputs(NamedTuple):
    """A forward's results: ``selected`` and ``lse`` in the output dtype, ``lse32`` in fp32.

    ``lse`` is None when the contract does not export it; ``lse32`` is the merged
    LSE the backward reads (the same tensor as ``lse`` for fp32 outputs).
    """

    selected: torch.Tensor
    lse: torch.Tensor | None
    lse32: torch.Tensor


def prepare(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
) -> RankInputs:
    """Kernel-ready inputs; ``active`` is the mask returned by ``check_op_inputs``."""
    logits = local_logits if local_logits.stride(1) == 1 else local_logits.contiguous()
    sharding = contract.sharding
    start, live_end = sharding.live_bounds()
    return RankInputs(
        logits=logits.detach(),
        targets=targets.contiguous(),
        active=active.to(torch.int8),
        col_start=start,
        live_width=live_end - start,
        boundaries=_boundaries(sharding.vocab_shard_bounds, logits.device),
    )


@functools.lru_cache(maxsize=64)
def _boundaries(bounds: tuple[tuple[int, int], ...], device: torch.device) -> torch.Tensor:
    """``[start_0, start_1, ..., end_last]`` as int64 on ``device`` (cached: no copy per call)."""
    edges = [start for start, _ in bounds] + [bounds[-1][1]]
    return torch.tensor(edges, dtype=torch.int64, device=device)


def allocate_outputs(contract: LogprobContract, num_rows: int, device: torch.device) -> Outputs:
    """Empty outputs for a merge kernel to write."""
    dtype = _OUTPUT_DTYPES[contract.output.dtype]
    lse32 = torch.empty(num_rows, dtype=torch.float32, device=device)
    selected = torch.empty(num_rows, dtype=dtype, device=device)
    if not contract.export_lse:
        lse = None
    elif dtype == torch.float32:
        lse = lse32
    else:
        lse = torch.empty(num_rows, dtype=dtype, device=device)
    return Outputs(selected, lse, lse32)


def all_gather(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """Every rank's ``tensor`` stacked in rank order on a new leading dim (``group=None``: TP=1)."""
    if group is None:
        return tensor.unsqueeze(0)
    parts: list[torch.Tensor] = group.all_gather(tensor)
    if len(parts) == 1:
        return parts[0].unsqueeze(0)
    return torch.stack(parts, dim=0)
