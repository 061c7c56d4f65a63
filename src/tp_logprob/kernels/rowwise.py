"""Matrix products in full precision whatever the process's settings, row ``i`` from row ``i``.

**Row ``i`` from input row ``i`` alone, whatever the BLAS.** A BLAS matrix product
does not promise that. Its micro-kernels treat a row by where it sits in a register
block (edge blocks, vector lanes, the alignment of the row's first element), so a
row that moves within a batch of one fixed shape can come out one ulp apart.
Measured on torch 2.13's MKL (its AVX-512 and AVX2 code paths) and numpy's OpenBLAS
(Haswell kernels), from shapes as small as ``[3, 5] @ [5, 4]``; a matrix-vector call
on a row *view* differs with the view's alignment as well. :func:`rowwise_matmul`
sends every row through one identical matrix-vector call on a fresh contiguous copy
(the allocator aligns it as it aligns every other copy), so each row meets the same
code path wherever it sits in the batch. The one premise left is the library's
determinism for an identical call (cuBLAS documents it for one GPU architecture and
SM count, MKL for one code path and alignment): the premise every run-to-run claim
already rests on.

**Full precision without a global.** torch's fp32 matmul precision is one setting of
the whole process (``torch.set_float32_matmul_precision``, or
``torch.backends.cuda.matmul.fp32_precision`` and
``torch.backends.mkldnn.matmul.fp32_precision``): not per thread and not per call.
On CUDA ``"high"`` lets cuBLAS form fp32 products in TF32; on a CPU with AVX512-BF16
``"medium"`` lets oneDNN form them in bfloat16 (measured with torch 2.13.0+cpu: a
``[64, 512] @ [512, 300]`` product and a matrix-vector product both change bits).
Setting it for the length of a call would change it for every other thread of the
user's process meanwhile, and a setting a thread makes meanwhile would reach the
call. So nothing here reads or writes it: both products run in float64, which those
settings never reach (they govern fp32 matmuls only), and round once to fp32. The
product of two fp32 values is exact in float64 (24 + 24 significand bits <= 53), and
a float64 sum of ``H`` of them rounded once to fp32 lies within the fp32 dot-product
bound of ``docs/tolerances.md`` ("Fused LM head"), closer to the exact value than an
fp32 sum in any order.

Cost: the matrix is read once per row instead of once per block of rows, and read as
float64, twice the bytes of fp32: a float64 matrix-vector product of ``[4099, 64]``
took 376 us against 175 us in fp32 (torch 2.13.0+cpu, 2 busy cores, medians of 300
calls). On a CPU that is cheap next to the softmax; on a GPU at LM-head sizes it
makes the product memory-bound, which is why the Triton fused backends form their
logits in their own kernels instead.
"""

from __future__ import annotations

import torch

__all__ = ["float64_matmul", "rowwise_matmul"]


def float64_matmul(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """``left @ right`` with exact products and a float64 sum, rounded once to fp32.

    No fp32 matmul precision setting (TF32, bf16) reaches it; row ``i``'s bits may
    depend on the other rows (it is one BLAS matrix product).
    """
    return torch.matmul(left.to(torch.float64), right.to(torch.float64)).to(torch.float32)


def rowwise_matmul(rows: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """``rows @ matrix.T`` as :func:`float64_matmul`, row ``i`` from one matrix-vector call.

    ``rows`` is ``[n, k]`` and ``matrix`` ``[m, k]`` (any strides, e.g. a transpose);
    the result is a new fp32 ``[n, m]`` tensor. Row ``i``'s bits depend on ``rows[i]``
    and ``matrix`` only: not on ``n``, on ``i``, or on the other rows.
    """
    matrix64 = matrix.to(torch.float64)
    out = rows.new_empty((rows.shape[0], matrix.shape[0]), dtype=torch.float32)
    for index in range(rows.shape[0]):
        row64 = rows[index].to(torch.float64, memory_format=torch.contiguous_format, copy=True)
        out[index] = torch.mv(matrix64, row64)
    return out
