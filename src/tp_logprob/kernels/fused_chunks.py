"""The fused LM head's row-chunk arithmetic in torch: chunk sizes, padded chunks, chunk logits.

torch_native_fused forms its logits chunk by chunk, triton_fused's backward walks
the rows in the same chunks, and the fused mutants copy those loops with one
change; they all take the chunk size and the chunk logits from here.

A chunk has :func:`chunk_rows` rows, a number that depends only on the shard's
live width (never on N), and a short last chunk is padded with zero rows
(:func:`padded_rows`), so the per-shard partial always runs on one shape. A
chunk's logits ``x = fp32(h) fp32(W_live).T (+ fp32(bias))`` are one matrix-vector
product per row with exact products and a float64 sum rounded once to fp32
(:func:`logits_chunk`), so a row's ``x`` depends on that row alone and on no
precision setting of the process (``kernels/rowwise.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.rowwise import rowwise_matmul
from tp_logprob.kernels.shards import live_width

__all__ = [
    "CHUNK_ELEMENTS",
    "MAX_CHUNK_ROWS",
    "chunk_rows",
    "live_params",
    "logits_chunk",
    "padded_rows",
    "row_chunks",
    "shared_chunk_rows",
]

CHUNK_ELEMENTS = 1 << 22
"""Most fp32 elements in one logits chunk (16 MiB): ``chunk_rows * live_width`` stays below."""

MAX_CHUNK_ROWS = 128
"""Most rows in one chunk; every chunk is padded to ``chunk_rows``, so small N stays cheap."""


def chunk_rows(contract: LogprobContract) -> int:
    """Rows per chunk: ``CHUNK_ELEMENTS // live_width`` within ``[1, MAX_CHUNK_ROWS]``.

    It depends on the shard only, never on N, so a row's partial is computed on one
    shape whatever the batch.
    """
    return max(1, min(MAX_CHUNK_ROWS, CHUNK_ELEMENTS // max(live_width(contract), 1)))


def shared_chunk_rows(contract: LogprobContract) -> int:
    """:func:`chunk_rows` of the group's widest live shard: the same on every rank.

    A loop that runs collectives per chunk (a recomputed sampling support) needs every
    rank to walk the same chunks; this size still bounds each rank's chunk by
    ``CHUNK_ELEMENTS``, since no rank is wider.
    """
    sharding = contract.sharding
    widest = max(
        end - start
        for start, end in (sharding.live_bounds(r) for r in range(sharding.tp_world_size))
    )
    return max(1, min(MAX_CHUNK_ROWS, CHUNK_ELEMENTS // max(widest, 1)))


def row_chunks(
    rows: int, contract: LogprobContract, *, step: int | None = None
) -> Iterator[tuple[int, int]]:
    """``(begin, end)`` of each chunk of ``rows`` rows, in order; the last may be short.

    Chunks have ``step`` rows (default :func:`chunk_rows`)."""
    step = chunk_rows(contract) if step is None else step
    for begin in range(0, rows, step):
        yield begin, min(begin + step, rows)


def padded_rows(values: torch.Tensor, begin: int, end: int, size: int) -> torch.Tensor:
    """``values[begin:end]`` padded with zero rows to ``size`` rows (a fixed matmul shape)."""
    chunk = values[begin:end]
    if end - begin == size:
        return chunk
    pad = chunk.new_zeros((size - (end - begin), *chunk.shape[1:]))
    return torch.cat([chunk, pad])


def live_params(
    weight: torch.Tensor, bias: torch.Tensor | None, width: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 copies of the live weight rows and bias entries (the first ``width``)."""
    weight32 = weight[:width].to(torch.float32)
    return weight32, None if bias is None else bias[:width].to(torch.float32)


def logits_chunk(
    hidden32: torch.Tensor, weight32: torch.Tensor, bias32: torch.Tensor | None
) -> torch.Tensor:
    """``hidden32 @ weight32.T (+ bias32)`` in fp32, each row's bits from its own row alone.

    One matrix-vector product per row (:func:`~tp_logprob.kernels.rowwise.rowwise_matmul`):
    a BLAS matrix product gives a row other bits at another position in the batch.
    """
    logits = rowwise_matmul(hidden32, weight32)
    return logits if bias32 is None else logits + bias32
