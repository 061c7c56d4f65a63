"""Matrix products whose row ``i`` depends on input row ``i`` alone, whatever the BLAS.

A BLAS matrix product does not promise that. Its micro-kernels treat a row by
where it sits in a register block (edge blocks, vector lanes, the alignment of
the row's first element), so a row that moves within a batch of one fixed shape
can come out one ulp apart. Measured on torch 2.13's MKL (its AVX-512 and AVX2
code paths) and numpy's OpenBLAS (Haswell kernels), from shapes as small as
``[3, 5] @ [5, 4]``; a matrix-vector call on a row *view* differs with the view's
alignment as well.

:func:`rowwise_matmul` sends every row through one identical matrix-vector call
on a fresh contiguous copy (the allocator aligns it as it aligns every other
copy), so each row meets the same code path wherever it sits in the batch. The
one premise left is the library's determinism for an identical call (cuBLAS
documents it for one GPU architecture and SM count, MKL for one code path and
alignment): the premise every run-to-run claim already rests on.

Cost: the matrix is read once per row instead of once per block of rows. On a
CPU that is cheap next to the softmax; on a GPU at LM-head sizes it makes the
product memory-bound, which is why the Triton fused backends form their logits
in their own kernels instead.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["full_fp32_matmul", "rowwise_matmul"]

_PRECISION_LOCK = threading.Lock()
_PRECISION_USERS = 0
_PRECISION_SAVED = "highest"


@contextmanager
def full_fp32_matmul() -> Iterator[None]:
    """fp32 matmuls in full fp32 (no TF32, no bf16x3) for the duration; thread safe.

    The setting is process-global, so concurrent users (ranks emulated as threads)
    share one save/restore: the first to enter saves it, the last to leave restores it.
    """
    global _PRECISION_USERS, _PRECISION_SAVED
    with _PRECISION_LOCK:
        if _PRECISION_USERS == 0:
            _PRECISION_SAVED = torch.get_float32_matmul_precision()
            torch.set_float32_matmul_precision("highest")
        _PRECISION_USERS += 1
    try:
        yield
    finally:
        with _PRECISION_LOCK:
            _PRECISION_USERS -= 1
            if _PRECISION_USERS == 0:
                torch.set_float32_matmul_precision(_PRECISION_SAVED)


def rowwise_matmul(rows: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """``rows @ matrix.T`` in full fp32, row ``i`` from one ``matrix @ copy(rows[i])`` call.

    ``rows`` is ``[n, k]`` and ``matrix`` ``[m, k]`` (any strides, e.g. a transpose);
    the result is a new ``[n, m]`` tensor. Row ``i``'s bits depend on ``rows[i]`` and
    ``matrix`` only: not on ``n``, on ``i``, or on the other rows.
    """
    out = rows.new_empty((rows.shape[0], matrix.shape[0]))
    with full_fp32_matmul():
        for index in range(rows.shape[0]):
            out[index] = torch.mv(matrix, rows[index].clone(memory_format=torch.contiguous_format))
    return out
