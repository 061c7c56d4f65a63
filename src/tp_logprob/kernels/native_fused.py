"""The fused LM head in plain torch (``torch_native_fused``): hidden states in, logprobs out.

Op signature (contracts with ``input_kind="hidden"``)::

    torch_native_fused_logprob(hidden, targets, contract, group=None, *, weight, bias=None)

``hidden`` is ``[N, hidden_size]``, replicated on every TP rank; ``weight`` is this
rank's row slice ``[local_vocab_size, hidden_size]`` of the LM-head weight (rows
``vocab_shard_bounds[rank]``, padding rows included, whatever they hold); ``bias``
is ``[local_vocab_size]`` exactly when ``contract.has_bias``. All three are in the
contract's dtype and on one device. The result is the logits path's: fp32
``selected_logp``, ``lse`` (and ``entropy``), replicated.

Algorithm: rows are processed in chunks of ``fused_chunks.chunk_rows`` rows, a number
that depends only on the shard's live width (never on N). Per chunk, each row's
``x = fp32(W_live) fp32(h) (+ fp32(bias))`` is one matrix-vector product with
exact products and a float64 sum rounded once to fp32 (no fp32 precision setting of
the process reaches it, and none is changed), so a row's ``x``
depends on that row alone (``kernels/rowwise.py``: a BLAS matrix product gives a
row other bits at another position in its batch). The chunk's logits are padded
with zero rows to ``chunk_rows`` rows, so torch_native's per-shard partial
(``kernels/partials.py``) always runs on one shape; the partials of all chunks go
through one all-gather and torch_native's merge (``kernels/merge.py``). Padding
rows of ``W`` are never read. Memory: one ``[chunk_rows, live]`` fp32 logits
chunk and its elementwise temporaries (at most ``max(fused_chunks.CHUNK_ELEMENTS, live)``
elements each), an fp32 copy of the live weight rows ``[live, H]`` (independent
of N; a float64 one beside it while a chunk's products run) and of one hidden chunk,
and ``[N, 3 or 4]`` partials; never
``[N, local_vocab]`` (for N > ``chunk_rows``).

Registration: :func:`~tp_logprob.kernels.builtin.register_fused_backends` (part of
the default registry) adds it as ``torch_native_fused`` (``input_kinds={"hidden"}``).

Role ``train``: the backward recomputes each logits chunk from ``hidden`` and
``W``, forms ``G = d out / d x`` with torch_native's local gradient, and returns

* ``d hidden = G @ W_live``, one matrix-vector product per row: this rank's
  PARTIAL. The caller all-reduces it (sums it) across the TP group, as
  Megatron's column-parallel linear backward does; the op never reduces it;
* ``d W = G.T @ hidden`` (zero on padding rows) and ``d bias = sum_t G``: local.

Products and sums of the backward are formed the same way (``kernels/rowwise.py``);
inactive rows add exactly 0 to ``d W`` and ``d bias`` even when their hidden row
holds NaN.

A contract with a support (``docs/semantics.md``, "Processed logprobs") forms each
chunk's partial over ``S`` (and the full partial, for ``lse``) with
``kernels/processed.py``, all chunks in the same one all-gather. A replayed
mask's rows are scattered per chunk from the rank's kept ids, so the mask too is
``[chunk_rows, live]``. Sampling parameters need the threshold's collectives
per chunk (``kernels/support_threshold.py``), so every rank must walk the same
chunks: the forward then uses ``fused_chunks.shared_chunk_rows``, the chunk size of
the group's widest live shard (never more rows than the rank's own
``chunk_rows``), and keeps each row's threshold for the backward, which rebuilds
``S`` as ``z >= threshold`` without a collective. Each rank runs the same number
of threshold collectives per chunk, even a rank with no live column.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tp_logprob.comm import GroupHandle
from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.fused_chunks import (
    chunk_rows,
    live_params,
    logits_chunk,
    padded_rows,
    row_chunks,
    shared_chunk_rows,
)
from tp_logprob.kernels.heterogeneous import fused_by_row_groups
from tp_logprob.kernels.merge import gather_and_merge
from tp_logprob.kernels.partials import local_grad, local_partial, scaled_logits
from tp_logprob.kernels.processed import (
    merge_processed,
    processed_fields,
    processed_partial,
    support_block,
)
from tp_logprob.kernels.results import ProcessedOutputs, differentiable_outputs, run_for_role
from tp_logprob.kernels.rowwise import float64_matmul, rowwise_matmul
from tp_logprob.kernels.shards import live_width
from tp_logprob.kernels.support_mask import ReplayedSupport, threshold_keep
from tp_logprob.kernels.support_threshold import sampling_rules
from tp_logprob.kernels.validation import check_fused_inputs
from tp_logprob.result import LogprobResult
from tp_logprob.support import SupportMode

__all__ = [
    "FusedLogprobFunction",
    "native_fused_backward",
    "native_fused_forward",
    "torch_native_fused_logprob",
]


@fused_by_row_groups
def torch_native_fused_logprob(
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

        result = torch_native_fused_logprob(hidden, targets, contract, group, weight=w_r)
        (-(result.selected_logp * advantages).sum()).backward()
        torch.distributed.all_reduce(hidden.grad)  # d hidden is this rank's partial
    """
    active = check_fused_inputs(hidden, targets, contract, group, weight, bias)
    apply: Callable[..., tuple[torch.Tensor, ...]] = FusedLogprobFunction.apply
    return run_for_role(
        contract,
        apply,
        native_fused_forward,
        hidden,
        weight,
        bias,
        targets,
        active,
        contract,
        group,
    )


