"""The PyTorch native backend (``torch_native``): plain torch ops, ``fixed_topology`` determinism.

Each rank reduces its live columns (padding columns are sliced off, whatever
they hold) to a partial ``(m_r, s_r)`` plus the target logit it owns
(``kernels/partials.py``), packs the three as one ``[N, 3]`` fp32 tensor,
all-gathers it once and merges the partials in shard order (``kernels/merge.py``),
so every rank gets the same bits. With ``export_entropy`` the partial gains
``q_r = sum exp(z - m_r) (z - m_r)`` (a ``-inf`` column adds exactly 0) and is
``[N, 4]``: still one all-gather. Temperature: everything runs on
``z = fp32(x) / fp32(T)``, one IEEE division per element.

``s_r`` is a fixed pairwise tree of elementwise adds (``partials.tree_sum``), never
``torch.sum``, so a row's bits never depend on the other rows. Memory: a few
``[N, local_width]`` fp32 temporaries.

Role ``train`` runs the forward inside :class:`NativeLogprobFunction`, whose
backward writes ``(g * ([v == target] - p) - h * p (z - LSE + H)) / T`` into this
rank's columns from the merged LSE and entropy saved in forward, with no
collective (``p = exp(z - LSE)``; the entropy term is 0 where ``p`` is 0, so a
``-inf`` column never gives ``0 * -inf``).

A contract with a support (``docs/semantics.md``, "Processed logprobs") runs
``kernels/processed.py`` on the live ``z``: the support's threshold (sampling
parameters, ``kernels/support_threshold.py``) or the replayed mask, then the
partial over ``S`` (and the full one for ``lse``) in one all-gather and the same
merge; a replayed mask without the full ``lse`` reads its kept columns alone
(``processed.replayed_forward``, bitwise the same). The backward is the same local
gradient on ``S``, zero outside it, from ``LSE_S`` and the mask saved in forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tp_logprob.comm import GroupHandle
from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.heterogeneous import by_row_groups
from tp_logprob.kernels.merge import gather_and_merge
from tp_logprob.kernels.partials import live_logits, local_grad, local_partial
from tp_logprob.kernels.processed import processed_forward, replayed_forward, separate_lse
from tp_logprob.kernels.results import differentiable_outputs, run_for_role
from tp_logprob.kernels.validation import active_mask_tensor, check_op_inputs
from tp_logprob.result import LogprobResult
from tp_logprob.support import SupportMode

__all__ = [
    "NativeLogprobFunction",
    "native_forward",
    "native_logprob",
    "torch_native_logprob",
]


@by_row_groups
def torch_native_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: GroupHandle | None = None,
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
    group: GroupHandle | None = None,
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
    apply: Callable[..., tuple[torch.Tensor, ...]] = NativeLogprobFunction.apply
    return run_for_role(
        contract,
        apply,
        native_forward,
        local_logits,
        targets,
        active,
        contract,
        group,
        output_dtype=output_dtype,
    )


class NativeLogprobFunction(torch.autograd.Function):
    """Forward: the vocab-parallel logprob. Backward: this rank's column slice only.

    ``selected_logp`` and ``entropy`` are differentiable; ``lse`` (and a processed
    op's ``support_lse``, ``support_size`` and ``support_threshold``) are not.
    Without ``export_entropy`` the entropy output is an empty placeholder.
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
        group: GroupHandle | None,
        output_dtype: torch.dtype,
    ) -> tuple[torch.Tensor, ...]:
        outputs, keep = _forward(local_logits, targets, active, contract, group)
        # The gradient's LSE: the support's (S fixed) for a processed op, else the full one.
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
        return grad, None, None, None, None, None


def native_forward(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: GroupHandle | None,
) -> tuple[torch.Tensor, ...]:
    """Partial, one all-gather, merge: ``(selected_logp, lse, entropy)`` in the compute dtype,
    followed by ``(support_lse, support_size, support_threshold)`` for a processed op.

    ``entropy`` is an empty tensor unless the contract exports it.
    """
    return _forward(local_logits, targets, active, contract, group)[0]


def _forward(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: GroupHandle | None,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
    """The outputs and, for a processed op, this rank's support mask (None: every column)."""
    if contract.support is None:
        partial = local_partial(local_logits, targets, contract)
        return gather_and_merge(partial, targets, active, contract, group), None
    if contract.support_mode is SupportMode.REPLAYED_MASK and not separate_lse(contract):
        return replayed_forward(local_logits, targets, active, contract, group)
    z = live_logits(local_logits, contract)
    return processed_forward(z, targets, active, contract, group)
