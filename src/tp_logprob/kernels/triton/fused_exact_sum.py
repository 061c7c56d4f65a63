"""``triton_fused_exact_sum``: the fused LM head, bitwise equal for every TP degree and layout.

Op signature (contracts with ``input_kind="hidden"``), as ``triton_fused``::

    triton_fused_exact_sum_logprob(hidden, targets, contract, group=None, *, weight, bias=None)

Forward: ``triton_exact_sum``'s construction on logits that are never stored
(``fused_exact_sum_kernels``): a first pass forms each ``[BLOCK_M, BLOCK]`` logits
tile with ``triton_fused``'s ``logits_tile`` and keeps the row maxima and owned
targets; one all-gather gives every rank the global max ``M``; a second pass forms
the same tiles again and sums ``exp(z - M)`` (and ``exp(z - M)(z - M)`` for
entropy) as int64 fixed point with ``K = exact_sum.fraction_bits(padded)``
fractional bits; a second all-gather and ``exact_merge_kernel`` finish. Same
outputs and semantics as ``triton_fused`` (temperature, entropy, padding rows of
``W`` never read, inactive rows exactly +0.0, special values), with
``triton_exact_sum``'s quantization error (below ``padded * 2^-K`` against
``S >= 1``). Cost over ``triton_fused``: the matmul runs twice and there is one
more all-gather. Memory: ``O(N)`` (stage, sums, outputs); no logits.

Determinism: ``cross_tp_bitwise`` for the outputs, ``selected_logp``, ``lse`` and
``entropy`` (the scopes are about the outputs: ``docs/semantics.md``, "Determinism
scopes"): each ``z[t, v]`` has the same bits whatever shard holds column ``v``, and
the fixed-point sums are exact
(``fused_exact_sum_kernels`` gives the argument). Also run to run and batch
invariant (a row's bits depend on its own hidden row and ``W`` only).

Role ``train``: ``triton_fused``'s chunked backward (``fused.fused_backward``) from
this forward's fp32 LSE (and entropy), which are layout independent, so
``G = d out / d x`` has the same bits for every layout (elementwise from ``x``,
``LSE`` and ``entropy``). The gradients themselves are not in the scope:

* ``d W`` row ``v`` and ``d bias[v]`` involve only column ``v`` of ``G``, but are
  summed over rows by ``torch.matmul`` and ``sum`` per chunk of ``chunk_rows``
  rows, and both the chunking (``chunk_rows`` shrinks below 128 rows for shards
  wider than 32768 live columns) and the library's reduction order (it picks
  its algorithm by the operand shapes, which include the shard width) may change
  with the layout;
* ``d hidden`` is this rank's partial over its own columns; the caller's
  all-reduce groups the columns by shard, so the summed gradient is only
  within tolerance across layouts.

Each gradient is still run to run and batch invariant, as ``triton_fused``'s is.

A processed op: ``triton_fused``'s support (``fused_support``: packed replayed bits, or
thresholds from chunks of logits), applied per tile in both passes as
``triton_exact_sum`` applies it; the threshold's decisions and the logits' bits do not
depend on the layout, so the support's outputs are ``cross_tp_bitwise`` too.
"""

from __future__ import annotations

import torch
import triton

from tp_logprob.comm import GroupHandle
from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.heterogeneous import fused_by_rule_groups
from tp_logprob.kernels.triton.exact_sum import exact_merge, fraction_bits, stage_width, sum_width
from tp_logprob.kernels.triton.fused import run_fused_op
from tp_logprob.kernels.triton.fused_exact_sum_kernels import (
    fused_exact_max_kernel,
    fused_exact_sum_kernel,
)
from tp_logprob.kernels.triton.fused_logits import fused_operands, ieee_products
from tp_logprob.kernels.triton.fused_support import fused_support
from tp_logprob.kernels.triton.inputs import Outputs, RankInputs, all_gather
from tp_logprob.kernels.triton.launch import (
    FUSED_DOT,
    FUSED_SUM_DEPTH,
    FUSED_TILES,
    KernelKind,
    launch,
    launch_config,
    platform_of,
)
from tp_logprob.kernels.triton.support_inputs import full_support
from tp_logprob.result import LogprobResult

