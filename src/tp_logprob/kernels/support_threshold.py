"""The support of sampling parameters, vocab-parallel: one threshold ``tau`` per row.

``docs/semantics.md``, "Processed logprobs": min-p, then top-k, then top-p each
keep an upper set of the tempered logits ``z``, so a row's support is
``S = {live v : z_v >= tau}``. :func:`support_threshold` finds ``tau`` and ``|S|``
from one rank's live ``z`` without gathering the vocabulary. Every collective is
one ``group.all_gather`` of a small per-row tensor that every rank folds the same
way, so the results are the same bits on every rank, for every shard layout, and
a row's result depends on that row alone (maxima and minima are exact, the
histograms are integer sums, ``exp`` is elementwise).

Steps (``M`` the row's maximum over the live columns of every rank):

1. Row statistics, one all-gather of ``[N, 4]``: each rank's max and min of ``z``
   and flags for a NaN or ``+inf`` and for a finite value. A row with a NaN or
   ``+inf``, or no finite value, has no support: ``tau`` NaN, ``|S| = 0``.
   With every rule off this is the only collective: ``tau`` is the row's minimum
   and ``|S|`` the live vocabulary.
2. min-p: each rank keeps ``exp(z - M) >= min_p`` (fp32 ``exp``, compared with the
   float64 ``min_p``) and contributes the least kept ``z``; one all-gather gives
   ``tau_1``, their minimum. The survivors are ``{z >= tau_1}``, an upper set
   closed under ties even where ``exp`` is not monotone. When min-p is the last
   rule on, one more all-gather sums the ranks' counts of ``{z >= tau_1}``.
3. top-k: the k-th largest survivor with multiplicity, by a radix select over
   keys that order the floats as integers (:func:`float_keys`): from the top
   digit down, each rank counts its survivors per bucket of the next 8-bit digit
   among those matching the digits chosen so far, the counts are all-gathered
   and summed, and every rank picks the bucket that holds the k-th.
4. top-p: the same radix select over the survivors of 1 and 2, weighing each
   by its fixed-point mass ``floor(exp(z - M) 2^K)`` (``kernels/fixed_point.py``;
   exact int64 sums). With ``Z`` the survivors' total, it finds the smallest
   value whose strictly larger survivors weigh ``< top_p Z``: one float64
   comparison of integers per bucket, the same on every rank.

The last rule's selected key is ``tau``; its histograms also count ``|S|``.
A rule that cannot change ``S`` is skipped: min-p at 0, top-p at 1, top-k at
least the live vocabulary.

Digits of 8 bits: fp32 keys take 4 passes (float64, the gradcheck path, 8), each
an all-gather of ``[N, 256]`` int64 counts (``[N, 2, 256]`` counts and masses for
top-p), 2 KiB per row, below a realistic shard's row of logits; 16-bit digits
would halve the passes but gather 512 KiB per row, 4-bit ones double the
latency-bound collectives and the passes over ``z``. Collectives for fp32, every
rule on: 1 + 1 + 4 + 4 (+ 1 for the count when min-p is the last rule on). Each
pass reads the rank's ``[N, w]`` keys once and scatter-adds into ``[N, 256]``;
memory is a few ``[N, w]`` int64 temporaries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tp_logprob.contract import LogprobContract
from tp_logprob.errors import LogprobContractError
from tp_logprob.kernels.fixed_point import fixed_point_terms, fraction_bits
from tp_logprob.kernels.merge import gather
from tp_logprob.support import SupportMode

__all__ = [
    "BUCKETS",
    "DIGIT_BITS",
    "SamplingRules",
    "float_keys",
    "key_passes",
    "keys_to_float",
    "sampling_rules",
    "support_threshold",
]

DIGIT_BITS = 8
"""Bits of the key decided per radix pass."""

BUCKETS = 1 << DIGIT_BITS
"""Buckets per radix pass: one per value of a digit."""

_TOP_SHIFT = 64 - DIGIT_BITS
_KEY_MAX = (1 << 63) - 1
_FP32_MAGNITUDE = (1 << 31) - 1
_FP64_MAGNITUDE = (1 << 63) - 1


@dataclass(frozen=True)
class SamplingRules:
    """The rules of a support that can change ``S`` (None: off), in the order applied."""

    min_p: float | None
    top_k: int | None
    top_p: float | None

    @property
    def all_off(self) -> bool:
        """True when ``S`` is every live column."""
        return (self.min_p, self.top_k, self.top_p) == (None, None, None)


def sampling_rules(contract: LogprobContract) -> SamplingRules:
    """The contract's sampling parameters, each None where it keeps every token.

    min-p at 0, top-p at 1 and top-k at least ``real_vocab_size`` are off (as in vLLM).
    """
    support = contract.support
    if support is None or support.mode is not SupportMode.SAMPLING_PARAMS:
        mode = contract.support_mode.value
        raise LogprobContractError(
            f"support_mode={mode!r}: a support threshold needs sampling parameters"
        )
    real = contract.sharding.real_vocab_size
    return SamplingRules(
        min_p=support.min_p if support.min_p else None,
        top_k=support.top_k if support.top_k is not None and support.top_k < real else None,
        top_p=support.top_p if support.top_p is not None and support.top_p < 1.0 else None,
    )


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


def support_threshold(
    z: torch.Tensor, contract: LogprobContract, group: Any = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tau, size)`` of every row from this rank's live tempered logits ``z`` (``[N, w]``).

    ``tau`` (``z``'s dtype: fp32, or float64 on the gradcheck path) is the smallest
    kept value, so the support is ``{live v : z_v >= tau}``; NaN where the row has
    no support (a NaN or ``+inf`` live value, or no finite one). ``size`` is int64
    ``|S|`` (0 there). Every rank passes its own ``z`` (``w`` may be 0) and gets the
    same bits; ``group=None`` is TP = 1. Example, on rank r::

        tau, size = support_threshold(live_logits(local_logits, contract), contract, group)
        keep = threshold_keep(z, tau)   # kernels/support_mask.py
    """
    rules = sampling_rules(contract)
    rows = z.shape[0]
    maxima, minima, defined = _row_statistics(z, group)
    real = contract.sharding.real_vocab_size
    if rules.all_off:
        tau = torch.where(minima == 0.0, 0.0, minima)
        size = torch.full((rows,), real, dtype=torch.int64, device=z.device)
        return _undefined_as_nan(tau, size, defined)
    z = torch.where(defined.unsqueeze(1), z, 0.0)  # rows without support: any valid values
    row_max = torch.where(defined, maxima, 0.0)
    keys = float_keys(z)
    mass = torch.exp(z - row_max.unsqueeze(1))  # exp(z - M) in [0, 1]
    survivors = torch.ones(keys.shape, dtype=torch.bool, device=z.device)
    passes = key_passes(z.dtype)
    tau_key = size = torch.zeros(rows, dtype=torch.int64, device=z.device)
    if rules.min_p is not None:
        kept = mass.to(torch.float64) >= rules.min_p
        tau_key = _gathered_min(torch.where(kept, keys, _KEY_MAX), group)
        survivors = keys >= tau_key.unsqueeze(1)
        if rules.top_k is None and rules.top_p is None:
            size = _gathered_sum(survivors.sum(dim=1), group)
    if rules.top_k is not None:
        tau_key, size = _select_kth(keys, survivors, rules.top_k, passes, group)
        survivors = keys >= tau_key.unsqueeze(1)
    if rules.top_p is not None:
        bits = fraction_bits(contract.sharding.padded_vocab_size)
        weights = torch.where(survivors, fixed_point_terms(mass, bits), 0)
        tau_key, size = _select_top_p(keys, survivors, weights, rules.top_p, passes, group)
    return _undefined_as_nan(keys_to_float(tau_key, z.dtype), size, defined)


