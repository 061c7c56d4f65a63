"""Mutants of the fused LM head (``torch_native_fused``): hidden states in, one bug each.

A fused op is ``check -> forward -> (train: autograd with backward)``, exactly as
``tp_logprob.kernels.native_fused`` composes it; :func:`fused_mutant` takes the
forward or the backward as an argument (default: native_fused's own) and returns
the ``(op, capability)`` pair ``--tp-logprob-backend=module:attr`` accepts, with
torch_native_fused's capability. Each private step below is native_fused's with
one change, marked ``# BUG:``, built from the same public pieces (``kernels/fused_chunks.py``,
``kernels/partials.py``, ``kernels/merge.py``). :data:`control_fused` replaces nothing and must
pass the whole suite.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch

from tests.mutants._compose import MutantPair
from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.builtin import TORCH_NATIVE_FUSED
from tp_logprob.kernels.fused_chunks import (
    chunk_rows,
    live_params,
    logits_chunk,
    padded_rows,
    row_chunks,
)
from tp_logprob.kernels.merge import gather, gather_and_merge, merge_gathered
from tp_logprob.kernels.native_fused import native_fused_backward, native_fused_forward
from tp_logprob.kernels.partials import local_grad, local_partial
from tp_logprob.kernels.results import differentiable_outputs, run_for_role
from tp_logprob.kernels.shards import live_width
from tp_logprob.kernels.validation import check_fused_inputs
from tp_logprob.result import LogprobResult
from tp_logprob.support import SupportMode

__all__ = ["FusedBackward", "FusedForward", "control_fused", "fused_mutant"]

FusedForward = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
"""``forward(hidden, weight, bias, targets, active, contract, group) -> (selected, lse,
entropy)``, fp32; ``entropy`` is empty unless the contract exports it."""

FusedBackward = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]
"""``backward(hidden, weight, bias, targets, active, lse, entropy, grad_selected,
grad_entropy, contract) -> (d hidden, d weight, d bias)``."""

_NEG_INF = float("-inf")


class _FusedMutantFunction(torch.autograd.Function):
    """native_fused's FusedLogprobFunction with the forward and backward as arguments."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        active: torch.Tensor,
        contract: LogprobContract,
        group: Any,
        output_dtype: torch.dtype,
        forward: FusedForward,
        backward: FusedBackward,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        selected, lse, entropy = forward(hidden, weight, bias, targets, active, contract, group)
        ctx.save_for_backward(hidden, weight, bias, targets, active, lse, entropy)
        ctx.contract, ctx.backward = contract, backward
        return differentiable_outputs(ctx, contract, output_dtype, selected, lse, entropy)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, targets, active, lse, entropy = ctx.saved_tensors
        contract: LogprobContract = ctx.contract
        grad_entropy = grads[2] if contract.export_entropy else None
        d_hidden, d_weight, d_bias = ctx.backward(
            hidden, weight, bias, targets, active, lse, entropy, grads[0], grad_entropy, contract
        )
        return d_hidden, d_weight, d_bias, *([None] * 7)


def fused_mutant(
    backend_id: str,
    *,
    forward: FusedForward = native_fused_forward,
    backward: FusedBackward = native_fused_backward,
) -> MutantPair:
    """The ``(op, capability)`` pair of a native_fused-built backend with id ``backend_id``."""

    def op(
        hidden: torch.Tensor,
        targets: torch.Tensor,
        contract: LogprobContract,
        group: Any = None,
        *,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
    ) -> LogprobResult:
        active = check_fused_inputs(hidden, targets, contract, group, weight, bias)
        return run_for_role(
            contract, train, forward, hidden, weight, bias, targets, active, contract, group
        )

    def train(*inputs: Any) -> Any:
        return _FusedMutantFunction.apply(*inputs, forward, backward)

    op.__qualname__ = op.__name__ = backend_id
    # Sampling supports are not rebuilt here: the mutants claim the full vocabulary only.
    capability = dataclasses.replace(
        TORCH_NATIVE_FUSED, backend_id=backend_id, support_modes=frozenset({SupportMode.FULL})
    )
    return op, capability