__all__ = ["fused_exact_sum_forward", "triton_fused_exact_sum_logprob"]


@fused_by_rule_groups
def triton_fused_exact_sum_logprob(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: GroupHandle | None = None,
    *,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> LogprobResult:
    """One rank's selected logprob from hidden states and its LM-head weight rows, with the
    same bits for every TP degree and shard layout.

    Example, on rank r of a TP group (``hidden`` replicated, ``weight`` the rank's rows)::

        result = triton_fused_exact_sum_logprob(hidden, targets, contract, group, weight=w_r)
        (-(result.selected_logp * advantages).sum()).backward()
        torch.distributed.all_reduce(hidden.grad)  # d hidden is this rank's partial
    """
    return run_fused_op(fused_exact_sum_forward, hidden, targets, contract, group, weight, bias)


def fused_exact_sum_forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    inputs: RankInputs,
    contract: LogprobContract,
    group: GroupHandle | None,
) -> Outputs:
    """The support (a contract with one), maxima, all-gather, fixed-point sums, all-gather,
    ``exact_merge_kernel``."""
    rows, size = inputs.num_rows, hidden.shape[1]
    device = hidden.device
    plan = fused_support(hidden, weight, bias, inputs, contract, group)
    support = full_support(device) if plan is None else plan.kernel
    support_args = support.args()
    platform = platform_of(hidden)
    config = launch_config(platform, KernelKind.FUSED, hidden.dtype)
    block_m, block_k = FUSED_TILES[platform]
    grid = (triton.cdiv(rows, block_m),)
    operands = fused_operands(hidden, weight, bias)
    stage_fields = stage_width(support)
    tiles = {
        "HAS_BIAS": bias is not None,
        "SUPPORT": support.kind,
        "SEPARATE": support.separate,
        "STAGE": stage_fields,
        "BLOCK_M": block_m,
        "BLOCK_K": block_k,
        "DOT": FUSED_DOT[platform],
    }
    stage = torch.empty((rows, stage_fields), dtype=torch.float32, device=device)
    with ieee_products():
        launch(
            fused_exact_max_kernel,
            grid,
            config,
            hidden,
            *operands,
            rows,
            size,
            inputs.live_width,
            inputs.col_start,
            inputs.targets,
            inputs.active,
            stage,
            inputs.temperature,
            *support_args,
            SCALE=inputs.scale,
            **tiles,
        )
    gathered_stage = all_gather(stage, group)
    bits = fraction_bits(contract.sharding.padded_vocab_size)
    sum_fields = sum_width(contract, support)
    sums = torch.empty((rows, sum_fields), dtype=torch.int64, device=device)
    sum_config = launch_config(platform, KernelKind.FUSED_SUM, hidden.dtype)
    with ieee_products():
        launch(
            fused_exact_sum_kernel,
            grid,
            sum_config,
            hidden,
            *operands,
            rows,
            size,
            inputs.live_width,
            gathered_stage,
            gathered_stage.shape[0],
            sums,
            float(2**bits),
            inputs.temperature,
            *support_args,
            SCALE=inputs.scale,
            ENTROPY=contract.export_entropy,
            SUM_FIELDS=sum_fields,
            **{**tiles, "BLOCK_K": _sum_depth(platform, hidden.dtype)},
        )
    return exact_merge(gathered_stage, all_gather(sums, group), inputs, contract, bits, plan)


def _sum_depth(platform: str, dtype: torch.dtype) -> int:
    """The fixed-point pass's hidden-size chunk (``launch.FUSED_SUM_DEPTH``)."""
    sixteen_bit, fp32 = FUSED_SUM_DEPTH[platform]
    return fp32 if dtype == torch.float32 else sixteen_bit
