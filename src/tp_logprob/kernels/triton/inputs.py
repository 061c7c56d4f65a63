"""What every Triton launcher needs from one rank's inputs, prepared once per call.

The kernels take raw pointers, so everything they index is made explicit here:
logits with unit column stride (any row stride), active flags as int8, this
rank's first global column, how many of its columns are live (real vocabulary),
the shard boundaries used to find each target's owner during the merge, and each
row's temperature: an engine batch may bring one per row (``docs/semantics.md``,
"Heterogeneous batches"), so the kernels read a row's divisor from a tensor.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch

from tp_logprob.comm import GroupHandle
from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.dtypes import TORCH_DTYPES
from tp_logprob.kernels.triton.support_inputs import KernelSupport, SupportPlan
from tp_logprob.result import LogprobResult

__all__ = [
    "Outputs",
    "RankInputs",
    "all_gather",
    "allocate_outputs",
    "finish_outputs",
    "prepare",
]


@dataclass(frozen=True)
class RankInputs:
    """One rank's kernel-ready inputs (see the module docstring)."""

    logits: torch.Tensor
    targets: torch.Tensor
    active: torch.Tensor
    col_start: int
    live_width: int
    boundaries: torch.Tensor
    temperature: torch.Tensor
    """fp32 ``[N]``: each row's divisor ``fp32(T)`` (1 for a greedy row)."""
    scale: bool
    """Whether kernels divide by the temperatures (some ``T != 1``; ``x / 1`` is exact, so
    a row at ``T = 1`` has the same bits either way)."""

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
    ``entropy32``) when it does not export entropy; for fp32 outputs without a support
    ``lse`` is ``lse32`` and ``entropy`` is ``entropy32``.

    With a support (``support`` set), ``selected``, ``entropy`` and ``lse32`` are over
    ``S`` (``lse32`` is ``LSE_S``, the gradient's), ``support_lse`` is ``LSE_S`` in the
    output dtype, and ``lse`` stays the full vocabulary's.
    """

    selected: torch.Tensor
    lse: torch.Tensor | None
    lse32: torch.Tensor
    entropy: torch.Tensor | None = None
    entropy32: torch.Tensor | None = None
    support: SupportPlan | None = None
    support_lse: torch.Tensor | None = None

    def lse_target(self) -> torch.Tensor:
        """Where a merge kernel writes the LSE it forms in the output dtype: ``support_lse``
        with a support, else ``lse`` (``lse32`` when not exported)."""
        if self.support_lse is not None:
            return self.support_lse
        return self.lse32 if self.lse is None else self.lse

    def full_lse_target(self) -> torch.Tensor:
        """Where a merge kernel writes the full vocabulary's LSE from the second partial
        (``SEPARATE``); ``lse32`` stands in, unwritten, otherwise."""
        if self.support is not None and self.support.kernel.separate and self.lse is not None:
            return self.lse
        return self.lse32

    def entropy_targets(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(entropy, entropy32)`` for a merge kernel; ``lse32`` stands in (unwritten) when the
        contract has no entropy, since a kernel argument must be a tensor."""
        if self.entropy is None or self.entropy32 is None:
            return self.lse32, self.lse32
        return self.entropy, self.entropy32

    def kernel_support(self) -> KernelSupport | None:
        """The support as the backward kernels take it (None: every live column)."""
        return None if self.support is None else self.support.kernel

    def result(self) -> LogprobResult:
        """The op's result (outside autograd)."""
        if self.support is None or self.support_lse is None:
            return LogprobResult(self.selected, self.lse, self.entropy)
        return LogprobResult(
            self.selected,
            self.lse,
            self.entropy,
            support_lse=self.support_lse,
            support_size=self.support.size,
            support_threshold=self.support.threshold,
        )

    def for_autograd(
        self,
    ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, tuple[torch.Tensor, ...]]:
        """``(outputs, entropy32, frozen)`` for an autograd Function's forward.

        ``outputs`` is ``(selected, lse, entropy)`` (``lse`` in the output dtype, an empty
        entropy placeholder without entropy), followed with a support by
        ``(support_lse, support_size, support_threshold)`` (an empty placeholder for a
        replayed mask's threshold); ``frozen`` are the outputs to mark non-differentiable.
        """
        lse = self.lse_target() if self.support is None else self.lse
        if lse is None:  # a placeholder of the right length, dropped by exported_result
            lse = self.lse32
        entropy, entropy32 = self.entropy, self.entropy32
        frozen: list[torch.Tensor] = [lse]
        if entropy is None or entropy32 is None:
            entropy = entropy32 = self.selected.new_empty(0)
            frozen.append(entropy)
        outputs: tuple[torch.Tensor, ...] = (self.selected, lse, entropy)
        if self.support is not None and self.support_lse is not None:
            threshold = self.support.threshold
            if threshold is None:
                threshold = self.lse32.new_empty(0)
            support = (self.support_lse, self.support.size, threshold)
            outputs += support
            frozen += support
        return outputs, entropy32, tuple(frozen)


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
    divisors = contract.row_divisors()
    return RankInputs(
        logits=logits.detach(),
        targets=targets.contiguous(),
        active=active.to(torch.int8),
        col_start=start,
        live_width=live_end - start,
        boundaries=_boundaries(sharding.vocab_shard_bounds, logits.device),
        temperature=torch.from_numpy(divisors).to(logits.device),
        scale=bool((divisors != 1.0).any()),
    )


@functools.lru_cache(maxsize=64)
def _boundaries(bounds: tuple[tuple[int, int], ...], device: torch.device) -> torch.Tensor:
    """``[start_0, start_1, ..., end_last]`` as int64 on ``device`` (cached: no copy per call)."""
    edges = [start for start, _ in bounds] + [bounds[-1][1]]
    return torch.tensor(edges, dtype=torch.int64, device=device)


def allocate_outputs(
    contract: LogprobContract,
    num_rows: int,
    device: torch.device,
    support: SupportPlan | None = None,
) -> Outputs:
    """Empty outputs for a merge kernel to write (with a support: ``support_lse`` too)."""
    dtype = TORCH_DTYPES[contract.output.dtype]
    lse32 = torch.empty(num_rows, dtype=torch.float32, device=device)
    selected = torch.empty(num_rows, dtype=dtype, device=device)
    entropy32 = entropy = None
    if contract.export_entropy:
        entropy32 = torch.empty(num_rows, dtype=torch.float32, device=device)
        entropy = _exported(True, entropy32, dtype)
    if support is None:
        lse = _exported(contract.export_lse, lse32, dtype)
        return Outputs(selected, lse, lse32, entropy, entropy32)
    lse = torch.empty(num_rows, dtype=dtype, device=device) if contract.export_lse else None
    support_lse = torch.empty(num_rows, dtype=dtype, device=device)
    return Outputs(selected, lse, lse32, entropy, entropy32, support, support_lse)


def finish_outputs(outputs: Outputs) -> Outputs:
    """After the merge: ``lse`` of a support without a separate full partial is
    ``support_lse`` (every live column), and ``support_lse`` is NaN where a recomputed
    support is undefined (threshold NaN)."""
    support, support_lse = outputs.support, outputs.support_lse
    if support is None or support_lse is None:
        return outputs
    if outputs.lse is not None and not support.kernel.separate:
        outputs.lse.copy_(support_lse)
    if support.threshold is not None:
        support_lse.masked_fill_(torch.isnan(support.threshold), float("nan"))
    return outputs


def _exported(wanted: bool, fp32: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """The output-dtype twin of an fp32 output: None, ``fp32`` itself, or a new tensor."""
    if not wanted:
        return None
    if dtype == torch.float32:
        return fp32
    return torch.empty(fp32.shape, dtype=dtype, device=fp32.device)


def all_gather(tensor: torch.Tensor, group: GroupHandle | None) -> torch.Tensor:
    """Every rank's ``tensor`` stacked in rank order on a new leading dim (``group=None``: TP=1)."""
    if group is None:
        return tensor.unsqueeze(0)
    parts: list[torch.Tensor] = group.all_gather(tensor)
    if len(parts) == 1:
        return parts[0].unsqueeze(0)
    return torch.stack(parts, dim=0)
