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

__all__ = [
    "PACKED_MASK",
    "THRESHOLD",
    "kept",
    "kept_tile",
    "masked_row_tiles",
    "masked_tile",
    "packed_bits",
    "row_threshold",
    "support_target",
]

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
def packed_bits(mask_rows_ptr, start, live_width, BLOCK: tl.constexpr):
    """bool ``[rows, BLOCK]``: the packed mask's bits of columns ``start`` to ``start + BLOCK``
    for each row pointer of ``mask_rows_ptr`` (``[rows, 1]``), from ``max(1, BLOCK / 32)``
    loaded words per row rather than one gathered word per column. ``start`` is a multiple
    of ``BLOCK``, and ``BLOCK`` divides 32 or 32 divides it."""
    WORDS: tl.constexpr = max(BLOCK // 32, 1)
    WIDTH: tl.constexpr = min(BLOCK, 32)
    index = (start >> 5) + tl.arange(0, WORDS)
    words = tl.load(mask_rows_ptr + index[None, :], mask=index[None, :] * 32 < live_width, other=0)
    shifts = (start & 31) + tl.arange(0, WIDTH)
    bits = (words[:, :, None] >> shifts[None, None, :]) & 1
    return tl.reshape(bits, [mask_rows_ptr.shape[0], BLOCK]) != 0


@triton.jit
def kept_tile(
    z, start, valid, tau, mask_row_ptr, live_width, SUPPORT: tl.constexpr, BLOCK: tl.constexpr
):
    """:func:`kept` of a row's tile of columns ``start`` to ``start + BLOCK`` (``z``, ``valid``:
    ``[BLOCK]``; ``tau`` the row's threshold, ``mask_row_ptr`` its first mask word)."""
    if SUPPORT == PACKED_MASK:
        row = tl.full([1, 1], 0, tl.int64) + mask_row_ptr
        return tl.reshape(packed_bits(row, start, live_width, BLOCK), [BLOCK]) & valid
    else:
        return kept(z, start + tl.arange(0, BLOCK), valid, tau, mask_row_ptr, SUPPORT)


@triton.jit
def masked_tile(
    z, start, tau, mask_row_ptr, live_width, SUPPORT: tl.constexpr, BLOCK: tl.constexpr
):
    """A row's tile ``z`` (columns ``start`` to ``start + BLOCK``, ``-inf`` past the live ones)
    with every column outside ``S`` set to ``-inf``, as padding counts; ``z`` itself with
    ``SUPPORT = 0``. A threshold drops ``z < tau`` (nothing where ``tau`` is NaN, so a
    row without a support keeps its NaN)."""
    if SUPPORT == THRESHOLD:
        return tl.where(z < tau, float("-inf"), z)
    elif SUPPORT == PACKED_MASK:
        row = tl.full([1, 1], 0, tl.int64) + mask_row_ptr
        bits = tl.reshape(packed_bits(row, start, live_width, BLOCK), [BLOCK])
        return tl.where(bits, z, float("-inf"))
    else:
        return z


@triton.jit
def masked_row_tiles(
    z, start, tau, mask_rows_ptr, live_width, SUPPORT: tl.constexpr, BLOCK: tl.constexpr
):
    """:func:`masked_tile` of a ``[rows, BLOCK]`` tile (``tau``, ``mask_rows_ptr``: ``[rows]``)."""
    if SUPPORT == THRESHOLD:
        return tl.where(z < tau[:, None], float("-inf"), z)
    elif SUPPORT == PACKED_MASK:
        bits = packed_bits(mask_rows_ptr[:, None], start, live_width, BLOCK)
        return tl.where(bits, z, float("-inf"))
    else:
        return z


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
