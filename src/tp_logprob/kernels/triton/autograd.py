"""The op front shared by the Triton backends, and their autograd Function.

``run_op`` checks the inputs (``check_op_inputs``), prepares them once, and runs
a backend's forward. For the ``train`` role with logits that require grad it goes
through :class:`TritonLogprobFunction`, whose backward launches
``logprob_grad_kernel`` from the merged fp32 LSE (and entropy) saved by the
forward: no extra collective. ``selected_logp`` and ``entropy`` are
differentiable; ``lse`` is not. With a support the forward's LSE and entropy are
over ``S`` and the backward kernel gets ``S`` too (the threshold, or the packed
mask): the gradient of ``z_y - LSE_S`` with ``S`` fixed, 0 outside it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton

from tp_logprob.comm import GroupHandle
from tp_logprob.contract import LogprobContract, LogprobRole
from tp_logprob.kernels.results import exported_result
from tp_logprob.kernels.triton.backward_kernels import logprob_grad_kernel
from tp_logprob.kernels.triton.inputs import Outputs, RankInputs, prepare
from tp_logprob.kernels.triton.launch import KernelKind, launch, launch_config, platform_of
from tp_logprob.kernels.triton.support_inputs import KernelSupport, full_support
from tp_logprob.kernels.validation import check_op_inputs
from tp_logprob.result import LogprobResult

__all__ = ["ForwardFn", "TritonLogprobFunction", "launch_logprob_grad", "logprob_grad", "run_op"]

ForwardFn = Callable[[RankInputs, LogprobContract, Any], Outputs]
"""A backend's forward: ``(inputs, contract, group) -> Outputs``."""


def run_op(
    forward: ForwardFn,
    local_logits: Any,
    targets: Any,
    contract: Any,
    group: GroupHandle | None,
    *,
    portable: bool = False,
) -> LogprobResult:
    """Check, prepare and run ``forward``, differentiably for the ``train`` role
    (``portable``: the backward with ``portable_exp``, launched without fp fusion)."""
    active = check_op_inputs(local_logits, targets, contract, group)
    inputs = prepare(local_logits, targets, active, contract)
    wants_grad = torch.is_grad_enabled() and local_logits.requires_grad
    if contract.role is LogprobRole.TRAIN and wants_grad:
        outputs = TritonLogprobFunction.apply(  # type: ignore[no-untyped-call]
            local_logits, inputs, contract, group, forward, portable
        )
        return exported_result(contract, *outputs)
    return forward(inputs, contract, group).result()


class TritonLogprobFunction(torch.autograd.Function):
    """``(local_logits, ...) -> (selected_logp, lse, entropy[, support outputs])``,
    differentiable in ``local_logits``.

    Without ``export_entropy`` the entropy output is an empty, non-differentiable
    placeholder. With a support, ``support_lse``, ``support_size`` and
    ``support_threshold`` follow (not differentiable), and the backward is the
    gradient over ``S`` with ``S`` fixed, from ``LSE_S``: exactly 0 outside ``S``.
    """

    @staticmethod
    def forward(
        ctx: Any,
        local_logits: torch.Tensor,
        inputs: RankInputs,
        contract: LogprobContract,
        group: GroupHandle | None,
        forward: ForwardFn,
        portable: bool,
    ) -> tuple[torch.Tensor, ...]:
        outputs = forward(inputs, contract, group)
        returned, entropy32, frozen = outputs.for_autograd()
        ctx.save_for_backward(
            inputs.logits, inputs.targets, inputs.active, outputs.lse32, entropy32
        )
        ctx.inputs = inputs
        ctx.entropy = contract.export_entropy
        ctx.portable = portable
        ctx.support = outputs.kernel_support()
        ctx.mark_non_differentiable(*frozen)  # one call: each call replaces the set
        return returned

    @staticmethod
    def backward(ctx: Any, grad_selected: torch.Tensor, *grads: Any) -> tuple[Any, ...]:
        logits, targets, active, lse32, entropy32 = ctx.saved_tensors
        entropy_grads = (entropy32, grads[1]) if ctx.entropy else None  # after lse's
        grad = logprob_grad(
            logits,
            targets,
            active,
            lse32,
            grad_selected,
            ctx.inputs,
            entropy_grads,
            ctx.support,
            portable=ctx.portable,
        )
        return grad, None, None, None, None, None


def logprob_grad(
    logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    lse32: torch.Tensor,
    grad_selected: torch.Tensor,
    inputs: RankInputs,
    entropy_grads: tuple[torch.Tensor, torch.Tensor | None] | None = None,
    support: KernelSupport | None = None,
    *,
    portable: bool = False,
) -> torch.Tensor:
    """The local ``d loss / d logits`` in the logits dtype (contiguous ``[N, width]``).

    ``entropy_grads`` is ``(entropy32, d loss / d entropy)`` when entropy was exported;
    ``support`` the support the forward used (None: every live column).
    """
    rows, width = logits.shape
    grad = torch.empty((rows, width), dtype=logits.dtype, device=logits.device)
    launch_logprob_grad(
        logits,
        grad,
        rows,
        inputs.live_width,
        targets,
        active,
        lse32,
        grad_selected,
        inputs,
        entropy_grads,
        support,
        portable=portable,
    )
    return grad


def launch_logprob_grad(
    logits: torch.Tensor,
    out: torch.Tensor,
    rows: int,
    live_width: int,
    targets: torch.Tensor,
    active: torch.Tensor,
    lse32: torch.Tensor,
    grad_selected: torch.Tensor,
    inputs: RankInputs,
    entropy_grads: tuple[torch.Tensor, torch.Tensor | None] | None,
    support: KernelSupport | None = None,
    begin: int = 0,
    *,
    portable: bool = False,
) -> None:
    """``logprob_grad_kernel`` over the first ``rows`` rows of ``logits`` (unit column stride),
    writing ``d loss / d logits`` into ``out`` (same shape and strides; it may be ``logits``
    itself: the kernel reads each tile before it writes the same tile).

    The logits backends' backward and ``triton_fused``'s chunked backward both launch it.
    ``entropy_grads`` is ``(entropy32, d loss / d entropy)`` when entropy was exported.
    ``support``: the forward's support (None: every live column), whose rows
    ``begin:begin + rows`` these are; the gradient is 0 outside it. ``portable``:
    ``triton_portable``'s gradient (``portable_exp``, no fp fusion).
    """
    width = logits.shape[1]
    config = launch_config(
        platform_of(logits), KernelKind.TILE, logits.dtype, fp_fusion=not portable
    )
    if entropy_grads is None or entropy_grads[1] is None:
        entropy32, grad_entropy, with_entropy = lse32, lse32, False
    else:
        entropy32, grad_entropy, with_entropy = entropy_grads[0], entropy_grads[1], True
    if support is None:
        support = full_support(logits.device)
    launch(
        logprob_grad_kernel,
        (rows, triton.cdiv(width, config.block)),
        config,
        logits,
        logits,
        logits.stride(0),
        width,
        live_width,
        inputs.col_start,
        targets,
        active,
        lse32,
        grad_selected.contiguous(),
        out,
        entropy32,
        grad_entropy.contiguous(),
        inputs.temperature[begin : begin + rows],
        *support.args(begin, begin + rows),
        SCALE=inputs.scale,
        ENTROPY=with_entropy,
        SUPPORT=support.kind,
        PORTABLE=portable,
    )
