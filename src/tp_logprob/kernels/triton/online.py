"""``triton_online``: the production one-pass backend (determinism scope ``fixed_topology``).

Each rank reads its logits once (``online_partial_kernel``), all-gathers one fp32
``[N, 3]`` partial per rank (``[N, 4]`` with entropy), and merges them in
shard-index order (``online_merge_kernel``). Temperature and entropy cost no
extra pass: ``z = x / T`` is formed in registers, each row by its own ``T`` (a per-row
tensor: an engine batch brings one per row), and entropy is one more fp32
accumulator per lane.

Bytes per row, with ``w`` the rank's live columns, ``b`` the logits' item size,
``R`` the TP degree and ``o`` the output item size: read ``w b + b`` (the owned
target) + ``12 R`` (``16 R`` with entropy) + 9 (target and active flag), + 4 (the row's
``T``) when some ``T != 1``;
written ``12`` (``16``) to the partial, ``4 + o`` for ``lse32`` and
``selected_logp``, ``o`` for an exported ``lse`` of 16 bits, and with entropy
``4`` (+ ``o`` for 16-bit outputs). Bitwise reproducible run to run and batch invariant
for a fixed TP degree and shard layout; not bitwise across layouts (use
``triton_exact_sum`` for that).

A processed op (a contract with a support, ``docs/semantics.md``, "Processed
logprobs"): ``support_inputs`` finds the support first (sampling parameters: the
shared threshold on an fp32 ``z`` formed in torch, an ``[N, w]`` temporary freed before
the kernels run; a replayed mask: its packed bits), then the same single pass keeps
``z >= tau`` or the mask's bits, treats every other column as padding, and writes
``S``'s ``(m, s, t[, q])`` followed, when ``lse`` is exported, by the full vocabulary's
``(m, s, t)`` (the raw kernel's steps: ``lse`` is the raw op's bits), so still one
all-gather, of ``[N, 6]`` (``[N, 7]``). The merge folds both. Extra bytes per row: 4
(the threshold) or ``4 ceil(w / 32)`` (the packed mask) read, ``12`` written and
``12 R`` gathered for the full partial. One ``exp`` per column while ``S`` holds the
rank's running maximum (always, for a threshold's upper set); a replayed ``S`` without
it costs a second one on those tiles. With every rule off the raw kernels run.
"""

from __future__ import annotations

from typing import Any

import torch
import triton

from tp_logprob.comm import GroupHandle
from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.heterogeneous import by_rule_groups
from tp_logprob.kernels.merge import PARTIAL_FIELDS
from tp_logprob.kernels.triton.autograd import run_op
from tp_logprob.kernels.triton.inputs import (
    Outputs,
    RankInputs,
    all_gather,
    allocate_outputs,
    finish_outputs,
)
from tp_logprob.kernels.triton.launch import KernelKind, launch, launch_config, platform_of
from tp_logprob.kernels.triton.online_kernels import (
    online_merge_kernel,
    online_partial_kernel,
)
from tp_logprob.kernels.triton.support_inputs import (
    SupportPlan,
    full_support,
    logits_threshold,
    plan_support,
)
from tp_logprob.result import LogprobResult

__all__ = ["online_forward", "online_merge", "triton_online_logprob"]


@by_rule_groups
def triton_online_logprob(
    local_logits: Any, targets: Any, contract: Any, group: GroupHandle | None = None
) -> LogprobResult:
    """One rank's ``(selected_logp, lse)`` by the one-pass online-softmax Triton kernel.

    >>> # result = triton_online_logprob(local_logits, targets, contract, group=handle)
    """
    return run_op(online_forward, local_logits, targets, contract, group)


def online_forward(
    inputs: RankInputs, contract: LogprobContract, group: GroupHandle | None
) -> Outputs:
    """The support (a contract with one), partials, one all-gather, ordered merge."""
    logits, rows = inputs.logits, inputs.num_rows
    plan = plan_support(contract, logits.device, lambda: logits_threshold(logits, contract, group))
    support = full_support(logits.device) if plan is None else plan.kernel
    fields = PARTIAL_FIELDS + int(contract.export_entropy) + PARTIAL_FIELDS * support.separate
    partial = torch.empty((rows, fields), dtype=torch.float32, device=logits.device)
    launch(
        online_partial_kernel,
        (rows,),
        launch_config(platform_of(logits), KernelKind.ROW, logits.dtype),
        logits,
        logits,
        logits.stride(0),
        inputs.width,
        inputs.live_width,
        inputs.col_start,
        inputs.targets,
        inputs.active,
        partial,
        inputs.temperature,
        *support.args(),
        SCALE=inputs.scale,
        ENTROPY=contract.export_entropy,
        FIELDS=fields,
        SUPPORT=support.kind,
        SEPARATE=support.separate,
    )
    return online_merge(all_gather(partial, group), inputs, contract, plan)


def online_merge(
    gathered: torch.Tensor,
    inputs: RankInputs,
    contract: LogprobContract,
    support: SupportPlan | None = None,
) -> Outputs:
    """Fold gathered ``[R, N, FIELDS]`` partials (``merge.pack_partial``'s layout) in rank
    order; with a support whose partials carry the full one too (``separate``), also the
    full ``lse`` from the fields that follow."""
    logits, rows = inputs.logits, inputs.num_rows
    outputs = allocate_outputs(contract, rows, logits.device, support)
    config = launch_config(platform_of(logits), KernelKind.MERGE, logits.dtype)
    lse = outputs.lse_target()
    entropy, entropy32 = outputs.entropy_targets()
    launch(
        online_merge_kernel,
        (triton.cdiv(rows, config.block),),
        config,
        logits,
        gathered.contiguous(),
        inputs.boundaries,
        gathered.shape[0],
        rows,
        inputs.targets,
        inputs.active,
        outputs.selected,
        lse,
        outputs.lse32,
        entropy,
        entropy32,
        outputs.full_lse_target(),
        STORE_LSE=lse is not outputs.lse32,
        ENTROPY=contract.export_entropy,
        STORE_ENTROPY=entropy is not entropy32,
        SEPARATE=support is not None and support.kernel.separate,
        FIELDS=gathered.shape[2],
    )
    return finish_outputs(outputs)
