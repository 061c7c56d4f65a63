"""The PyTorch native backend (``torch_native``): plain torch ops, ``fixed_topology`` determinism.

Each rank reduces its live columns (padding columns are sliced off, whatever
they hold) to a partial ``(m_r, s_r)`` plus the target logit it owns, packs the
three as one ``[N, 3]`` fp32 tensor, all-gathers it once and merges the partials
in shard order (``kernels/merge.py``), so every rank gets the same bits. With
``export_entropy`` the partial gains ``q_r = sum exp(z - m_r) (z - m_r)`` (a
``-inf`` column adds exactly 0) and is ``[N, 4]``: still one all-gather.

Temperature: everything runs on ``z = fp32(x) / fp32(T)``, divided by a 0-dim
tensor on the logits' device. (A Python-scalar divisor would let CUDA multiply
by a rounded reciprocal, which is not the contract's IEEE division.) ``T = 1``
skips the division, which is exact anyway.

``s_r`` is a fixed pairwise tree of elementwise adds over the shard width padded
with zeros to a power of two, never ``torch.sum``: torch's reductions change how
they split the reduced dimension with N and with thread count, elementwise ops
do not, so a row's bits never depend on the other rows. ``max`` is exact in any
order. Memory: a few ``[N, local_width]`` fp32 temporaries.

Role ``train`` runs the forward inside :class:`NativeLogprobFunction`, whose
backward writes ``(g * ([v == target] - p) - h * p (z - LSE + H)) / T`` into this
rank's columns from the merged LSE and entropy saved in forward, with no
collective (``p = exp(z - LSE)``; the entropy term is 0 where ``p`` is 0, so a
``-inf`` column never gives ``0 * -inf``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tp_logprob.contract import LogprobContract, LogprobResult, LogprobRole
from tp_logprob.kernels.dtypes import TORCH_DTYPES
from tp_logprob.kernels.merge import merge_entropy, merge_partials, pack_partial
from tp_logprob.kernels.shards import live_width, owned_local_targets, owner_ranks
from tp_logprob.kernels.validation import active_mask_tensor, check_op_inputs

__all__ = [
    "NativeLogprobFunction",
    "native_logprob",
    "scaled_logits",
    "torch_native_logprob",
    "tree_sum",
]

_NEG_INF = float("-inf")


def torch_native_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
) -> LogprobResult:
    """One rank's vocab-parallel selected logprob; every rank of the group gets the same bits.

    Example, on rank r with its shard of the logits::

        result = torch_native_logprob(local_logits, targets, contract, group=TorchGroup())
        loss = -(result.selected_logp * advantages).sum()
    """
    active = check_op_inputs(local_logits, targets, contract, group)
    return native_logprob(local_logits, targets, contract, group, active=active)


def native_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
    *,
    active: torch.Tensor | None = None,
    output_dtype: torch.dtype | None = None,
) -> LogprobResult:
    """The op without input checks, generic over the logits dtype.

    It exists so ``gradcheck`` can drive the real code path in float64 (which the
    contract does not admit): compute is in ``promote(dtype, float32)``, the
    output in ``output_dtype`` (default: the contract's output dtype).
    """
    if active is None:
        active = active_mask_tensor(contract, local_logits.device)
    if output_dtype is None:
        output_dtype = TORCH_DTYPES[contract.output.dtype]
    if contract.role is LogprobRole.TRAIN:
        apply: Callable[..., tuple[torch.Tensor, ...]] = NativeLogprobFunction.apply
        selected, lse, entropy = apply(local_logits, targets, active, contract, group, output_dtype)
    else:
        with torch.no_grad():
            selected, lse, entropy = _forward(local_logits, targets, active, contract, group)
            selected, lse, entropy = (t.to(output_dtype) for t in (selected, lse, entropy))
    return LogprobResult(
        selected,
        lse if contract.export_lse else None,
        entropy if contract.export_entropy else None,
    )


class NativeLogprobFunction(torch.autograd.Function):
    """Forward: the vocab-parallel logprob. Backward: this rank's column slice only.

    ``selected_logp`` and ``entropy`` are differentiable; ``lse`` is not. Without
    ``export_entropy`` the entropy output is an empty placeholder.
    Outputs are replicated across ranks but each rank's graph reaches only its own
    columns, as in real TP training: each rank backprops its own (replicated) loss
    into its own shard, so summing every rank's loss gives each column its
    gradient exactly once.
    """

    @staticmethod
    def forward(
        ctx: Any,
        local_logits: torch.Tensor,
        targets: torch.Tensor,
        active: torch.Tensor,
        contract: LogprobContract,
        group: Any,
        output_dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        selected, lse, entropy = _forward(local_logits, targets, active, contract, group)
        ctx.save_for_backward(local_logits, targets, active, lse, entropy)
        ctx.contract = contract
        lse_out, entropy_out = lse.to(output_dtype), entropy.to(output_dtype)
        # One call: each call replaces the set of non-differentiable outputs.
        frozen = (lse_out,) if contract.export_entropy else (lse_out, entropy_out)
        ctx.mark_non_differentiable(*frozen)
        return selected.to(output_dtype), lse_out, entropy_out

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        local_logits, targets, active, lse, entropy = ctx.saved_tensors
        grad_entropy = grads[2] if ctx.contract.export_entropy else None
        grad = _local_grad(
            local_logits, targets, active, lse, grads[0], ctx.contract, entropy, grad_entropy
        )
        return grad, None, None, None, None, None


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def tree_sum(values: torch.Tensor) -> torch.Tensor:
    """Row sums of ``[N, W]`` by a fixed pairwise tree of elementwise adds.

    The tree depends only on ``W``, so each row's bits are independent of N, of
    the other rows and of the device's reduction strategy.
    """
    width = values.shape[1]
    size = 1 << (width - 1).bit_length()
    if size != width:
        values = torch.nn.functional.pad(values, (0, size - width))
    while size > 1:
        size //= 2
        values = values[:, :size] + values[:, size:]
    return values[:, 0]


def scaled_logits(live: torch.Tensor, contract: LogprobContract) -> torch.Tensor:
    """``z = x / fp32(T)`` in ``live``'s (compute) dtype, one IEEE division per element."""
    if contract.temperature == 1.0:
        return live
    divisor = torch.tensor(contract.temperature_fp32, dtype=live.dtype, device=live.device)
    return live / divisor


def _local_partial(
    local_logits: torch.Tensor, targets: torch.Tensor, contract: LogprobContract
) -> torch.Tensor:
    """This rank's packed ``(m_r, s_r, t_r[, q_r])``; the identity ``(-inf, 0, 0[, 0])``
    with no live column."""
    rows = local_logits.shape[0]
    dtype = _compute_dtype(local_logits.dtype)
    width = live_width(contract)
    if width == 0:
        full = torch.full((rows,), _NEG_INF, dtype=dtype, device=local_logits.device)
        zeros = torch.zeros(rows, dtype=dtype, device=local_logits.device)
        return pack_partial(full, zeros, zeros, zeros if contract.export_entropy else None)
    live = scaled_logits(local_logits[:, :width].to(dtype), contract)
    row_max = torch.amax(live, dim=1)  # NaN propagates; an all -inf row gives -inf
    # exp(-inf - -inf) is NaN: shift an all -inf row by 0 instead (its terms are all 0).
    shift = torch.where(row_max == _NEG_INF, 0.0, row_max)
    shifted = live - shift.unsqueeze(1)
    terms = torch.exp(shifted)
    sum_exp = tree_sum(terms)
    owned, local = owned_local_targets(targets, contract)
    target_logit = live.gather(1, local.unsqueeze(1)).squeeze(1)
    target_logit = torch.where(owned, target_logit, 0.0)
    entropy_sum = None
    if contract.export_entropy:
        # exp(d) * d with d = -inf is 0 * -inf: a -inf column adds exactly 0 instead.
        entropy_sum = tree_sum(torch.where(shifted == _NEG_INF, 0.0, terms * shifted))
    return pack_partial(row_max, sum_exp, target_logit, entropy_sum)


def _forward(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Partial, one all-gather, merge: ``(selected_logp, lse, entropy)`` in the compute dtype.

    ``entropy`` is an empty tensor unless the contract exports it.
    """
    partial = _local_partial(local_logits, targets, contract)
    partials = [partial] if group is None else group.all_gather(partial)
    selected, lse = merge_partials(partials, owner_ranks(targets, contract), active)
    entropy = merge_entropy(partials, active) if contract.export_entropy else selected.new_empty(0)
    return selected, lse, entropy


def _local_grad(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    lse: torch.Tensor,
    grad_selected: torch.Tensor,
    contract: LogprobContract,
    entropy: torch.Tensor | None = None,
    grad_entropy: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(g ([v == target] - p) - h p (z - LSE + H)) / T`` on live columns of active rows.

    Exactly 0 on padding columns and inactive rows; the entropy term is 0 where
    ``p = exp(z - LSE)`` is 0 (a ``-inf`` column), never ``0 * -inf``.
    """
    dtype = _compute_dtype(local_logits.dtype)
    grad = torch.zeros(local_logits.shape, dtype=dtype, device=local_logits.device)
    width = live_width(contract)
    if width > 0:
        live = scaled_logits(local_logits[:, :width].to(dtype), contract)
        owned, local = owned_local_targets(targets, contract)
        columns = torch.arange(width, device=live.device)
        one_hot = (columns.unsqueeze(0) == local.unsqueeze(1)) & owned.unsqueeze(1)
        centred = live - lse.unsqueeze(1)
        probs = torch.exp(centred)
        # A row whose selected_logp is NaN (LSE NaN, +inf or -inf) gets NaN on every live
        # column, as torch's log_softmax backward gives; exp(x - inf) alone would give 0.
        probs = torch.where(torch.isfinite(lse).unsqueeze(1), probs, float("nan"))
        g = grad_selected.to(dtype).unsqueeze(1)
        local_grad = g * (one_hot.to(dtype) - probs)
        if grad_entropy is not None and entropy is not None:
            h = grad_entropy.to(dtype).unsqueeze(1)
            spread = probs * (centred + entropy.to(dtype).unsqueeze(1))
            local_grad = local_grad - h * torch.where(probs == 0.0, 0.0, spread)
        local_grad = scaled_logits(local_grad, contract)
        grad[:, :width] = torch.where(active.unsqueeze(1), local_grad, 0.0)
    return grad.to(local_logits.dtype)
