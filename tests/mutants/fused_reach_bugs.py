"""Fused LM-head mutants whose bug lives past the first 64 rows, past the first 128-column
tile of a shard, or in a row's position in its batch: only long batches, the fused wide
sweep and the row-position property reach them.

Each is torch_native_fused's composition (``tests.mutants.fused_bugs.fused_mutant``)
with one change marked ``# BUG:``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from tests.mutants.fused_bugs import fused_mutant
from tests.mutants.reach_bugs import blas_partial, tiled_targets
from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.fused_chunks import (
    chunk_rows,
    live_params,
    logits_chunk,
    padded_rows,
    row_chunks,
)
from tp_logprob.kernels.merge import gather_and_merge
from tp_logprob.kernels.native_fused import native_fused_backward, native_fused_forward
from tp_logprob.kernels.partials import local_partial
from tp_logprob.kernels.shards import live_width

__all__ = [
    "TILE_COLUMNS",
    "fused_bias_first_tile_only",
    "fused_blas_row_sums",
    "fused_last_partial_tile_dropped",
    "fused_long_batch_target_offset",
]

TILE_COLUMNS = 128
"""The column tile of the wide mutants: shards of up to 128 live columns are right."""

_NEG_INF = float("-inf")


def _fused_forward_tile_offset(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    *rest: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # BUG: the target of row i is read at i % 64, the offset within the tile, not i.
    return native_fused_forward(hidden, weight, bias, tiled_targets(targets), *rest)


def _fused_backward_tile_offset(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    *rest: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    return native_fused_backward(hidden, weight, bias, tiled_targets(targets), *rest)


def _first_tile_bias(bias: torch.Tensor | None) -> torch.Tensor | None:
    if bias is None:
        return None
    # BUG: the bias is loaded with the first column tile only; later tiles add nothing.
    return torch.where(torch.arange(bias.shape[0], device=bias.device) < TILE_COLUMNS, bias, 0.0)


def _fused_forward_first_tile_bias(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *rest: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return native_fused_forward(hidden, weight, _first_tile_bias(bias), *rest)


def _fused_backward_first_tile_bias(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *rest: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    d_hidden, d_weight, d_bias = native_fused_backward(
        hidden, weight, _first_tile_bias(bias), *rest
    )
    return d_hidden, d_weight, None if bias is None else d_bias


def _chunked_forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: Any,
    *,
    tile_loop: bool = False,
    blas_sums: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``native_fused_forward`` with the two bugs below as options."""
    rows, width = hidden.shape[0], live_width(contract)
    step = chunk_rows(contract)
    weight32, bias32 = live_params(weight, bias, width)
    # BUG (tile_loop): the tile loop runs width // 128 times: a last, partial tile is never
    # visited (unless it is the only one).
    visited = width if width <= TILE_COLUMNS else TILE_COLUMNS * (width // TILE_COLUMNS)
    pieces = []
    for begin, end in row_chunks(rows, contract):
        count = end - begin
        logits = hidden.new_zeros((count, 0), dtype=torch.float32)
        if width > 0:
            logits = logits_chunk(hidden[begin:end].to(torch.float32), weight32, bias32)
            if tile_loop:
                logits[:, visited:] = _NEG_INF
        if blas_sums:
            # BUG (blas_sums): the chunk's own rows, unpadded, summed by a BLAS gemv
            # (``reach_bugs.blas_partial``): the gemv's shape follows how full the chunk is.
            pieces.append(blas_partial(logits, targets[begin:end], contract))
            continue
        chunk_targets = padded_rows(targets, begin, end, step)
        padded = padded_rows(logits, 0, count, step)
        pieces.append(local_partial(padded, chunk_targets, contract)[:count])
    return gather_and_merge(torch.cat(pieces), targets, active, contract, group)


fused_long_batch_target_offset = fused_mutant(
    "mutant_fused_long_batch_target_offset",
    forward=_fused_forward_tile_offset,
    backward=_fused_backward_tile_offset,
)
fused_bias_first_tile_only = fused_mutant(
    "mutant_fused_bias_first_tile_only",
    forward=_fused_forward_first_tile_bias,
    backward=_fused_backward_first_tile_bias,
)
fused_last_partial_tile_dropped = fused_mutant(
    "mutant_fused_last_partial_tile_dropped",
    forward=functools.partial(_chunked_forward, tile_loop=True),
)
fused_blas_row_sums = fused_mutant(
    "mutant_fused_blas_row_sums", forward=functools.partial(_chunked_forward, blas_sums=True)
)
