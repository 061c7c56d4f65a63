"""Radix selection over the bits of floats, vocab-parallel: the k-th largest, or top-p's boundary.

A float's bits, read as an integer with the negative floats' magnitude bits
flipped, order the floats (:func:`float_keys`; ``-0.0`` is taken as ``+0.0``).
A radix select decides a row's key 8 bits at a time from the top: each rank
counts (and, for top-p, weighs) its candidates per value of the next digit among
those whose higher digits match the ones chosen so far, one ``group.all_gather``
sums the ranks' ``[N, 256]`` int64 histograms exactly, and every rank picks the
same bucket. fp32 keys fill the top 32 bits of an int64, so they take 4 passes
(float64, the gradcheck path, 8).

Digits of 8 bits: each pass gathers 2 KiB per row and rank (4 KiB with top-p's
masses), below a realistic shard's row of logits; 16-bit digits would halve the
passes but gather 512 KiB per row, 4-bit ones double the latency-bound
collectives and the passes over the keys. Each pass reads the rank's ``[N, w]``
keys once and scatter-adds into ``[N, 256]``: integer sums, exact in any order,
so the selected key is the same for every shard layout and batch composition.

``kernels/support_threshold.py`` uses it where its candidate selections do not
reach: top-k with ``k`` above ``CANDIDATES``, and top-p whose boundary lies past
what a rank's candidates cover.
"""

from __future__ import annotations

import torch

from tp_logprob.comm import GroupHandle
from tp_logprob.errors import LogprobContractError
from tp_logprob.kernels.merge import gather

__all__ = [
    "BUCKETS",
    "DIGIT_BITS",
    "float_keys",
    "key_passes",
    "keys_to_float",
    "radix_kth",
    "radix_top_p",
]

DIGIT_BITS = 8
"""Bits of the key decided per radix pass."""

BUCKETS = 1 << DIGIT_BITS
"""Buckets per radix pass: one per value of a digit."""

_TOP_SHIFT = 64 - DIGIT_BITS
_FP32_MAGNITUDE = (1 << 31) - 1
_FP64_MAGNITUDE = (1 << 63) - 1


def float_keys(values: torch.Tensor) -> torch.Tensor:
    """int64 keys ordered as the fp32 or float64 ``values`` (NaN aside), ``-0.0`` as ``+0.0``.

    A float's bits read as a signed integer order the non-negative floats; the
    negative ones order backwards, so their magnitude bits are flipped. fp32 keys
    fill the top 32 bits, so both widths share the digits of :func:`key_passes`.
    """
    values = torch.where(values == 0.0, 0.0, values)
    if values.dtype == torch.float32:
        bits = values.view(torch.int32).to(torch.int64)
        return torch.where(bits < 0, bits ^ _FP32_MAGNITUDE, bits) * (1 << 32)
    if values.dtype == torch.float64:
        bits = values.view(torch.int64)
        return torch.where(bits < 0, bits ^ _FP64_MAGNITUDE, bits)
    raise LogprobContractError(f"values.dtype={values.dtype}: expected float32 or float64")


