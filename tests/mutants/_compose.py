"""Build a mutant backend from torch_native's building blocks, one of them replaced.

A backend op is ``check -> forward -> (train: autograd with backward = grad)``,
exactly as ``tp_logprob.kernels.native`` composes it; :func:`mutant` takes any of
the three steps as an argument (default: native's own) and returns the
``(op, capability)`` pair that ``--tp-logprob-backend=module:attr`` accepts, with
the capability torch_native declares, less temperature, entropy and sampling
supports: the base-op mutants predate them, and a mutant claims them only by
passing ``supports_temperature=True, exports_entropy=True`` (``support_modes=...``).
The unmutated composition is the control ``tests.mutants.control:control_native``,
which must pass the whole suite.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from tp_logprob.capability import LogprobBackendCapability
from tp_logprob.contract import LogprobContract, LogprobResult
from tp_logprob.kernels.builtin import TORCH_NATIVE
from tp_logprob.kernels.merge import gather, merge_entropy, merge_partials
from tp_logprob.kernels.native import native_forward
from tp_logprob.kernels.partials import local_grad, local_partial
from tp_logprob.kernels.results import differentiable_outputs, run_for_role
from tp_logprob.kernels.shards import owner_ranks
from tp_logprob.kernels.validation import check_op_inputs
from tp_logprob.support import SupportMode

__all__ = ["Forward", "Grad", "MutantPair", "compose", "forward_from", "mutant"]

Forward = Callable[..., tuple[torch.Tensor, ...]]
"""``forward(local_logits, targets, active, contract, group) -> (selected, lse, entropy)``,
compute dtype; ``entropy`` is empty unless the contract exports it."""

Grad = Callable[..., torch.Tensor]
"""``grad(local_logits, targets, active, lse, grad_selected, contract[, entropy, grad_entropy])
-> d loss / d logits``; the entropy arguments are passed only when the contract exports it."""

Check = Callable[..., torch.Tensor]
"""``check(local_logits, targets, contract, group) -> active mask``; raises on bad input."""

MutantPair = tuple[Callable[..., LogprobResult], LogprobBackendCapability]


def forward_from(
    partial: Callable[..., torch.Tensor] = local_partial,
    merge: Callable[..., tuple[torch.Tensor, torch.Tensor]] = merge_partials,
    owners: Callable[..., torch.Tensor] = owner_ranks,
    entropy_merge: Callable[..., torch.Tensor] = merge_entropy,
) -> Forward:
    """native's forward (partial, one all-gather, merge) with some steps replaced."""

    def forward(
        local_logits: torch.Tensor,
        targets: torch.Tensor,
        active: torch.Tensor,
        contract: LogprobContract,
        group: Any,
    ) -> tuple[torch.Tensor, ...]:
        partials = gather(partial(local_logits, targets, contract), group)
        selected, lse = merge(partials, owners(targets, contract), active)
        if not contract.export_entropy:
            return selected, lse, selected.new_empty(0)
        return selected, lse, entropy_merge(partials, active)

    return forward


def _triple(outputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """A forward's outputs with an empty entropy added to a ``(selected, lse)`` pair."""
    return outputs if len(outputs) == 3 else (*outputs, outputs[0].new_empty(0))


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
    ) -> tuple[torch.Tensor, ...]:
        selected, lse, entropy = _triple(forward(local_logits, targets, active, contract, group))
        ctx.save_for_backward(local_logits, targets, active, lse, entropy)
        ctx.contract, ctx.grad = contract, grad
        return differentiable_outputs(ctx, contract, output_dtype, selected, lse, entropy)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        local_logits, targets, active, lse, entropy = ctx.saved_tensors
        args = (local_logits, targets, active, lse, grads[0], ctx.contract)
        if ctx.contract.export_entropy:
            args += (entropy, grads[2])
        return (ctx.grad(*args), *([None] * 7))


def compose(
    backend_id: str,
    *,
    check: Check = check_op_inputs,
    forward: Forward = native_forward,
    grad: Grad = local_grad,
    **claims: Any,
) -> MutantPair:
    """The ``(op, capability)`` pair of a native-built backend registered as ``backend_id``.

    ``claims`` override fields of torch_native's capability (the lie some mutants
    tell); temperature and entropy are claimed only when ``claims`` says so.
    """

    def op(
        local_logits: torch.Tensor,
        targets: torch.Tensor,
        contract: LogprobContract,
        group: Any = None,
    ) -> LogprobResult:
        active = check(local_logits, targets, contract, group)
        return run_for_role(contract, train, infer, local_logits, targets, active, contract, group)

    def train(*inputs: Any) -> Any:
        return _MutantFunction.apply(*inputs, forward, grad)

    def infer(*inputs: Any) -> tuple[torch.Tensor, ...]:
        return _triple(forward(*inputs))

    op.__qualname__ = op.__name__ = backend_id
    claims = {
        "supports_temperature": False,
        "exports_entropy": False,
        "support_modes": frozenset({SupportMode.FULL}),
        **claims,
    }
    capability = dataclasses.replace(TORCH_NATIVE, backend_id=backend_id, **claims)
    return op, capability


def mutant(name: str, **steps: Any) -> MutantPair:
    """:func:`compose` under the backend id ``mutant_<name>``."""
    return compose(f"mutant_{name}", **steps)
