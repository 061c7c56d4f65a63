"""``triton_exact_sum``: bitwise equal results for every TP degree and shard layout.

The row maxima are all-gathered first, so every rank knows the global ``M``
(max is exact and order-free). Each rank then sums ``exp(x - M)``, each in
``[0, 1]`` and computed elementwise, as int64 fixed point with ``K`` fractional
bits (floored), ``K = 62 - ceil(log2(padded_vocab_size))`` (so
``padded * 2^K <= 2^62``): integer sums are exact and associative, so the
all-gathered total is the same integer however the vocabulary is split, and it
is converted to floating point once. Quantization error: below
``padded * 2^-K`` against ``S >= 1`` (``2^-26`` relative for a 152064-column
vocabulary), under fp32's own rounding of ``exp``. Special values are resolved
from the gathered maxima (NaN anywhere live, ``+inf``, all ``-inf``) exactly as
in ``triton_online``.

Temperature divides each logit (``z = x / T``, IEEE ``div_rn``, each row by its own ``T``)
in both passes;
entropy adds a second fixed-point sum, of ``exp(z - M) (z - M)`` (each in
``[-1/e, 0]``), in the same second pass, so it is bitwise layout independent too.

Cost over ``triton_online``: an extra all-gather (the row maxima, before the
sums) and two passes over the local logits instead of one, so about twice the
bytes read. Bytes per row (``w`` live columns, ``b`` the item size, ``R`` the TP
degree): read ``2 w b + b`` + ``8 R`` (maxima and targets) + ``8 R`` (sums; ``16 R``
with entropy) + 9; written 8 (stage) + 8 (sums; 16 with entropy) + the outputs.

A processed op (``docs/semantics.md``, "Processed logprobs"): the support comes first
(``support_inputs``: the shared threshold, whose decisions are exact integer masses, so
``tau`` and ``|S|`` are the same bits for every layout; or a replayed mask's packed
bits), then both passes treat columns outside ``S`` as padding: the stage is
``S``'s ``(m, t)``, followed by the full vocabulary's ``m`` when ``lse`` is exported,
and the sums ``S``'s (and its entropy moment's), then the full vocabulary's. Every
output, the support's included, stays ``cross_tp_bitwise``, and ``lse`` is the raw
op's bits (the same integers). Extra bytes per row: 4 (threshold) or
``4 ceil(w / 32)`` (packed mask) per pass, 4 + 8 written and ``12 R`` gathered for the
full vocabulary's fields. One ``exp`` per column where ``S``'s maximum is the row's
(every recomputed support), two where a replayed ``S`` misses it.
"""

from __future__ import annotations

from typing import Any

import torch
import triton

from tp_logprob.comm import GroupHandle
from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.fixed_point import fraction_bits
from tp_logprob.kernels.heterogeneous import by_rule_groups
from tp_logprob.kernels.triton.autograd import run_op
from tp_logprob.kernels.triton.exact_sum_kernels import (
    FULL_STAGE_FIELDS,
    STAGE_FIELDS,
    exact_max_kernel,
    exact_merge_kernel,
    exact_sum_kernel,
)
from tp_logprob.kernels.triton.inputs import (
    Outputs,
    RankInputs,
    all_gather,
    allocate_outputs,
    finish_outputs,
)
from tp_logprob.kernels.triton.launch import KernelKind, launch, launch_config, platform_of
from tp_logprob.kernels.triton.support_inputs import (
    KernelSupport,
    SupportPlan,
    full_support,
    logits_threshold,
    plan_support,
)
from tp_logprob.result import LogprobResult

__all__ = [
    "exact_merge",
    "exact_sum_forward",
    "fraction_bits",
    "stage_width",
    "sum_width",
    "triton_exact_sum_logprob",
]


@by_rule_groups
def triton_exact_sum_logprob(
    local_logits: Any, targets: Any, contract: Any, group: GroupHandle | None = None
) -> LogprobResult:
    """One rank's ``(selected_logp, lse)``, bitwise identical for every shard layout.

    >>> # result = triton_exact_sum_logprob(local_logits, targets, contract, group=handle)
    """
    return run_op(exact_sum_forward, local_logits, targets, contract, group)