def keys_to_float(keys: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The floats of ``dtype`` (fp32 or float64) whose :func:`float_keys` are ``keys``."""
    if dtype == torch.float32:
        high = keys >> 32
        bits = torch.where(high < 0, high ^ _FP32_MAGNITUDE, high)
        return bits.to(torch.int32).view(torch.float32)
    return torch.where(keys < 0, keys ^ _FP64_MAGNITUDE, keys).view(torch.float64)


def key_passes(dtype: torch.dtype) -> tuple[int, ...]:
    """The bit shift of each radix digit, top digit first: 4 for fp32, 8 for float64."""
    low = 32 if dtype == torch.float32 else 0
    return tuple(range(_TOP_SHIFT, low - 1, -DIGIT_BITS))


def _gathered_sum(local: torch.Tensor, group: GroupHandle | None) -> torch.Tensor:
    """The integer ``local`` summed over the ranks (exact, so in any order)."""
    return torch.stack(gather(local.to(torch.int64), group)).sum(dim=0)


def _digits(keys: torch.Tensor, shift: int) -> torch.Tensor:
    """The 8-bit digit of every key at ``shift``, the top digit biased so that it sorts."""
    if shift == _TOP_SHIFT:
        return (keys >> shift) + (BUCKETS >> 1)
    return (keys >> shift) & (BUCKETS - 1)


def _with_digit(prefix: torch.Tensor, bucket: torch.Tensor, shift: int) -> torch.Tensor:
    """``prefix`` with the digit at ``shift`` set to ``bucket`` (its lower bits are 0)."""
    if shift == _TOP_SHIFT:
        bucket = bucket - (BUCKETS >> 1)  # the signed top byte: -2^63 <= prefix < 2^63
    return prefix + bucket * (1 << shift)


def _histogram(slots: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """``[N, BUCKETS]`` int64 sums of ``weights`` (default 1) per slot; slot ``BUCKETS``
    collects what lies outside the range and is dropped. Integer sums: exact, any order."""
    if weights is None:
        weights = torch.ones((), dtype=torch.int64, device=slots.device).expand_as(slots)
    sums = torch.zeros((slots.shape[0], BUCKETS + 1), dtype=torch.int64, device=slots.device)
    return sums.scatter_add_(1, slots, weights)[:, :BUCKETS]


def _descending(histogram: torch.Tensor) -> torch.Tensor:
    """``out[..., d] = sum of histogram[..., d:]``: the weight at bucket ``d`` or above."""
    return histogram.flip(-1).cumsum(-1).flip(-1)


def _pick(values: torch.Tensor, bucket: torch.Tensor) -> torch.Tensor:
    return values.gather(-1, bucket.unsqueeze(-1)).squeeze(-1)


def radix_kth(
    keys: torch.Tensor,
    survivors: torch.Tensor,
    top_k: int,
    passes: tuple[int, ...],
    group: GroupHandle | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the key of the k-th largest survivor over every rank (with multiplicity;
    the least survivor when there are fewer than k) and how many survivors lie at or above
    it. ``keys`` (:func:`float_keys`) and ``survivors`` (bool) are ``[N, w]``, ``passes``
    is :func:`key_passes` of the floats' dtype; one all-gather per pass."""
    prefix = torch.zeros(keys.shape[0], dtype=torch.int64, device=keys.device)
    in_range, above, wanted, count = survivors, torch.zeros_like(prefix), prefix, prefix
    for shift in passes:
        digits = _digits(keys, shift)
        counts = _gathered_sum(_histogram(torch.where(in_range, digits, BUCKETS), None), group)
        if shift == _TOP_SHIFT:
            wanted = torch.clamp(counts.sum(dim=1), max=top_k)
        reached = _descending(counts)
        # The highest bucket whose count at or above it reaches the k-th: the buckets
        # reaching it form a prefix of the digit values.
        bucket = (reached >= wanted.unsqueeze(1)).sum(dim=1) - 1
        count = _pick(counts, bucket)
        higher = _pick(reached, bucket) - count
        wanted, above = wanted - higher, above + higher
        prefix = _with_digit(prefix, bucket, shift)
        in_range = in_range & (digits == bucket.unsqueeze(1))
    return prefix, above + count


def radix_top_p(
    keys: torch.Tensor,
    survivors: torch.Tensor,
    weights: torch.Tensor,
    top_p: float,
    passes: tuple[int, ...],
    group: GroupHandle | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the key of the smallest survivor whose strictly larger survivors weigh
    ``< top_p Z`` (``Z`` the survivors' total int64 ``weights`` over every rank, the
    comparison in float64), and how many survivors lie at or above it; one all-gather
    per pass."""
    prefix = torch.zeros(keys.shape[0], dtype=torch.int64, device=keys.device)
    above_count, above_mass = torch.zeros_like(prefix), torch.zeros_like(prefix)
    limit = torch.zeros(keys.shape[0], dtype=torch.float64, device=keys.device)
    in_range, count = survivors, prefix
    for shift in passes:
        digits = _digits(keys, shift)
        slots = torch.where(in_range, digits, BUCKETS)
        local = torch.stack([_histogram(slots, None), _histogram(slots, weights)], dim=1)
        counts, masses = _gathered_sum(local, group).unbind(dim=1)
        if shift == _TOP_SHIFT:
            limit = top_p * masses.sum(dim=1).to(torch.float64)
        reached = _descending(masses)
        # Value t is kept iff the mass strictly above it is < top_p Z; the bucket holding
        # the smallest kept value is the highest one whose mass at or above it reaches
        # top_p Z (a bucket of zero mass never first reaches it).
        crossed = (above_mass.unsqueeze(1) + reached).to(torch.float64) >= limit.unsqueeze(1)
        bucket = crossed.sum(dim=1) - 1
        count = _pick(counts, bucket)
        higher_mass = _pick(reached, bucket) - _pick(masses, bucket)
        higher_count = _pick(_descending(counts), bucket) - count
        above_mass, above_count = above_mass + higher_mass, above_count + higher_count
        prefix = _with_digit(prefix, bucket, shift)
        in_range = in_range & (digits == bucket.unsqueeze(1))
    return prefix, above_count + count
