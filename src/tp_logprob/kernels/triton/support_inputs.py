"""A processed op's support, prepared for the Triton kernels: a per-row threshold or a
bit-packed mask, with the support's outputs (``|S|``, the threshold).

``docs/semantics.md``, "Processed logprobs". The kernels take ``S`` through their
``SUPPORT`` constexpr and three arguments (``support_kernels``):

- **Sampling parameters**: the threshold ``tau`` of every row comes from the shared
  :func:`~tp_logprob.kernels.support_threshold.support_threshold` (its collectives are
  all-gathers of small per-row tensors; the decisions use exact integer masses, so
  ``tau`` and ``|S|`` are the same bits for every shard layout). It needs the rank's
  live tempered ``z``, which the logits backends form in torch
  (:func:`logits_threshold`): an fp32 ``[N, w]`` temporary (4 bytes per live column,
  twice bf16 logits), beside the threshold's own (a bool and an fp32 ``[N, w]``, int64
  masses only where a rank's survivors outnumber its candidates), all freed before
  the partial kernels read the logits again and keep ``z >= tau`` from the ``z`` they
  form themselves (the same bits: one IEEE division either way). That keeps one
  implementation of the threshold, whose radix passes and candidate merges are
  latency-bound collectives rather than bandwidth; its cost in traffic is about three
  reads of the logits (``benchmarks/bench_processed.py`` measures it). The fused
  backends form ``z`` chunk by chunk instead (``fused.py``). With every rule off the
  threshold is still found (one all-gather of the row extremes gives ``tau`` and
  ``|S|``) but the kernels run without a support: the raw op's bits.
- **Replayed mask**: ``ReplayedSupport.packed`` builds int32 ``[N, ceil(w / 32)]`` words
  on the device from the rank's kept ids (one bit per column, 1/32 of fp32 logits);
  no collective.

``separate`` says whether the partials carry the full vocabulary's partial too, for
``lse`` (``kernels.processed.separate_lse``, as torch_native decides it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tp_logprob.comm import GroupHandle
from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.partials import live_logits
from tp_logprob.kernels.processed import separate_lse
from tp_logprob.kernels.support_mask import ReplayedSupport
from tp_logprob.kernels.support_threshold import sampling_rules, support_threshold
from tp_logprob.kernels.triton.support_kernels import PACKED_MASK, THRESHOLD
from tp_logprob.support import SupportMode

__all__ = [
    "FULL",
    "KernelSupport",
    "SupportPlan",
    "full_support",
    "logits_threshold",
    "plan_support",
]

FULL = 0
"""``SUPPORT`` value of a kernel launched without a support (every live column)."""


@dataclass(frozen=True)
class KernelSupport:
    """``S`` as the kernels take it: ``kind`` is their ``SUPPORT`` constexpr, ``threshold``
    fp32 ``[N]`` (``THRESHOLD``), ``packed`` int32 ``[N, words]`` (``PACKED_MASK``); the
    unused one is a one-element stand-in (a kernel argument must be a tensor)."""

    kind: int
    threshold: torch.Tensor
    packed: torch.Tensor
    separate: bool

    def args(
        self, begin: int = 0, end: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """``(threshold, packed mask, mask row stride)`` for rows ``begin:end``."""
        threshold, packed = self.threshold, self.packed
        if self.kind == THRESHOLD.value:
            threshold = threshold[begin:end]
        if self.kind == PACKED_MASK.value:
            packed = packed[begin:end]
        return threshold, packed, packed.stride(0)


@dataclass(frozen=True)
class SupportPlan:
    """A processed op's support: the kernels' arguments, ``|S|`` (int64 ``[N]``) and the
    result's ``support_threshold`` (fp32 ``[N]``; None for a replayed mask)."""

    kernel: KernelSupport
    size: torch.Tensor
    threshold: torch.Tensor | None


def full_support(device: torch.device, *, separate: bool = False) -> KernelSupport:
    """The kernels' arguments without a support (``SUPPORT = 0``)."""
    threshold, packed = _stand_ins(device)
    return KernelSupport(FULL, threshold, packed, separate)


def _stand_ins(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.zeros(1, dtype=torch.float32, device=device),
        torch.zeros((1, 1), dtype=torch.int32, device=device),
    )


def logits_threshold(
    logits: torch.Tensor, contract: LogprobContract, group: GroupHandle | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tau, |S|)`` of every row from this rank's logits (``[N, width]``, padding included):
    ``z`` formed in torch, then the shared threshold (see the module docstring)."""
    return support_threshold(live_logits(logits, contract), contract, group)


def plan_support(
    contract: LogprobContract,
    device: torch.device,
    threshold: Callable[[], tuple[torch.Tensor, torch.Tensor]],
) -> SupportPlan | None:
    """The support of ``contract`` (None without one). ``threshold()`` gives ``(tau, |S|)``
    for sampling parameters (every rank calls it: it runs collectives); a replayed mask is
    packed from the contract's kept ids without a collective."""
    support = contract.support
    if support is None:
        return None
    separate = separate_lse(contract)
    stand_threshold, stand_packed = _stand_ins(device)
    if support.mode is SupportMode.REPLAYED_MASK:
        replayed = ReplayedSupport(contract, device)
        kernel = KernelSupport(PACKED_MASK.value, stand_threshold, replayed.packed(), separate)
        return SupportPlan(kernel, replayed.sizes, None)
    tau, size = threshold()
    kind = FULL if sampling_rules(contract).all_off else THRESHOLD.value
    tau = tau.contiguous()
    used = tau if kind == THRESHOLD.value else stand_threshold
    return SupportPlan(KernelSupport(kind, used, stand_packed, separate), size, tau)
