"""The fused LM head's fp32 logits, formed by ``fused_kernels`` as the forward forms them.

``triton_fused``'s backward recomputes each chunk of rows' logits into one
``[chunk_rows, live]`` fp32 buffer (:func:`fused_logits`), and a recomputed sampling
support finds its threshold on the same chunks (``fused_support``). The tiles are
the forward's (``logits_tile`` with the launch table's ``FUSED`` config), so a
logit has the forward's bits. :func:`fused_operands` and :func:`ieee_products` are
the fused kernels' shared launch arguments and the interpreter's numpy settings.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import triton

from tp_logprob.kernels.triton.fused_kernels import fused_logits_kernel
from tp_logprob.kernels.triton.launch import (
    FUSED_DOT,
    FUSED_TILES,
    KernelKind,
    launch,
    launch_config,
    platform_of,
)

__all__ = ["fused_logits", "fused_operands", "ieee_products"]


def ieee_products() -> Any:
    """Let the interpreter's matmul form ``inf * 0 = NaN`` without a warning.

    An infinite hidden or weight element meeting a zero (its own data, or a masked
    operand) makes a NaN logit, as ``torch.matmul`` and the GPU's FMA do silently;
    the partial then reports the row as NaN (``docs/semantics.md``, "Special values").
    numpy's matmul warns about it, and the tests run with warnings as errors. Only the
    interpreter reads this.
    """
    return np.errstate(invalid="ignore")


def fused_operands(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[Any, ...]:
    """The fused kernels' leading arguments: ``hidden`` and ``W`` with their strides, the bias.

    Without a bias ``weight`` stands in for its pointer (a kernel argument must be a
    tensor); ``HAS_BIAS=False`` keeps it unread.
    """
    return (
        hidden.detach(),
        hidden.stride(0),
        hidden.stride(1),
        weight.detach(),
        weight.stride(0),
        weight.stride(1),
        weight.detach() if bias is None else bias.detach(),
    )


def fused_logits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    width: int,
    out: torch.Tensor,
) -> None:
    """The fp32 logits of ``hidden``'s rows and ``W``'s first ``width`` rows, as the forward
    forms them (same tiles, same bits), into ``out``'s first rows (row stride ``width``);
    the rest of ``out`` is zeroed."""
    count = hidden.shape[0]
    platform = platform_of(hidden)
    config = launch_config(platform, KernelKind.FUSED, hidden.dtype)
    block_m, block_k = FUSED_TILES[platform]
    out[count:].zero_()
    with ieee_products():
        launch(
            fused_logits_kernel,
            (triton.cdiv(count, block_m), triton.cdiv(width, config.block)),
            config,
            hidden,
            *fused_operands(hidden, weight, bias),
            count,
            hidden.shape[1],
            width,
            out,
            HAS_BIAS=bias is not None,
            BLOCK_M=block_m,
            BLOCK_K=block_k,
            DOT=FUSED_DOT[platform],
        )
