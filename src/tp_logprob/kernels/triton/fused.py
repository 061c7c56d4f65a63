"""``triton_fused``: the fused LM head in Triton, hidden states in, logprobs out (fixed topology).

Op signature (contracts with ``input_kind="hidden"``), as ``torch_native_fused``::

    triton_fused_logprob(hidden, targets, contract, group=None, *, weight, bias=None)

Forward: ``fused_partial_kernel`` forms each ``[BLOCK_M, BLOCK]`` logits tile
``x = hidden @ W_live.T (+ bias)`` in registers (fp32 ``ieee`` ``tl.dot``, operands
widened exactly) and folds it into the online-softmax partial (temperature and
entropy in the same pass); one all-gather of the fp32 ``[N, 3 or 4]`` partials and
``triton_online``'s ordered merge finish it. Memory: the partial and the outputs,
``O(N)``; no logits. Bytes per row, with ``w`` the live columns, ``b`` the item
size, ``B`` the column tile and ``BLOCK_M`` the rows per program (``launch.py``):
read ``w H b / BLOCK_M`` (the live ``W`` rows, once per row block) + ``ceil(w / B) H b``
(the row's hidden, once per column tile; cache hits after the first) + 9 (target,
active flag); written 12 to the partial (16 with entropy); then the merge's.

Role ``train`` (``TritonFusedFunction``): the backward walks rows in chunks of
``fused_chunks.chunk_rows(contract)`` rows (it depends on the shard's live width,
never on N). Per chunk it materializes exactly one fp32 ``[chunk_rows, live]``
buffer: ``fused_logits_kernel`` writes the recomputed ``x`` (the forward's bits),
``logprob_grad_kernel`` (the logits backends' backward) overwrites it in place
with ``G = d out / d x``; ``d hidden = G @ W_live`` is one matrix-vector product
per row and one matrix product forms ``d W_live += G.T @ hidden``, both with exact
products and a float64 sum rounded once to fp32 (``kernels/rowwise.py``: no fp32
precision setting of the process reaches them); ``d bias += sum_t G``. Per call,
independent of N, there are also an fp32 copy of the live weight rows ``[live, H]``
(and a float64 one while a chunk's products run) and fp32 ``d W`` ``[local, H]``; per
chunk an fp32 copy of the chunk's hidden rows; and fp32
``d hidden`` ``[N, H]``. Never ``[N, local_vocab]`` in fp32 (for N > ``chunk_rows``).
A row's ``d hidden`` depends on its own row of ``G`` alone, never on N or on
its position in the chunk. ``d hidden`` is this rank's PARTIAL (the
caller all-reduces it); ``d W`` is zero on padding rows; inactive rows add exactly
0 to ``d W`` and ``d bias`` even when their hidden row holds NaN.

Determinism: ``fixed_topology`` (see ``fused_kernels``): run to run and batch
invariant for one TP degree and shard layout; ``run_to_run`` only on ROCm.

Not ``cross_tp_bitwise``: each fp32 ``x[t, v]`` has the same bits whatever the
shard layout (the K-loop order and chunk depth are fixed, and a ``tl.dot``
element depends only on its hidden row and weight row where ``fused_kernels``
says; ``test_triton_fused`` checks it under the interpreter, a GPU run has not
checked it), but the sums do
not: the per-lane sums and the merge group the columns by shard, as
``triton_online``'s do. ``triton_fused_exact_sum`` (``fused_exact_sum.py``) runs
``logits_tile`` under ``triton_exact_sum``'s fixed-point sums instead, and shares
this module's front (``run_fused_op``) and backward.

A processed op (``docs/semantics.md``, "Processed logprobs"; ``docs/fused-lm-head.md``,
"Sampling supports"): the support comes first (``fused_support``: a replayed mask's
packed bits, one int32 word per 32 columns and row; or each row's threshold, found on
chunks of ``fused_chunks.shared_chunk_rows`` rows of logits so that every rank's collectives
line up), and ``fused_partial_kernel`` keeps ``z >= tau`` or the mask's bits per logits
tile, writing ``S``'s partial and the full one for ``lse`` as ``triton_online`` does.
The backward applies the same support per chunk: ``G`` is 0 outside ``S``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton

from tp_logprob.comm import GroupHandle
from tp_logprob.contract import LogprobContract, LogprobRole
from tp_logprob.kernels.fused_chunks import chunk_rows, row_chunks
from tp_logprob.kernels.heterogeneous import fused_by_rule_groups
from tp_logprob.kernels.merge import PARTIAL_FIELDS
from tp_logprob.kernels.results import exported_result
from tp_logprob.kernels.rowwise import float64_matmul, rowwise_matmul
from tp_logprob.kernels.triton.autograd import launch_logprob_grad
from tp_logprob.kernels.triton.fused_kernels import fused_partial_kernel
from tp_logprob.kernels.triton.fused_logits import fused_logits, fused_operands, ieee_products
from tp_logprob.kernels.triton.fused_support import fused_support
from tp_logprob.kernels.triton.inputs import Outputs, RankInputs, all_gather, prepare
from tp_logprob.kernels.triton.launch import (
    FUSED_DOT,
    FUSED_TILES,
    KernelKind,
    launch,
    launch_config,
    platform_of,
)
from tp_logprob.kernels.triton.online import online_merge
from tp_logprob.kernels.triton.support_inputs import KernelSupport, full_support
from tp_logprob.kernels.validation import check_fused_inputs
from tp_logprob.result import LogprobResult

__all__ = [
    "FusedForwardFn",
    "TritonFusedFunction",
    "fused_backward",
    "fused_forward",
    "run_fused_op",
    "triton_fused_logprob",
]

FusedForwardFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor | None, RankInputs, LogprobContract, Any], Outputs
]
"""A fused forward: ``(hidden, weight, bias, inputs, contract, group) -> Outputs``."""


@fused_by_rule_groups
def triton_fused_logprob(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: GroupHandle | None = None,
    *,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> LogprobResult:
    """One rank's selected logprob from hidden states and its LM-head weight rows.

    Example, on rank r of a TP group (``hidden`` replicated, ``weight`` the rank's rows)::

        result = triton_fused_logprob(hidden, targets, contract, group, weight=w_r)
        (-(result.selected_logp * advantages).sum()).backward()
        torch.distributed.all_reduce(hidden.grad)  # d hidden is this rank's partial
    """
    return run_fused_op(fused_forward, hidden, targets, contract, group, weight, bias)


def run_fused_op(
    forward: FusedForwardFn,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: GroupHandle | None,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
) -> LogprobResult:
    """Check and prepare the inputs and run a fused ``forward``; for the ``train`` role
    through :class:`TritonFusedFunction` (the chunked backward)."""
    active = check_fused_inputs(hidden, targets, contract, group, weight, bias)
    inputs = _rank_inputs(hidden, targets, active, contract)
    if contract.role is LogprobRole.TRAIN:
        apply: Callable[..., tuple[torch.Tensor, ...]] = TritonFusedFunction.apply
        outputs = apply(hidden, weight, bias, inputs, contract, group, forward)
        return exported_result(contract, *outputs)
    with torch.no_grad():
        return forward(hidden, weight, bias, inputs, contract, group).result()


def _rank_inputs(
    hidden: torch.Tensor, targets: torch.Tensor, active: torch.Tensor, contract: LogprobContract
) -> RankInputs:
    """``prepare``'s inputs around a one-row stand-in for the logits the merge is sized by.

    The stand-in ``[N, local_vocab]`` view repeats one row (stride 0), so it costs
    ``local_vocab`` elements of the contract dtype and is never read.
    """
    local = contract.sharding.local_vocab_size
    stand_in = hidden.new_empty(local).expand(hidden.shape[0], local)
    return prepare(stand_in, targets, active, contract)


def fused_forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    inputs: RankInputs,
    contract: LogprobContract,
    group: GroupHandle | None,
) -> Outputs:
    """The support (a contract with one), fused partials, one all-gather,
    ``triton_online``'s ordered merge."""
    rows = inputs.num_rows
    plan = fused_support(hidden, weight, bias, inputs, contract, group)
    support = full_support(hidden.device) if plan is None else plan.kernel
    fields = PARTIAL_FIELDS + int(contract.export_entropy) + PARTIAL_FIELDS * support.separate
    partial = torch.empty((rows, fields), dtype=torch.float32, device=hidden.device)
    platform = platform_of(hidden)
    config = launch_config(platform, KernelKind.FUSED, hidden.dtype)
    block_m, block_k = FUSED_TILES[platform]
    with ieee_products():
        launch(
            fused_partial_kernel,
            (triton.cdiv(rows, block_m),),
            config,
            hidden,
            *fused_operands(hidden, weight, bias),
            rows,
            hidden.shape[1],
            inputs.live_width,
            inputs.col_start,
            inputs.targets,
            inputs.active,
            partial,
            inputs.temperature,
            *support.args(),
            SCALE=inputs.scale,
            ENTROPY=contract.export_entropy,
            HAS_BIAS=bias is not None,
            FIELDS=fields,
            SUPPORT=support.kind,
            SEPARATE=support.separate,
            BLOCK_M=block_m,
            BLOCK_K=block_k,
            DOT=FUSED_DOT[platform],
        )
    return online_merge(all_gather(partial, group), inputs, contract, plan)


class TritonFusedFunction(torch.autograd.Function):
    """Forward: a fused op's ``forward``. Backward: ``d hidden`` (this rank's partial),
    ``d W``, ``d bias``, from the forward's fp32 LSE (and entropy).

    Without ``export_entropy`` the entropy output is an empty, non-differentiable placeholder.
    With a support the outputs, LSE and entropy are over ``S``, the support's outputs
    follow (not differentiable), and ``G`` is 0 outside ``S``.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        inputs: RankInputs,
        contract: LogprobContract,
        group: GroupHandle | None,
        forward: FusedForwardFn,
    ) -> tuple[torch.Tensor, ...]:
        outputs = forward(hidden, weight, bias, inputs, contract, group)
        returned, entropy32, frozen = outputs.for_autograd()
        ctx.save_for_backward(hidden, weight, bias, outputs.lse32, entropy32)
        ctx.inputs, ctx.contract, ctx.support = inputs, contract, outputs.kernel_support()
        ctx.mark_non_differentiable(*frozen)  # one call: each call replaces the set
        return returned

    @staticmethod
    def backward(ctx: Any, grad_selected: torch.Tensor, *grads: Any) -> tuple[Any, ...]:
        hidden, weight, bias, lse32, entropy32 = ctx.saved_tensors
        contract: LogprobContract = ctx.contract
        entropy_grads = (entropy32, grads[1]) if contract.export_entropy else None  # after lse's
        d_hidden, d_weight, d_bias = fused_backward(
            hidden,
            weight,
            bias,
            ctx.inputs,
            contract,
            lse32,
            grad_selected,
            entropy_grads,
            ctx.support,
        )
        return d_hidden, d_weight, d_bias, None, None, None, None


def fused_backward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    inputs: RankInputs,
    contract: LogprobContract,
    lse32: torch.Tensor,
    grad_selected: torch.Tensor,
    entropy_grads: tuple[torch.Tensor, torch.Tensor | None] | None,
    support: KernelSupport | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(d hidden, d W, d bias)`` chunk by chunk (see the module docstring), in the inputs' dtypes.

    ``entropy_grads`` is ``(entropy32, d loss / d entropy)`` when entropy was exported;
    ``support`` the forward's support (None: every live column), outside which ``G`` is 0.
    """
    rows, width = inputs.num_rows, inputs.live_width
    step = chunk_rows(contract)
    d_hidden = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    d_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
    d_bias = None if bias is None else torch.zeros(width, dtype=torch.float32, device=bias.device)
    if width > 0:
        weight32 = weight[:width].detach().to(torch.float32)
        grad = torch.empty((step, width), dtype=torch.float32, device=hidden.device)
        hidden32 = torch.empty((step, hidden.shape[1]), dtype=torch.float32, device=hidden.device)
        for begin, end in row_chunks(rows, contract):
            chunk = slice(begin, end)
            fused_logits(hidden[chunk], weight, bias, width, grad)
            _grad_in_place(grad, chunk, inputs, lse32, grad_selected, entropy_grads, support)
            _active_rows32(hidden[chunk], inputs.active[chunk], hidden32)
            d_hidden[chunk] = rowwise_matmul(grad[: end - begin], weight32.T)
            d_weight[:width] += float64_matmul(grad.T, hidden32)
            if d_bias is not None:
                d_bias += grad.sum(dim=0)
    return d_hidden.to(hidden.dtype), d_weight.to(weight.dtype), _padded_bias_grad(d_bias, bias)


def _active_rows32(hidden: torch.Tensor, active: torch.Tensor, out: torch.Tensor) -> None:
    """fp32 ``hidden`` with inactive rows zeroed into ``out``'s first rows; zero the rest.

    An inactive row's G is 0, and zeroing its hidden row keeps a NaN there out of
    ``d W = G.T @ hidden`` (``0 * NaN`` is NaN).
    """
    count = hidden.shape[0]
    out[:count] = torch.where(active.bool().unsqueeze(1), hidden.detach(), 0.0)
    out[count:].zero_()


def _padded_bias_grad(
    live_grad: torch.Tensor | None, bias: torch.Tensor | None
) -> torch.Tensor | None:
    """The live columns' fp32 ``d bias`` with zeros on the padding rows, in ``bias``'s dtype."""
    if live_grad is None or bias is None:
        return None
    grad = torch.zeros(bias.shape, dtype=bias.dtype, device=bias.device)
    grad[: live_grad.shape[0]] = live_grad
    return grad


def _grad_in_place(
    buffer: torch.Tensor,
    chunk: slice,
    inputs: RankInputs,
    lse32: torch.Tensor,
    grad_selected: torch.Tensor,
    entropy_grads: tuple[torch.Tensor, torch.Tensor | None] | None,
    support: KernelSupport | None,
) -> None:
    """Turn the chunk's fp32 logits in ``buffer`` into ``G = d out / d x`` in place.

    ``logprob_grad_kernel`` reads each tile before it writes the same tile, so one
    buffer serves as its logits and its gradient.
    """
    count = len(range(inputs.num_rows)[chunk])
    if entropy_grads is not None and entropy_grads[1] is not None:
        entropy_grads = (entropy_grads[0][chunk], entropy_grads[1][chunk])
    launch_logprob_grad(
        buffer,
        buffer,
        count,
        inputs.live_width,
        inputs.targets[chunk],
        inputs.active[chunk],
        lse32[chunk],
        grad_selected[chunk],
        inputs,
        entropy_grads,
        support,
        chunk.start,
    )
