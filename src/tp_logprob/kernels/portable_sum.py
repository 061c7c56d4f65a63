"""``torch_portable``: ``triton_portable``'s forward in torch, for the same bits on CPU.

The same steps as the Triton kernels, each an fp32 or fp64 torch op that rounds
correctly (no fma, no libm or SLEEF call; ``kernels/portable.py``), so the outputs are
the bits ``triton_portable`` gives under the interpreter and on every GPU:

1. ``z = fp32(x) / fp32(T)``; per row, ``m_r`` the max over live columns (NaN if one is
   NaN) and ``t_r`` the owned target's ``z``; all-gathered; ``M = max_r m_r``.
2. Where ``M`` is finite: ``floor(portable_exp(z - M) 2^K)`` as int64, summed (and with
   entropy ``portable_exp(d) d 2^K`` truncated toward zero); all-gathered and added.
3. In fp64: ``S = S_int 2^-K``, ``LSE = M + portable_log(S)``,
   ``selected = (t - M) - portable_log(S)``, ``entropy = portable_log(S) - Q / S``, each
   rounded once to fp32 and then to the output dtype; the special values of
   ``docs/semantics.md``. ``M = -0`` counts as ``+0``, as in the kernels, and every NaN
   is the output dtype's one quiet NaN (``portable_cast``).

Integer sums are exact in any order, so ``torch.sum`` may split them as it likes. The
full vocabulary only (no support).

Role ``train``: :class:`PortableLogprobFunction`'s backward is ``logprob_grad_kernel``'s
(``PORTABLE=True``) operations, ``(g ([v == target] - p) - h p (z - LSE + H)) / T`` with
``p = portable_exp(z - LSE)`` from the saved fp32 ``LSE`` and entropy, in fp32, then
rounded to the logits' dtype: the same gradient bits as ``triton_portable``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tp_logprob.comm import GroupHandle
from tp_logprob.contract import LogprobContract
from tp_logprob.errors import LogprobContractError
from tp_logprob.kernels.dtypes import TORCH_DTYPES
from tp_logprob.kernels.fixed_point import fraction_bits
from tp_logprob.kernels.heterogeneous import by_row_groups
from tp_logprob.kernels.merge import gather
from tp_logprob.kernels.partials import live_logits, owned_target_logit, scaled_logits
from tp_logprob.kernels.portable import portable_cast, portable_exp, portable_log
from tp_logprob.kernels.results import differentiable_outputs, run_for_role
from tp_logprob.kernels.shards import live_width, owner_ranks
from tp_logprob.kernels.validation import check_op_inputs
from tp_logprob.result import LogprobResult

__all__ = ["PortableLogprobFunction", "portable_grad", "portable_outputs", "torch_portable_logprob"]

_NEG_INF = float("-inf")
_NAN = float("nan")


@by_row_groups
def torch_portable_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: GroupHandle | None = None,
) -> LogprobResult:
    """One rank's ``(selected_logp, lse[, entropy])``, bit for bit ``triton_portable``'s.

    >>> # result = torch_portable_logprob(local_logits, targets, contract, group=handle)
    """
    active = check_op_inputs(local_logits, targets, contract, group)
    if contract.support is not None:
        raise LogprobContractError(
            f"support={contract.support!r}: torch_portable serves the full vocabulary only"
        )
    apply: Callable[..., tuple[torch.Tensor, ...]] = PortableLogprobFunction.apply
    return run_for_role(
        contract, apply, _cast_outputs, local_logits, targets, active, contract, group
    )


def _cast_outputs(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: GroupHandle | None,
) -> tuple[torch.Tensor, ...]:
    """:func:`portable_outputs` in the contract's output dtype, NaNs canonical."""
    outputs = portable_outputs(local_logits, targets, active, contract, group)
    dtype = TORCH_DTYPES[contract.output.dtype]
    return tuple(portable_cast(output, dtype) for output in outputs)


class PortableLogprobFunction(torch.autograd.Function):
    """Forward: :func:`portable_outputs`. Backward: :func:`portable_grad`, this rank's
    columns only (``lse`` is not differentiable, nor the empty entropy placeholder)."""

    @staticmethod
    def forward(
        ctx: Any,
        local_logits: torch.Tensor,
        targets: torch.Tensor,
        active: torch.Tensor,
        contract: LogprobContract,
        group: GroupHandle | None,
        output_dtype: torch.dtype,
    ) -> tuple[torch.Tensor, ...]:
        outputs = portable_outputs(local_logits, targets, active, contract, group)
        ctx.save_for_backward(local_logits, targets, active, outputs[1], outputs[2])
        ctx.contract = contract
        cast = (portable_cast(output, output_dtype) for output in outputs)
        return differentiable_outputs(ctx, contract, output_dtype, *cast)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        local_logits, targets, active, lse, entropy = ctx.saved_tensors
        contract = ctx.contract
        entropy_grads = (entropy, grads[2]) if contract.export_entropy else None
        grad = portable_grad(local_logits, targets, active, lse, grads[0], contract, entropy_grads)
        return grad, None, None, None, None, None


