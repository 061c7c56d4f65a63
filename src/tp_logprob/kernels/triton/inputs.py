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

from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.dtypes import TORCH_DTYPES

__all__ = ["Outputs", "RankInputs", "all_gather", "allocate_outputs", "prepare"]


@dataclass(frozen=True)
class RankInputs:
    """One rank's kernel-ready inputs (see the module docstring)."""

    logits: torch.Tensor
    targets: torch.Tensor
    active: torch.Tensor
    col_start: int
    live_width: int
    boundaries: torch.Tensor
    temperature: float = 1.0

    @property
    def scale(self) -> bool:
        """Whether kernels divide by the temperature (``T != 1``; ``x / 1`` is exact anyway)."""
        return self.temperature != 1.0

    @property
    def num_rows(self) -> int:
        return int(self.logits.shape[0])

    @property
    def width(self) -> int:
        return int(self.logits.shape[1])


class Outputs(NamedTuple):
    """A forward's results: ``selected``, ``lse`` and ``entropy`` in the output dtype, and
    the fp32 ``lse32`` and ``entropy32`` the backward reads.

    ``lse`` is None when the contract does not export it, ``entropy`` (and
    ``entropy32``) when it does not export entropy; for fp32 outputs ``lse`` is
    ``lse32`` and ``entropy`` is ``entropy32``.
    """

    selected: torch.Tensor
    lse: torch.Tensor | None
    lse32: torch.Tensor
    entropy: torch.Tensor | None = None
    entropy32: torch.Tensor | None = None

    def lse_target(self) -> torch.Tensor:
        """Where a merge kernel writes the LSE in the output dtype (``lse32`` when not exported)."""
        return self.lse32 if self.lse is None else self.lse

    def entropy_targets(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(entropy, entropy32)`` for a merge kernel; ``lse32`` stands in (unwritten) when the
        contract has no entropy, since a kernel argument must be a tensor."""
        if self.entropy is None or self.entropy32 is None:
            return self.lse32, self.lse32
        return self.entropy, self.entropy32

    def for_autograd(
        self,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        """``(selected, lse, entropy, entropy32, frozen)`` for an autograd Function's forward:
        ``lse`` in the output dtype, an empty entropy placeholder (and ``entropy32``) when the
        contract has no entropy, and the outputs to mark non-differentiable."""
        lse = self.lse_target()
        if self.entropy is None or self.entropy32 is None:
            entropy = entropy32 = self.selected.new_empty(0)
            return self.selected, lse, entropy, entropy32, (lse, entropy)
        return self.selected, lse, self.entropy, self.entropy32, (lse,)


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
        temperature=contract.temperature_fp32,
    )


@functools.lru_cache(maxsize=64)
def _boundaries(bounds: tuple[tuple[int, int], ...], device: torch.device) -> torch.Tensor:
    """``[start_0, start_1, ..., end_last]`` as int64 on ``device`` (cached: no copy per call)."""
    edges = [start for start, _ in bounds] + [bounds[-1][1]]
    return torch.tensor(edges, dtype=torch.int64, device=device)


def allocate_outputs(contract: LogprobContract, num_rows: int, device: torch.device) -> Outputs:
    """Empty outputs for a merge kernel to write."""
    dtype = TORCH_DTYPES[contract.output.dtype]
    lse32 = torch.empty(num_rows, dtype=torch.float32, device=device)
    selected = torch.empty(num_rows, dtype=dtype, device=device)
    lse = _exported(contract.export_lse, lse32, dtype)
    entropy32 = torch.empty(num_rows, dtype=torch.float32, device=device)
    entropy = _exported(contract.export_entropy, entropy32, dtype)
    if entropy is None:
        return Outputs(selected, lse, lse32)
    return Outputs(selected, lse, lse32, entropy, entropy32)


def _exported(wanted: bool, fp32: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """The output-dtype twin of an fp32 output: None, ``fp32`` itself, or a new tensor."""
    if not wanted:
        return None
    if dtype == torch.float32:
        return fp32
    return torch.empty(fp32.shape, dtype=dtype, device=fp32.device)


def all_gather(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """Every rank's ``tensor`` stacked in rank order on a new leading dim (``group=None``: TP=1)."""
    if group is None:
        return tensor.unsqueeze(0)
    parts: list[torch.Tensor] = group.all_gather(tensor)
    if len(parts) == 1:
        return parts[0].unsqueeze(0)
    return torch.stack(parts, dim=0)