def exact_sum_forward(
    inputs: RankInputs,
    contract: LogprobContract,
    group: GroupHandle | None,
    *,
    portable: bool = False,
) -> Outputs:
    """The support (a contract with one), maxima, all-gather, fixed-point sums, all-gather,
    merge. ``portable``: ``triton_portable``'s kernels (``portable_exp`` and
    ``portable_log``, launched with ``enable_fp_fusion=False``)."""
    logits, rows = inputs.logits, inputs.num_rows
    plan = plan_support(contract, logits.device, lambda: logits_threshold(logits, contract, group))
    support = full_support(logits.device) if plan is None else plan.kernel
    platform = platform_of(logits)
    row_config = launch_config(platform, KernelKind.ROW, logits.dtype, fp_fusion=not portable)
    stage_fields = stage_width(support)
    stage = torch.empty((rows, stage_fields), dtype=torch.float32, device=logits.device)
    support_args = support.args()
    launch(
        exact_max_kernel,
        (rows,),
        row_config,
        logits,
        logits,
        logits.stride(0),
        inputs.width,
        inputs.live_width,
        inputs.col_start,
        inputs.targets,
        inputs.active,
        stage,
        inputs.temperature,
        *support_args,
        SCALE=inputs.scale,
        SUPPORT=support.kind,
        SEPARATE=support.separate,
        STAGE=stage_fields,
    )
    gathered_stage = all_gather(stage, group)
    num_ranks = gathered_stage.shape[0]
    bits = fraction_bits(contract.sharding.padded_vocab_size)
    sum_fields = sum_width(contract, support)
    sums = torch.empty((rows, sum_fields), dtype=torch.int64, device=logits.device)
    launch(
        exact_sum_kernel,
        (rows,),
        launch_config(platform, KernelKind.SUM, logits.dtype, fp_fusion=not portable),
        logits,
        logits,
        logits.stride(0),
        inputs.live_width,
        gathered_stage,
        num_ranks,
        rows,
        sums,
        float(2**bits),
        inputs.temperature,
        *support_args,
        SCALE=inputs.scale,
        ENTROPY=contract.export_entropy,
        SUM_FIELDS=sum_fields,
        SUPPORT=support.kind,
        SEPARATE=support.separate,
        STAGE=stage_fields,
        PORTABLE=portable,
    )
    gathered_sums = all_gather(sums, group)
    return exact_merge(
        gathered_stage, gathered_sums, inputs, contract, bits, plan, portable=portable
    )


def stage_width(support: KernelSupport) -> int:
    """Fields of a rank's stage: ``(m_r, t_r)`` (over ``S`` with a support), then the full
    vocabulary's ``m_r`` when the support's partial carries the full one (``separate``)."""
    return int(FULL_STAGE_FIELDS.value if support.separate else STAGE_FIELDS.value)


def sum_width(contract: LogprobContract, support: KernelSupport) -> int:
    """Fields of a rank's int64 sums: ``S``'s, its entropy moment's, the full vocabulary's."""
    return 1 + int(contract.export_entropy) + int(support.separate)


def exact_merge(
    gathered_stage: torch.Tensor,
    gathered_sums: torch.Tensor,
    inputs: RankInputs,
    contract: LogprobContract,
    bits: int,
    support: SupportPlan | None = None,
    *,
    portable: bool = False,
) -> Outputs:
    """``exact_merge_kernel`` over every rank's gathered stage ``(m_r, t_r[, full m_r])`` and
    int64 sums (``bits`` fraction bits): the outputs, the same on every rank."""
    rows = inputs.num_rows
    outputs = allocate_outputs(contract, rows, gathered_stage.device, support)
    merge_config = launch_config(
        platform_of(gathered_stage),
        KernelKind.MERGE,
        inputs.logits.dtype,
        fp_fusion=not portable,
    )
    lse = outputs.lse_target()
    entropy, entropy32 = outputs.entropy_targets()
    launch(
        exact_merge_kernel,
        (triton.cdiv(rows, merge_config.block),),
        merge_config,
        gathered_stage,
        gathered_stage,
        gathered_sums,
        inputs.boundaries,
        gathered_stage.shape[0],
        rows,
        inputs.targets,
        inputs.active,
        outputs.selected,
        lse,
        outputs.lse32,
        entropy,
        entropy32,
        float(2.0**-bits),
        outputs.full_lse_target(),
        STORE_LSE=lse is not outputs.lse32,
        ENTROPY=contract.export_entropy,
        STORE_ENTROPY=entropy is not entropy32,
        SUM_FIELDS=gathered_sums.shape[2],
        SEPARATE=support is not None and support.kernel.separate,
        STAGE=gathered_stage.shape[2],
        PORTABLE=portable,
    )
    return finish_outputs(outputs)
