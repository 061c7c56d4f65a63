"""A fused LM-head mutant that reads the hidden states as if they were contiguous: right on
a fresh tensor, wrong on the strided or transposed views trainers pass (see
``layout_bugs`` for the logits ones)."""

from __future__ import annotations

from typing import Any

import torch

from tests.mutants.fused_bugs import fused_mutant
from tp_logprob.kernels.native_fused import native_fused_forward


def _forward_dense_hidden(
    hidden: torch.Tensor, weight: torch.Tensor, *rest: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # BUG: hidden rows read H elements apart, one element per column.
    dense = hidden.as_strided(hidden.shape, (hidden.shape[1], 1))
    return native_fused_forward(dense, weight, *rest)


fused_dense_hidden = fused_mutant("mutant_fused_dense_hidden", forward=_forward_dense_hidden)
