"""Build a mutant backend from torch_native's building blocks, one of them replaced.

A backend op is ``check -> forward -> (train: autograd with backward = grad)``,
exactly as ``tp_logprob.kernels.native`` composes it; :func:`mutant` takes any of
the three steps as an argument (default: native's own) and returns the
``(op, capability)`` pair that ``--tp-logprob-backend=module:attr`` accepts, with
the capability torch_native declares. The unmutated composition is the control
``tests.mutants.control:control_native``, which must pass the whole suite.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from tp_logprob.capability import LogprobBackendCapability
from tp_logprob.contract import LogprobContract, LogprobResult, LogprobRole
from tp_logprob.kernels import native
from tp_logprob.kernels.builtin import TORCH_NATIVE
from tp_logprob.kernels.checks import TORCH_DTYPES, check_op_inputs, owner_ranks
from tp_logprob.kernels.merge import merge_partials

__all__ = ["Forward", "Grad", "MutantPair", "compose", "forward_from", "mutant"]

Forward = Callable[..., tuple[torch.Tensor, torch.Tensor]]
"""``forward(local_logits, targets, active, contract, group) -> (selected, lse)``, compute dtype."""

Grad = Callable[..., torch.Tensor]
"""``grad(local_logits, targets, active, lse, grad_selected, contract) -> d loss / d logits``."""

Check = Callable[..., torch.Tensor]
"""``check(local_logits, targets, contract, group) -> active mask``; raises on bad input."""

MutantPair = tuple[Callable[..., LogprobResult], LogprobBackendCapability]


def forward_from(
    partial: Callable[..., torch.Tensor] = native._local_partial,
    merge: Callable[..., tuple[torch.Tensor, torch.Tensor]] = merge_partials,
    owners: Callable[..., torch.Tensor] = owner_ranks,
) -> Forward:
    """native's forward (partial, one all-gather, merge) with some steps replaced."""

    def forward(
        local_logits: torch.Tensor,
        targets: torch.Tensor,
        active: torch.Tensor,
        contract: LogprobContract,
        group: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        mine = partial(local_logits, targets, contract)
        partials = [mine] if group is None else group.all_gather(mine)
        return merge(partials, owners(targets, contract), active)

    return forward


class _MutantFunction(torch.autograd.Function):
    """native's NativeLogprobFunction with the forward and the local gradient as arguments."""

    @staticmethod
    def forward(
        ctx: Any,
        local_logits: torch.Tensor,
        targets: torch.Tensor,
        active: torch.Tensor,
        contract: LogprobContract,
        group: Any,
        output_dtype: torch.dtype,
        forward: Forward,
        grad: Grad,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        selected, lse = forward(local_logits, targets, active, contract, group)
        ctx.save_for_backward(local_logits, targets, active, lse)
        ctx.contract, ctx.grad = contract, grad
        lse_out = lse.to(output_dtype)
        ctx.mark_non_differentiable(lse_out)
        return selected.to(output_dtype), lse_out

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        local_logits, targets, active, lse = ctx.saved_tensors
        grad = ctx.grad(local_logits, targets, active, lse, grads[0], ctx.contract)
        return (grad, *([None] * 7))


def compose(
    backend_id: str,
    *,
    check: Check = check_op_inputs,
    forward: Forward = native._forward,
    grad: Grad = native._local_grad,
    **claims: Any,
) -> MutantPair:
    """The ``(op, capability)`` pair of a native-built backend registered as ``backend_id``.

    ``claims`` override fields of torch_native's capability (the lie some mutants tell).
    """

    def op(
        local_logits: torch.Tensor,
        targets: torch.Tensor,
        contract: LogprobContract,
        group: Any = None,
    ) -> LogprobResult:
        active = check(local_logits, targets, contract, group)
        output_dtype = TORCH_DTYPES[contract.output.dtype]
        if contract.role is LogprobRole.TRAIN:
            apply: Callable[..., tuple[torch.Tensor, torch.Tensor]] = _MutantFunction.apply
            selected, lse = apply(
                local_logits, targets, active, contract, group, output_dtype, forward, grad
            )
        else:
            with torch.no_grad():
                selected, lse = forward(local_logits, targets, active, contract, group)
                selected, lse = selected.to(output_dtype), lse.to(output_dtype)
        return LogprobResult(selected, lse if contract.export_lse else None)

    op.__qualname__ = op.__name__ = backend_id
    capability = dataclasses.replace(TORCH_NATIVE, backend_id=backend_id, **claims)
    return op, capability


def mutant(name: str, **steps: Any) -> MutantPair:
    """:func:`compose` under the backend id ``mutant_<name>``."""
    return compose(f"mutant_{name}", **steps)