def portable_grad(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    lse: torch.Tensor,
    grad_selected: torch.Tensor,
    contract: LogprobContract,
    entropy_grads: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """``logprob_grad_kernel``'s portable gradient, op for op: fp32, in the logits' dtype.

    ``lse`` (and the entropy of ``entropy_grads``) are the forward's fp32 outputs; padding
    columns and inactive rows get exactly 0.
    """
    grad = torch.zeros(local_logits.shape, dtype=torch.float32, device=local_logits.device)
    width = live_width(contract)
    if width > 0:
        z = live_logits(local_logits, contract).to(torch.float32)
        finite = ((lse > _NEG_INF) & (lse < float("inf"))).unsqueeze(1)
        centred = z - torch.where(finite, lse.unsqueeze(1), 0.0)
        prob = portable_exp(torch.where(finite, centred, _NEG_INF))
        prob = torch.where(finite, prob, _NAN)
        start = contract.sharding.live_bounds()[0]
        columns = torch.arange(width, device=z.device).unsqueeze(0)
        onehot = torch.where(columns == (targets.long() - start).unsqueeze(1), 1.0, 0.0)
        live_grad = grad_selected.to(torch.float32).unsqueeze(1) * (onehot - prob)
        if entropy_grads is not None:
            entropy, grad_entropy = entropy_grads
            finite_centred = torch.where(centred > _NEG_INF, centred, 0.0)
            spread = prob * (finite_centred + entropy.to(torch.float32).unsqueeze(1))
            step = torch.where(prob == 0.0, 0.0, spread)
            live_grad = live_grad - grad_entropy.to(torch.float32).unsqueeze(1) * step
        live_grad = scaled_logits(live_grad, contract)
        grad[:, :width] = torch.where(active.unsqueeze(1), live_grad, 0.0)
    return portable_cast(grad, local_logits.dtype)


def portable_outputs(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: GroupHandle | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 ``(selected_logp, lse, entropy)``; ``entropy`` empty unless exported."""
    z = live_logits(local_logits, contract).to(torch.float32)
    stage = torch.stack(_rank_stage(z, targets, contract), dim=1)
    gathered = torch.stack(gather(stage.contiguous(), group))  # [R, N, 2]
    maxima = gathered[..., 0]
    has_nan = torch.isnan(maxima).any(dim=0)
    maximum = torch.where(torch.isnan(maxima), _NEG_INF, maxima).amax(dim=0)
    finite = torch.isfinite(maximum) & ~has_nan

    bits = fraction_bits(contract.sharding.padded_vocab_size)
    shifted = torch.where(
        finite.unsqueeze(1), z - torch.where(finite, maximum, 0.0).unsqueeze(1), _NEG_INF
    )
    weights = portable_exp(shifted)
    scale = float(2**bits)
    fields = [(weights * scale).to(torch.int64).sum(dim=1)]
    if contract.export_entropy:
        moment = weights * torch.where(shifted > _NEG_INF, shifted, 0.0)
        fields.append((moment * scale).to(torch.int64).sum(dim=1))
    sums = torch.stack(gather(torch.stack(fields, dim=1).contiguous(), group)).sum(dim=0)

    inv_scale = float(2.0**-bits)
    total = torch.where(finite, sums[:, 0].to(torch.float64) * inv_scale, 1.0)
    log_total = portable_log(total)
    shift = torch.where(finite, maximum, 0.0).to(torch.float64) + 0.0
    special = torch.where(has_nan, _NAN, maximum)
    lse = torch.where(finite, (shift + log_total).to(torch.float32), special)
    owners = owner_ranks(targets, contract).long()
    target_logit = gathered[..., 1].gather(0, owners.unsqueeze(0)).squeeze(0)
    relative = (target_logit.to(torch.float64) - shift) - log_total
    selected = torch.where(finite, relative.to(torch.float32), _NAN)
    selected = torch.where(active, selected, 0.0)
    entropy = selected.new_empty(0)
    if contract.export_entropy:
        moment_total = sums[:, 1].to(torch.float64) * inv_scale
        entropy64 = log_total - moment_total / total
        entropy = torch.where(finite, entropy64.to(torch.float32), _NAN)
        entropy = torch.where(active, entropy, 0.0)
    return selected, lse, entropy


def _rank_stage(
    z: torch.Tensor, targets: torch.Tensor, contract: LogprobContract
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(m_r, t_r)``: the max of the live ``z`` (NaN if one is NaN, ``-inf`` with no live
    column) and the owned target's ``z`` (0 where another rank owns it)."""
    if z.shape[1] == 0:
        return z.new_full((z.shape[0],), _NEG_INF), z.new_zeros(z.shape[0])
    nan = torch.isnan(z)
    rank_max = torch.where(nan, _NEG_INF, z).amax(dim=1)
    rank_max = torch.where(nan.any(dim=1), _NAN, rank_max)
    return rank_max, owned_target_logit(z, targets, contract)
