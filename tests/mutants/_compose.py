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

A processed op (a contract with a support) is ``check -> live z -> support (a
threshold, or the replayed mask) -> partial over S -> merge`` as
``kernels/native.py`` and ``kernels/processed.py`` compose it;
:func:`compose_processed` takes a forward built by :func:`processed_forward_from`
from those steps, one of them replaced, and claims everything torch_native claims
(temperature, entropy, both sampling supports). Its unmutated composition is
``tests.mutants.processed_bugs:control_processed``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from tp_logprob.capability import LogprobBackendCapability
from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.builtin import TORCH_NATIVE
from tp_logprob.kernels.heterogeneous import by_row_groups
from tp_logprob.kernels.merge import gather, gather_and_merge, merge_entropy, merge_partials
from tp_logprob.kernels.native import native_forward
from tp_logprob.kernels.partials import live_logits, local_grad, local_partial
from tp_logprob.kernels.processed import (
    SupportBlock,
    merge_processed,
    processed_partial,
    support_block,
)
from tp_logprob.kernels.results import ProcessedOutputs, differentiable_outputs, run_for_role
from tp_logprob.kernels.shards import owner_ranks
from tp_logprob.kernels.support_mask import ReplayedSupport
from tp_logprob.kernels.validation import check_op_inputs
from tp_logprob.result import LogprobResult
from tp_logprob.support import SupportMode

__all__ = [
    "Forward",
    "Grad",
    "MutantPair",
    "ProcessedForward",
    "compose",
    "compose_processed",
    "forward_from",
    "mutant",
    "native_block",
    "processed_forward_from",
]

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


ProcessedForward = Callable[..., tuple[tuple[torch.Tensor, ...], torch.Tensor | None]]
"""``forward(local_logits, targets, active, contract, group) -> (outputs, keep)``: native's
outputs (six for a processed op) and this rank's support mask for the backward (None:
every live column)."""

Block = Callable[..., SupportBlock]
"""``block(local_logits, z, contract, group, replayed) -> (keep, size, threshold)``: the
support of every row from this rank's live tempered logits ``z``, or the replayed mask."""


def native_block(
    local_logits: torch.Tensor,
    z: torch.Tensor,
    contract: LogprobContract,
    group: Any,
    replayed: ReplayedSupport | None,
) -> SupportBlock:
    """torch_native's support: :func:`~tp_logprob.kernels.processed.support_block`."""
    return support_block(z, contract, group, replayed)


def processed_forward_from(
    block: Block = native_block,
    merge: Callable[..., ProcessedOutputs] = merge_processed,
    replayed_support: Callable[[LogprobContract, torch.device], Any] = ReplayedSupport,
) -> ProcessedForward:
    """native's forward (``kernels/native.py``'s, ``processed_forward`` for a support) with
    some steps replaced: the support, the merge, or how the replayed mask is read."""

    def forward(
        local_logits: torch.Tensor,
        targets: torch.Tensor,
        active: torch.Tensor,
        contract: LogprobContract,
        group: Any,
    ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
        if contract.support is None:
            partial = local_partial(local_logits, targets, contract)
            return gather_and_merge(partial, targets, active, contract, group), None
        z = live_logits(local_logits, contract)
        replayed = None
        if contract.support_mode is SupportMode.REPLAYED_MASK:
            replayed = replayed_support(contract, z.device)
        keep, size, threshold = block(local_logits, z, contract, group, replayed)
        partial = processed_partial(z, targets, contract, keep)
        return merge(partial, targets, active, contract, group, size, threshold), keep

    return forward


class _ProcessedMutantFunction(torch.autograd.Function):
    """native's NativeLogprobFunction with the forward as an argument: the gradient of
    ``z_y - LSE_S`` from the support's LSE and mask saved in forward."""

    @staticmethod
    def forward(
        ctx: Any,
        local_logits: torch.Tensor,
        targets: torch.Tensor,
        active: torch.Tensor,
        contract: LogprobContract,
        group: Any,
        output_dtype: torch.dtype,
        forward: ProcessedForward,
    ) -> tuple[torch.Tensor, ...]:
        outputs, keep = forward(local_logits, targets, active, contract, group)
        grad_lse = outputs[1] if len(outputs) == 3 else outputs[3]
        ctx.save_for_backward(local_logits, targets, active, grad_lse, outputs[2], keep)
        ctx.contract = contract
        return differentiable_outputs(ctx, contract, output_dtype, *outputs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        local_logits, targets, active, lse, entropy, keep = ctx.saved_tensors
        grad_entropy = grads[2] if ctx.contract.export_entropy else None
        grad = local_grad(
            local_logits,
            targets,
            active,
            lse,
            grads[0],
            ctx.contract,
            entropy,
            grad_entropy,
            keep=keep,
        )
        return (grad, *([None] * 6))


def compose_processed(backend_id: str, forward: ProcessedForward) -> MutantPair:
    """The ``(op, capability)`` pair of a native-built backend, sampling supports included,
    registered as ``backend_id`` with torch_native's capability."""

    def op(
        local_logits: torch.Tensor,
        targets: torch.Tensor,
        contract: LogprobContract,
        group: Any = None,
    ) -> LogprobResult:
        active = check_op_inputs(local_logits, targets, contract, group)
        return run_for_role(contract, train, infer, local_logits, targets, active, contract, group)

    def train(*inputs: Any) -> Any:
        return _ProcessedMutantFunction.apply(*inputs, forward)

    def infer(*inputs: Any) -> tuple[torch.Tensor, ...]:
        return forward(*inputs)[0]

    op.__qualname__ = op.__name__ = backend_id
    # torch_native's heterogeneous batches, group by group (kernels/heterogeneous.py).
    return by_row_groups(op), dataclasses.replace(TORCH_NATIVE, backend_id=backend_id)
