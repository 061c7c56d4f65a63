"""How a torch-built op turns its forward's outputs into a :class:`LogprobResult`.

torch_native, torch_native_fused and the planted-bug backends rebuilt from them
end the same way: role ``train`` runs the forward inside an autograd Function,
role ``infer`` without grad; the outputs are cast to the contract's output dtype,
``lse`` is never differentiable (nor the empty entropy placeholder), and ``lse``
and ``entropy`` are returned only where the contract exports them. Written once,
so a backend and its rebuilds cannot drift apart.

A processed op (a contract with a support) returns three more outputs:
``support_lse`` (cast like ``lse``), int64 ``support_size`` and
``support_threshold`` (left in the compute dtype: the support is every live
column with ``z >= threshold``, and a rounded threshold would change it); none of
them is differentiable, and the threshold is None for a replayed mask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, overload

import torch

from tp_logprob.contract import LogprobContract, LogprobRole
from tp_logprob.kernels.dtypes import TORCH_DTYPES
from tp_logprob.result import LogprobResult
from tp_logprob.support import SupportMode

__all__ = [
    "Outputs",
    "ProcessedOutputs",
    "cast_outputs",
    "differentiable_outputs",
    "exported_result",
    "run_for_role",
]

Outputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""``(selected_logp, lse, entropy)``; ``entropy`` is empty unless the contract exports it."""

ProcessedOutputs = tuple[
    torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor
]
"""``Outputs`` followed by ``(support_lse, support_size, support_threshold)``; the threshold
is empty for a replayed mask."""


def run_for_role(
    contract: LogprobContract,
    train: Callable[..., Sequence[torch.Tensor]],
    infer: Callable[..., Sequence[torch.Tensor]],
    *inputs: Any,
    output_dtype: torch.dtype | None = None,
) -> LogprobResult:
    """``train(*inputs, output_dtype)`` for role ``train`` (an autograd Function's
    ``apply``), else ``infer(*inputs)`` under ``no_grad`` cast to ``output_dtype``
    (default: the contract's output dtype); ``lse`` and ``entropy`` as exported.
    Both return :data:`Outputs`, or :data:`ProcessedOutputs` for a contract with a
    support."""
    if output_dtype is None:
        output_dtype = TORCH_DTYPES[contract.output.dtype]
    if contract.role is LogprobRole.TRAIN:
        outputs = tuple(train(*inputs, output_dtype))
    else:
        with torch.no_grad():
            outputs = cast_outputs(tuple(infer(*inputs)), output_dtype)
    return exported_result(contract, *outputs)


def cast_outputs(outputs: tuple[torch.Tensor, ...], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """``selected_logp``, ``lse``, ``entropy`` and ``support_lse`` in ``dtype``;
    ``support_size`` and ``support_threshold`` as they are."""
    return (*(t.to(dtype) for t in outputs[:4]), *outputs[4:])


def exported_result(
    contract: LogprobContract,
    selected: torch.Tensor,
    lse: torch.Tensor | None,
    entropy: torch.Tensor | None,
    support_lse: torch.Tensor | None = None,
    support_size: torch.Tensor | None = None,
    support_threshold: torch.Tensor | None = None,
) -> LogprobResult:
    """The result with ``lse`` and ``entropy`` only where the contract exports them, and
    the support's outputs for a contract with a support (no threshold for a replayed
    mask)."""
    if contract.support_mode is SupportMode.REPLAYED_MASK:
        support_threshold = None
    return LogprobResult(
        selected,
        lse if contract.export_lse else None,
        entropy if contract.export_entropy else None,
        support_lse=support_lse,
        support_size=support_size,
        support_threshold=support_threshold,
    )


@overload
def differentiable_outputs(
    ctx: Any,
    contract: LogprobContract,
    output_dtype: torch.dtype,
    selected: torch.Tensor,
    lse: torch.Tensor,
    entropy: torch.Tensor,
) -> Outputs: ...


@overload
def differentiable_outputs(
    ctx: Any,
    contract: LogprobContract,
    output_dtype: torch.dtype,
    selected: torch.Tensor,
    lse: torch.Tensor,
    entropy: torch.Tensor,
    *support: torch.Tensor,
) -> tuple[torch.Tensor, ...]: ...


def differentiable_outputs(
    ctx: Any,
    contract: LogprobContract,
    output_dtype: torch.dtype,
    selected: torch.Tensor,
    lse: torch.Tensor,
    entropy: torch.Tensor,
    *support: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """In an autograd Function's forward: the outputs in ``output_dtype`` (``support``:
    ``support_lse``, ``support_size``, ``support_threshold``, cast as
    :func:`cast_outputs` does), with ``lse``, the support's outputs (and, without
    ``export_entropy``, the empty entropy placeholder) marked non-differentiable."""
    outputs = cast_outputs((selected, lse, entropy, *support), output_dtype)
    frozen = [outputs[1], *outputs[3:]]
    if not contract.export_entropy:
        frozen.append(outputs[2])
    # One call: each call replaces the set of non-differentiable outputs.
    ctx.mark_non_differentiable(*frozen)
    return outputs
