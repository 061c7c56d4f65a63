"""Mutants whose bug lives past the first 64 rows or in a row's position in its batch: long
batches and the row-position property reach them (``blas_row_sums`` the batch-invariance
sweep too).

Each is torch_native's composition (``tests.mutants._compose``) with one change marked
``# BUG:``; ``fused_reach_bugs`` plants the same bugs, and two of the fused wide sweep's,
in torch_native_fused.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.mutants._compose import forward_from, mutant
from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.merge import pack_partial
from tp_logprob.kernels.native import native_forward
from tp_logprob.kernels.partials import (
    compute_dtype,
    identity_partial,
    local_grad,
    owned_target_logit,
    scaled_logits,
    shift_by_max,
)
from tp_logprob.kernels.shards import live_width

__all__ = [
    "TILE_ROWS",
    "blas_partial",
    "blas_row_sums",
    "long_batch_target_offset",
    "tiled_targets",
]

TILE_ROWS = 64
"""The row tile of the long-batch mutants: their first 64 rows are right."""

_NEG_INF = float("-inf")


def tiled_targets(targets: torch.Tensor) -> torch.Tensor:
    """The targets a kernel reads when it forgets the row tile's offset: row ``i`` gets row
    ``i % 64``'s."""
    rows = torch.arange(targets.shape[0], device=targets.device)
    return targets[rows % TILE_ROWS]


def _forward_tile_offset(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: Any,
) -> tuple[torch.Tensor, ...]:
    # BUG: the target of row i is read at i % 64, the offset within the tile, not i.
    return native_forward(local_logits, tiled_targets(targets), active, contract, group)


def _grad_tile_offset(
    local_logits: torch.Tensor, targets: torch.Tensor, *rest: Any
) -> torch.Tensor:
    return local_grad(local_logits, tiled_targets(targets), *rest)  # the same bug


def blas_partial(
    local_logits: torch.Tensor, targets: torch.Tensor, contract: LogprobContract
) -> torch.Tensor:
    """``local_partial`` with its row sums taken by a BLAS matrix-vector product."""
    dtype = compute_dtype(local_logits.dtype)
    width = live_width(contract)
    if width == 0:
        return identity_partial(
            local_logits.shape[0], dtype, local_logits.device, entropy=contract.export_entropy
        )
    live = scaled_logits(local_logits[:, :width].to(dtype), contract)
    row_max = torch.amax(live, dim=1)
    shifted = shift_by_max(live, row_max)
    terms = torch.exp(shifted)
    ones = terms.new_ones((width, 1))
    # BUG: the row sums as one matrix-vector product over the batch (BLAS gemv): its
    # micro-kernel treats a row by its position in a register block, so a row's bits
    # change with where it sits in the batch.
    sum_exp = (terms @ ones).squeeze(1)
    entropy_sum = None
    if contract.export_entropy:
        entropy_sum = (torch.where(shifted == _NEG_INF, 0.0, terms * shifted) @ ones).squeeze(1)
    target_logit = owned_target_logit(live, targets, contract)
    return pack_partial(row_max, sum_exp, target_logit, entropy_sum)


long_batch_target_offset = mutant(
    "long_batch_target_offset", forward=_forward_tile_offset, grad=_grad_tile_offset
)
blas_row_sums = mutant("blas_row_sums", forward=forward_from(partial=blas_partial))
