"""How a torch-built op turns its forward's outputs into a :class:`LogprobResult`.

torch_native, torch_native_fused and the planted-bug backends rebuilt from them
end the same way: role ``train`` runs the forward inside an autograd Function,
role ``infer`` without grad; the outputs are cast to the contract's output dtype,
``lse`` is never differentiable (nor the empty entropy placeholder), and ``lse``
and ``entropy`` are returned only where the contract exports them. Written once,
so a backend and its rebuilds cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tp_logprob.contract import LogprobContract, LogprobResult, LogprobRole
from tp_logprob.kernels.dtypes import TORCH_DTYPES

__all__ = ["Outputs", "differentiable_outputs", "exported_result", "run_for_role"]

Outputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""``(selected_logp, lse, entropy)``; ``entropy`` is empty unless the contract exports it."""


def run_for_role(
    contract: LogprobContract,
    train: Callable[..., Outputs],
    infer: Callable[..., Outputs],
    *inputs: Any,
    output_dtype: torch.dtype | None = None,
) -> LogprobResult:
    """``train(*inputs, output_dtype)`` for role ``train`` (an autograd Function's
    ``apply``), else ``infer(*inputs)`` under ``no_grad`` cast to ``output_dtype``
    (default: the contract's output dtype); ``lse`` and ``entropy`` as exported."""
    if output_dtype is None:
        output_dtype = TORCH_DTYPES[contract.output.dtype]
    if contract.role is LogprobRole.TRAIN:
        selected, lse, entropy = train(*inputs, output_dtype)
    else:
        with torch.no_grad():
            outputs = infer(*inputs)
            selected, lse, entropy = (t.to(output_dtype) for t in outputs)
    return exported_result(contract, selected, lse, entropy)


def exported_result(
    contract: LogprobContract,
    selected: torch.Tensor,
    lse: torch.Tensor | None,
    entropy: torch.Tensor | None,
) -> LogprobResult:
    """The result with ``lse`` and ``entropy`` only where the contract exports them."""
    return LogprobResult(
        selected,
        lse if contract.export_lse else None,
        entropy if contract.export_entropy else None,
    )


def differentiable_outputs(
    ctx: Any,
    contract: LogprobContract,
    output_dtype: torch.dtype,
    selected: torch.Tensor,
    lse: torch.Tensor,
    entropy: torch.Tensor,
) -> Outputs:
    """In an autograd Function's forward: the outputs in ``output_dtype``, with ``lse``
    (and, without ``export_entropy``, the empty entropy placeholder) marked
    non-differentiable."""
    lse_out, entropy_out = lse.to(output_dtype), entropy.to(output_dtype)
    # One call: each call replaces the set of non-differentiable outputs.
    frozen = (lse_out,) if contract.export_entropy else (lse_out, entropy_out)
    ctx.mark_non_differentiable(*frozen)
    return selected.to(output_dtype), lse_out, entropy_out