class FusedLogprobFunction(torch.autograd.Function):
    """Forward: the fused op. Backward: ``d hidden`` (this rank's partial), ``d W``, ``d bias``."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        active: torch.Tensor,
        contract: LogprobContract,
        group: GroupHandle | None,
        output_dtype: torch.dtype,
    ) -> tuple[torch.Tensor, ...]:
        outputs, replayed = _forward(hidden, weight, bias, targets, active, contract, group)
        # A processed op's gradient uses LSE_S with S fixed (a threshold, or replayed ids).
        grad_lse, threshold = (outputs[1], None) if len(outputs) == 3 else outputs[3::2]
        ctx.save_for_backward(
            hidden, weight, bias, targets, active, grad_lse, outputs[2], threshold
        )
        ctx.contract, ctx.replayed = contract, replayed
        return differentiable_outputs(ctx, contract, output_dtype, *outputs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, targets, active, lse, entropy, threshold = ctx.saved_tensors
        contract: LogprobContract = ctx.contract
        grad_entropy = grads[2] if contract.export_entropy else None
        d_hidden, d_weight, d_bias = native_fused_backward(
            hidden,
            weight,
            bias,
            targets,
            active,
            lse,
            entropy,
            grads[0],
            grad_entropy,
            contract,
            threshold=threshold,
            replayed=ctx.replayed,
        )
        return d_hidden, d_weight, d_bias, None, None, None, None, None


def native_fused_forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: GroupHandle | None,
) -> tuple[torch.Tensor, ...]:
    """Chunked partials, one all-gather, torch_native's merge; fp32 results.

    ``(selected_logp, lse, entropy)``, followed by ``(support_lse, support_size,
    support_threshold)`` for a contract with a support.
    """
    return _forward(hidden, weight, bias, targets, active, contract, group)[0]


def _forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: GroupHandle | None,
) -> tuple[tuple[torch.Tensor, ...], ReplayedSupport | None]:
    """The outputs, and a replayed mask's kept ids on the device (for the backward)."""
    if contract.support is None:
        return _raw_forward(hidden, weight, bias, targets, active, contract, group), None
    replayed = None
    if contract.support_mode is SupportMode.REPLAYED_MASK:
        replayed = ReplayedSupport(contract, hidden.device)
    outputs = _processed_forward(hidden, weight, bias, targets, active, contract, group, replayed)
    return outputs, replayed


def _raw_forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: GroupHandle | None,
) -> tuple[torch.Tensor, ...]:
    rows, width = hidden.shape[0], live_width(contract)
    step = chunk_rows(contract)
    weight32, bias32 = live_params(weight, bias, width)
    pieces = []
    for begin, end in row_chunks(rows, contract):
        chunk_targets = padded_rows(targets, begin, end, step)
        logits = _chunk_logits(hidden, weight32, bias32, begin, end, step)
        pieces.append(local_partial(logits, chunk_targets, contract)[: end - begin])
    fields = 4 if contract.export_entropy else 3
    partial = torch.cat(pieces) if pieces else hidden.new_zeros((0, fields), dtype=torch.float32)
    return gather_and_merge(partial, targets, active, contract, group)