def _row_statistics(z: torch.Tensor, group: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rows' max and min over every rank's live ``z``, and which rows have a support."""
    rows, width = z.shape
    if width == 0:
        local = z.new_zeros((rows, 4))
        local[:, 0], local[:, 1] = float("-inf"), float("inf")
    else:
        unusable = (torch.isnan(z) | (z == float("inf"))).any(dim=1)
        local = torch.stack(
            [
                torch.amax(z, dim=1),
                torch.amin(z, dim=1),
                unusable.to(z.dtype),
                torch.isfinite(z).any(dim=1).to(z.dtype),
            ],
            dim=1,
        )
    stacked = torch.stack(gather(local, group))  # [R, N, 4]
    defined = (stacked[..., 2].amax(dim=0) == 0.0) & (stacked[..., 3].amax(dim=0) > 0.0)
    return stacked[..., 0].amax(dim=0), stacked[..., 1].amin(dim=0), defined


def _undefined_as_nan(
    tau: torch.Tensor, size: torch.Tensor, defined: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.where(defined, tau, float("nan")), torch.where(defined, size, 0)


def _gathered_sum(local: torch.Tensor, group: Any) -> torch.Tensor:
    """The integer ``local`` summed over the ranks (exact, so in any order)."""
    return torch.stack(gather(local.to(torch.int64), group)).sum(dim=0)


def _gathered_min(local_keys: torch.Tensor, group: Any) -> torch.Tensor:
    """The least key of each row over every rank's ``[N, w]`` keys (``_KEY_MAX`` for none)."""
    rows, width = local_keys.shape
    if width == 0:
        local = torch.full((rows,), _KEY_MAX, dtype=torch.int64, device=local_keys.device)
    else:
        local = local_keys.amin(dim=1)
    return torch.stack(gather(local, group)).amin(dim=0)


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


def _in_prefix(
    keys: torch.Tensor, survivors: torch.Tensor, prefix: torch.Tensor, shift: int
) -> torch.Tensor:
    """The survivors whose digits above ``shift`` are those chosen so far."""
    if shift == _TOP_SHIFT:
        return survivors
    above = shift + DIGIT_BITS
    return survivors & ((keys >> above) == (prefix >> above).unsqueeze(1))


def _histogram(digits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``[N, BUCKETS]`` int64 sums of ``weights`` per digit value (exact, order-free)."""
    counts = torch.zeros((digits.shape[0], BUCKETS), dtype=torch.int64, device=digits.device)
    return counts.scatter_add_(1, digits, weights.to(torch.int64))


def _descending(histogram: torch.Tensor) -> torch.Tensor:
    """``out[..., d] = sum of histogram[..., d:]``: the weight at bucket ``d`` or above."""
    return histogram.flip(-1).cumsum(-1).flip(-1)


def _pick(values: torch.Tensor, bucket: torch.Tensor) -> torch.Tensor:
    return values.gather(-1, bucket.unsqueeze(-1)).squeeze(-1)


def _select_kth(
    keys: torch.Tensor,
    survivors: torch.Tensor,
    top_k: int,
    passes: tuple[int, ...],
    group: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The key of the k-th largest survivor (with multiplicity; all of them when fewer than
    k) and the count of survivors at or above it."""
    prefix = torch.zeros(keys.shape[0], dtype=torch.int64, device=keys.device)
    above = torch.zeros_like(prefix)
    wanted = prefix
    count = prefix
    for shift in passes:
        in_range = _in_prefix(keys, survivors, prefix, shift)
        counts = _gathered_sum(_histogram(_digits(keys, shift), in_range), group)
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
    return prefix, above + count


def _select_top_p(
    keys: torch.Tensor,
    survivors: torch.Tensor,
    weights: torch.Tensor,
    top_p: float,
    passes: tuple[int, ...],
    group: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The key of the smallest survivor whose strictly larger survivors weigh ``< top_p Z``
    (``Z`` the survivors' total weight), and the count of survivors at or above it."""
    prefix = torch.zeros(keys.shape[0], dtype=torch.int64, device=keys.device)
    above_count, above_mass = torch.zeros_like(prefix), torch.zeros_like(prefix)
    limit = torch.zeros(keys.shape[0], dtype=torch.float64, device=keys.device)
    count = prefix
    for shift in passes:
        in_range = _in_prefix(keys, survivors, prefix, shift)
        digits = _digits(keys, shift)
        local = torch.stack(
            [_histogram(digits, in_range), _histogram(digits, torch.where(in_range, weights, 0))],
            dim=1,
        )
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
    return prefix, above_count + count
