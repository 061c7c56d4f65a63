"""``@triton.jit`` helpers that tell the kernels which columns lie in a row's support ``S``.

``docs/semantics.md``, "Processed logprobs": a column outside ``S`` counts as padding
does (``-inf``). The kernels take ``S`` one of two ways, chosen by the constexpr
``SUPPORT``:

- ``THRESHOLD``: one fp32 ``tau`` per row (``kernels/support_threshold.py`` found it);
  a column is kept iff ``not (z < tau)``, that is ``z >= tau``, and every column of a
  row whose ``tau`` is NaN (a row without a support keeps its columns, so its NaN
  reaches the outputs). The kernels compare the ``z`` they form themselves, which
  has the bits of the ``z`` the threshold was found on (``fp32(x) / fp32(T)``, one
  IEEE division either way).
- ``PACKED_MASK``: a replayed mask as int32 words, ``[N, ceil(w / 32)]`` per rank
  (``ReplayedSupport.packed``): local column ``c`` is kept iff bit ``c % 32`` of word
  ``c // 32`` of its row is set. One bit per column: 1/32 of the fp32 logits' bytes,
  1/16 of bf16 logits.

``SUPPORT = 0`` is the full vocabulary: no helper loads anything then.
"""

# triton ships no type hints, and Triton types kernel parameters itself:
# mypy: disable-error-code="untyped-decorator, no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["PACKED_MASK", "THRESHOLD", "kept", "row_threshold", "support_target"]

THRESHOLD = tl.constexpr(1)
"""``SUPPORT`` value: the support is every live column with ``z >= tau`` (per-row fp32 tau)."""

PACKED_MASK = tl.constexpr(2)
"""``SUPPORT`` value: the support is a bit-packed mask of the rank's live columns."""


@triton.jit
def row_threshold(threshold_ptr, rows, row_mask, SUPPORT: tl.constexpr):
    """The rows' ``tau`` with ``THRESHOLD`` (NaN past ``row_mask``: keep every column), else 0."""
    if SUPPORT == THRESHOLD:
        return tl.load(threshold_ptr + rows, mask=row_mask, other=float("nan"))
    else:
        return (rows * 0).to(tl.float32)


@triton.jit
def kept(z, cols, valid, tau, mask_row_ptr, SUPPORT: tl.constexpr):
    """bool: whether each column ``cols`` (local, live where ``valid``) of ``z`` is in ``S``.

    ``tau`` and ``mask_row_ptr`` (the row's first mask word) broadcast against ``z``.
    A threshold keeps ``not (z < tau)``: ``z >= tau``, and everything where ``tau`` is NaN;
    a packed mask reads the column's bit (nothing where not ``valid``). With ``SUPPORT = 0``
    every ``valid`` column is kept.
    """
    if SUPPORT == THRESHOLD:
        return ~(z < tau)
    elif SUPPORT == PACKED_MASK:
        words = tl.load(mask_row_ptr + (cols >> 5), mask=valid, other=0)
        return ((words >> (cols & 31)) & 1) != 0
    else:
        return valid


@triton.jit
def support_target(
    logit,
    targets_ptr,
    active_ptr,
    row,
    col_start,
    live_width,
    tau,
    mask_row_ptr,
    SUPPORT: tl.constexpr,
):
    """An owned target's ``z`` (``logit``) when its column is in ``S``, else ``-inf``.

    Only the owner's value is ever read by the merge; an inactive row's target is
    never loaded.
    """
    active = tl.load(active_ptr + row) != 0
    local = tl.load(targets_ptr + row, mask=active, other=-1).to(tl.int64) - col_start
    owned = active & (local >= 0) & (local < live_width)
    return tl.where(kept(logit, local, owned, tau, mask_row_ptr, SUPPORT), logit, float("-inf"))