def _processed_forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: GroupHandle | None,
    replayed: ReplayedSupport | None,
) -> ProcessedOutputs:
    """Per chunk: logits, the chunk's support (threshold collectives for sampling
    parameters), the partial over it; then one all-gather and the processed merge."""
    rows, width = hidden.shape[0], live_width(contract)
    step = chunk_rows(contract) if replayed is not None else shared_chunk_rows(contract)
    weight32, bias32 = live_params(weight, bias, width)
    pieces, sizes, thresholds = [], [], []
    for begin, end in row_chunks(rows, contract, step=step):
        count = end - begin
        z = scaled_logits(_chunk_logits(hidden, weight32, bias32, begin, end, step), contract)
        keep, size, threshold = support_block(z[:count], contract, group, replayed, begin)
        if keep is not None:
            keep = padded_rows(keep, 0, count, step)
        chunk_targets = padded_rows(targets, begin, end, step)
        pieces.append(processed_partial(z, chunk_targets, contract, keep)[:count])
        sizes.append(size)
        thresholds.append(threshold)
    if not pieces:  # no rows: no chunk, and no collective but the merge's
        pieces = [hidden.new_zeros((0, processed_fields(contract)), dtype=torch.float32)]
        sizes = [torch.zeros(0, dtype=torch.int64, device=hidden.device)]
        thresholds = [hidden.new_zeros(0, dtype=torch.float32)]
    size, threshold = torch.cat(sizes), torch.cat(thresholds)
    return merge_processed(torch.cat(pieces), targets, active, contract, group, size, threshold)


def _chunk_logits(
    hidden: torch.Tensor,
    weight32: torch.Tensor,
    bias32: torch.Tensor | None,
    begin: int,
    end: int,
    step: int,
) -> torch.Tensor:
    """Rows ``begin:end`` of the rank's live fp32 logits, padded with zero rows to ``step``."""
    if weight32.shape[0] == 0:
        return hidden.new_zeros((step, 0), dtype=torch.float32)
    logits = logits_chunk(hidden[begin:end].to(torch.float32), weight32, bias32)
    return padded_rows(logits, 0, end - begin, step)


def native_fused_backward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    active: torch.Tensor,
    lse: torch.Tensor,
    entropy: torch.Tensor,
    grad_selected: torch.Tensor,
    grad_entropy: torch.Tensor | None,
    contract: LogprobContract,
    *,
    threshold: torch.Tensor | None = None,
    replayed: ReplayedSupport | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Chunk by chunk: recompute ``x``, ``G = d out / d x``, then ``G @ W`` and ``G.T @ hidden``.

    A processed op passes ``LSE_S`` (and the entropy over ``S``) as ``lse`` (``entropy``)
    and its support: the forward's ``threshold`` (sampling parameters) or ``replayed``
    kept ids; ``G`` is then 0 outside ``S``.
    """
    rows, width = hidden.shape[0], live_width(contract)
    step = chunk_rows(contract)
    d_hidden = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    d_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
    d_bias = (
        None if bias is None else torch.zeros(bias.shape, dtype=torch.float32, device=bias.device)
    )
    if width > 0:
        weight32, bias32 = live_params(weight, bias, width)
        for begin, end in row_chunks(rows, contract):
            count = end - begin
            chunk_active = padded_rows(active, begin, end, step)
            hidden32 = padded_rows(hidden, begin, end, step).to(torch.float32)
            logits = padded_rows(logits_chunk(hidden32[:count], weight32, bias32), 0, count, step)
            keep = _chunk_keep(logits, contract, threshold, replayed, begin, end, step)
            grad = local_grad(
                logits,
                padded_rows(targets, begin, end, step),
                chunk_active,
                padded_rows(lse, begin, end, step),
                padded_rows(grad_selected, begin, end, step),
                contract,
                padded_rows(entropy, begin, end, step) if grad_entropy is not None else None,
                None if grad_entropy is None else padded_rows(grad_entropy, begin, end, step),
                keep=keep,
            )
            # An inactive row's G is 0; zeroing its hidden row keeps NaN there out of d W.
            hidden32 = torch.where(chunk_active.unsqueeze(1), hidden32, 0.0)
            d_hidden[begin:end] = rowwise_matmul(grad[:count], weight32.T)
            d_weight[:width] += float64_matmul(grad.T, hidden32)
            if d_bias is not None:
                d_bias[:width] += grad.sum(dim=0).to(d_bias.device)
    return (
        d_hidden.to(hidden.dtype),
        d_weight.to(weight.dtype),
        None if d_bias is None or bias is None else d_bias.to(device=bias.device, dtype=bias.dtype),
    )


def _chunk_keep(
    logits: torch.Tensor,
    contract: LogprobContract,
    threshold: torch.Tensor | None,
    replayed: ReplayedSupport | None,
    begin: int,
    end: int,
    step: int,
) -> torch.Tensor | None:
    """The support mask of a padded logits chunk (None: every live column)."""
    if replayed is not None:
        return replayed.keep(begin, end, rows=step)
    if threshold is None or sampling_rules(contract).all_off:
        return None
    tau = padded_rows(threshold, begin, end, step)
    return threshold_keep(scaled_logits(logits, contract), tau)
