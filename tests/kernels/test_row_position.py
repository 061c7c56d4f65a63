"""A row's bits do not depend on where it sits in the batch: hunted on purpose.

BLAS matrix products give a row other bits at another position of a register
block (MKL's and OpenBLAS's x86 kernels do, from tiny shapes up), so these tests
place one row at every position of batches that cross several row blocks and
chunks: odd and even positions, first and last of a chunk, the last partial
chunk. Each copy's outputs and ``d hidden`` must equal those of the row run alone.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import tp_logprob as tpl
from tests.helpers.fused_cases import PADDED, REAL
from tp_logprob.kernels import fused_chunks
from tp_logprob.kernels.dtypes import TORCH_DTYPES
from tp_logprob.kernels.native_fused import torch_native_fused_logprob
from tp_logprob.kernels.rowwise import rowwise_matmul

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SIZE = 21  # odd: rows of the hidden matrix start at every alignment
ROWS = 37  # past two 16-row Triton blocks and many 4-row torch chunks, ending in a partial one


def _fused_ops() -> dict[str, Callable[..., Any]]:
    ops: dict[str, Callable[..., Any]] = {"torch_native_fused": torch_native_fused_logprob}
    try:
        from tp_logprob.kernels.triton.fused import triton_fused_logprob
        from tp_logprob.kernels.triton.fused_exact_sum import triton_fused_exact_sum_logprob
    except ImportError:  # no triton: the torch backend is still checked
        return ops
    ops["triton_fused"] = triton_fused_logprob
    ops["triton_fused_exact_sum"] = triton_fused_exact_sum_logprob
    return ops


FUSED_OPS = _fused_ops()


def _bits(values: torch.Tensor) -> np.ndarray:
    return values.detach().float().cpu().numpy().view(np.int32)


@pytest.mark.parametrize(("rows", "cols", "depth"), [(9, 4, 6), (37, 19, 5), (130, 33, 64)])
def test_rowwise_matmul_gives_every_copy_of_a_row_its_own_bits(
    rows: int, cols: int, depth: int
) -> None:
    gen = torch.Generator().manual_seed(rows)
    matrix = torch.randn(cols, depth, generator=gen)
    row = torch.randn(1, depth, generator=gen) * 4
    batch = torch.randn(rows, depth, generator=gen)
    batch[::2] = row  # every even position, next to other rows at the odd ones
    batch[rows - 1] = row  # and the very last one
    alone = _bits(rowwise_matmul(row, matrix))
    out = _bits(rowwise_matmul(batch, matrix))
    for position in [*range(0, rows, 2), rows - 1]:
        assert np.array_equal(out[position], alone[0]), position


def _contract(num_tokens: int, dtype: str) -> tpl.LogprobContract:
    return tpl.LogprobContract(
        role="train",
        dtype=dtype,
        mask=tpl.MaskSpec(num_tokens=num_tokens),
        sharding=tpl.ShardingSpec(0, 2, ((0, 9), (9, PADDED)), REAL, PADDED),
        reduction=tpl.ReductionSpec("fixed_topology"),
        input_kind="hidden",
        hidden_size=SIZE,
        has_bias=True,
        temperature=0.7,
        export_entropy=True,
    )


def _run(
    op: Callable[..., Any], hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
    targets: torch.Tensor, dtype: str,
) -> tuple[np.ndarray, ...]:  # fmt: skip
    """Outputs and ``d hidden`` (every rank's partial summed) as int32 bit patterns."""
    leaf = hidden.detach().clone().to(DEVICE).requires_grad_(True)
    contract = _contract(hidden.shape[0], dtype)
    results = tpl.run_tp_hidden(
        op, leaf, weight.to(DEVICE), targets.to(DEVICE), contract, bias=bias.to(DEVICE)
    )
    sum((r.selected_logp.float() + r.entropy.float()).sum() for r in results).backward()
    assert leaf.grad is not None
    first = results[0]
    return tuple(_bits(t) for t in (first.selected_logp, first.lse, first.entropy, leaf.grad))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("backend", list(FUSED_OPS))
def test_fused_row_bits_do_not_depend_on_its_position(
    backend: str, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One hidden row at the even positions and the last of a 37-row batch (odd
    positions hold other rows): every copy has the bits of the row run alone."""
    monkeypatch.setattr(fused_chunks, "CHUNK_ELEMENTS", 4 * REAL)  # 4-row torch chunks
    torch_dtype = TORCH_DTYPES[dtype]
    gen = torch.Generator().manual_seed(11)
    weight = torch.randn(PADDED, SIZE, generator=gen).to(torch_dtype)
    weight[REAL:] = float("nan")  # padding rows: never read
    bias = torch.randn(PADDED, generator=gen).to(torch_dtype)
    hidden = (torch.randn(ROWS, SIZE, generator=gen) * 2).to(torch_dtype)
    targets = torch.randint(0, REAL, (ROWS,), generator=gen)
    positions = [*range(0, ROWS, 2), ROWS - 1]
    hidden[positions] = hidden[0].clone()
    targets[positions] = targets[0].clone()
    op = FUSED_OPS[backend]
    alone = _run(op, hidden[:1], weight, bias, targets[:1], dtype)
    batch = _run(op, hidden, weight, bias, targets, dtype)
    for name, single, many in zip(
        ("selected_logp", "lse", "entropy", "d hidden"), alone, batch, strict=True
    ):
        moved = [p for p in positions if not np.array_equal(many[p], single[0])]
        assert not moved, f"{backend} {name}: positions {moved} differ from the row alone"