def _forward_sentinel(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    start, live_end = contract.sharding.live_bounds()
    width, step = live_end - start, chunk_rows(contract)
    weight32 = weight.to(torch.float32)
    bias32 = None if bias is None else bias.to(torch.float32)
    pieces = []
    for begin, end in row_chunks(hidden.shape[0], contract):
        chunk_targets = padded_rows(targets, begin, end, step)
        hidden32 = padded_rows(hidden, begin, end, step).to(torch.float32)
        # The whole shard's tile, padding rows of W included, and one column past the
        # shard's end that a masked tile load reads as 0.
        tile = torch.cat(
            [logits_chunk(hidden32, weight32, bias32), hidden32.new_zeros((step, 1))], dim=1
        )
        partial = local_partial(tile, chunk_targets, contract)  # m, s, q: live columns only
        owned = (chunk_targets >= start) & (chunk_targets < live_end)
        # BUG: a target this rank does not own points at the sentinel column `width`, "a
        # padding column, 0 because padding rows of W are zero"; it is the shard's first
        # padding column whenever the shard has one, and that holds whatever W's row holds.
        masked_target = torch.where(owned, chunk_targets.long() - start, width)
        partial[:, 2] = tile.gather(1, masked_target.unsqueeze(1)).squeeze(1)
        pieces.append(partial[: end - begin])
    partials = gather(torch.cat(pieces), group)
    # Megatron's all-reduce (sum) of the predicted logit: non-owners are meant to add 0.
    summed = partials[0][:, 2]
    for other in partials[1:]:
        summed = summed + other[:, 2]
    partials = [torch.cat([p[:, :2], summed.unsqueeze(1), p[:, 3:]], dim=1) for p in partials]
    return merge_gathered(partials, targets, active, contract)


def _backward_rank0_only(
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    d_hidden, d_weight, d_bias = native_fused_backward(
        hidden, weight, bias, targets, active, lse, entropy, grad_selected, grad_entropy, contract
    )
    if contract.sharding.tp_rank != 0:
        # BUG: "hidden is replicated, so the caller's all-reduce would count its gradient
        # TP times: only rank 0 returns it". d hidden is a sum of different partials (one
        # per vocab shard), not TP copies of one value: the other shards' terms are lost.
        d_hidden = torch.zeros_like(d_hidden)
    return d_hidden, d_weight, d_bias


def _forward_bias_after_mask(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    sharding = contract.sharding
    # The whole shard is reduced: padding columns are masked to -inf instead of sliced off.
    whole = dataclasses.replace(
        contract, sharding=dataclasses.replace(sharding, real_vocab_size=sharding.padded_vocab_size)
    )
    width, step = live_width(contract), chunk_rows(contract)
    padding = torch.arange(weight.shape[0], device=weight.device) >= width
    weight32 = weight.to(torch.float32)
    bias32 = None if bias is None else bias.to(torch.float32)
    pieces = []
    for begin, end in row_chunks(hidden.shape[0], contract):
        hidden32 = padded_rows(hidden, begin, end, step).to(torch.float32)
        tile = logits_chunk(hidden32, weight32, None).masked_fill(padding, _NEG_INF)
        if bias32 is not None:
            tile = tile + bias32  # BUG: bias added after the mask: -inf + (+inf or NaN) = NaN
        chunk_targets = padded_rows(targets, begin, end, step)
        pieces.append(local_partial(tile, chunk_targets, whole)[: end - begin])
    return gather_and_merge(torch.cat(pieces), targets, active, contract, group)


def _liger_rows(rows: int, contract: LogprobContract) -> int:
    """Liger's chunk size: ``next_power_of_2(cdiv(N, cdiv(V, H)))`` rows, from N."""
    growth = max(1, -(-live_width(contract) // (contract.hidden_size or 1)))
    return 1 << (max(1, -(-rows // growth)) - 1).bit_length()


def _forward_chunk_from_n(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, width = hidden.shape[0], live_width(contract)
    step = _liger_rows(rows, contract)  # BUG: the chunk's shape, hence a row's bits, depend on N
    weight32, bias32 = live_params(weight, bias, width)
    pieces = []
    for begin in range(0, rows, step):
        end = min(begin + step, rows)
        chunk_targets = padded_rows(targets, begin, end, step)
        if width == 0:
            logits = hidden.new_zeros((step, 0), dtype=torch.float32)
        else:
            hidden32 = padded_rows(hidden, begin, end, step).float()
            logits = _blas_logits_chunk(hidden32, weight32, bias32)
        pieces.append(local_partial(logits, chunk_targets, contract)[: end - begin])
    return gather_and_merge(torch.cat(pieces), targets, active, contract, group)


def _blas_logits_chunk(
    hidden32: torch.Tensor, weight32: torch.Tensor, bias32: torch.Tensor | None
) -> torch.Tensor:
    """Liger's chunk logits: one fp32 BLAS matrix product over the chunk."""
    logits = torch.matmul(hidden32, weight32.T)
    return logits if bias32 is None else logits + bias32


def _chunked_backward(
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
    liger_rows: bool = False,
    zero_inactive_hidden: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``native_fused_backward``, with the chunk size and the inactive-row guard as options."""
    rows, width = hidden.shape[0], live_width(contract)
    step = _liger_rows(rows, contract) if liger_rows else chunk_rows(contract)
    d_hidden = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    d_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
    d_bias = (
        None if bias is None else torch.zeros(bias.shape, dtype=torch.float32, device=bias.device)
    )
    if width > 0:
        weight32, bias32 = live_params(weight, bias, width)
        for begin in range(0, rows, step):
            end = min(begin + step, rows)
            chunk_active = padded_rows(active, begin, end, step)
            hidden32 = padded_rows(hidden, begin, end, step).to(torch.float32)
            chunk_logits = _blas_logits_chunk if liger_rows else logits_chunk
            grad = local_grad(
                chunk_logits(hidden32, weight32, bias32),
                padded_rows(targets, begin, end, step),
                chunk_active,
                padded_rows(lse, begin, end, step),
                padded_rows(grad_selected, begin, end, step),
                contract,
                padded_rows(entropy, begin, end, step) if grad_entropy is not None else None,
                None if grad_entropy is None else padded_rows(grad_entropy, begin, end, step),
            )
            if zero_inactive_hidden:
                hidden32 = torch.where(chunk_active.unsqueeze(1), hidden32, 0.0)
            d_hidden[begin:end] = torch.matmul(grad, weight32)[: end - begin]
            d_weight[:width] += torch.matmul(grad.T, hidden32)
            if d_bias is not None:
                d_bias[:width] += grad.sum(dim=0)
    return (
        d_hidden.to(hidden.dtype),
        d_weight.to(weight.dtype),
        None if d_bias is None or bias is None else d_bias.to(bias.dtype),
    )


# The backward of the chunk-from-N mutant chunks as its forward does (one bug, not a
# forward/backward mismatch).
_backward_chunk_from_n = functools.partial(_chunked_backward, liger_rows=True)
# BUG: "an inactive row's G is 0, so it adds nothing to d W": but 0 * NaN = NaN, and an
# inactive row's hidden may hold NaN; its hidden row is not zeroed before G.T @ hidden.
_backward_nan_hidden_into_weight = functools.partial(_chunked_backward, zero_inactive_hidden=False)


control_fused = fused_mutant("control_fused")
fused_sentinel_collides_with_padding = fused_mutant(
    "mutant_fused_sentinel_collides_with_padding", forward=_forward_sentinel
)
fused_hidden_grad_missing_rank_sum = fused_mutant(
    "mutant_fused_hidden_grad_missing_rank_sum", backward=_backward_rank0_only
)
fused_bias_on_padding = fused_mutant(
    "mutant_fused_bias_on_padding", forward=_forward_bias_after_mask
)
fused_chunk_from_n = fused_mutant(
    "mutant_fused_chunk_from_n", forward=_forward_chunk_from_n, backward=_backward_chunk_from_n
)
fused_inactive_nan_into_weight_grad = fused_mutant(
    "mutant_fused_inactive_nan_into_weight_grad", backward=_backward_nan_hidden_into_weight
)
