"""Exact, order-free sums of terms in ``[0, 1]``: int64 fixed point with ``K`` fraction bits.

``docs/semantics.md``, "Determinism scopes": each term ``e`` becomes
``floor(e 2^K)``, an int64, with ``K = 62 - ceil(log2(padded_vocab_size))`` so
that a whole row of the vocabulary sums to at most ``2^62``. Integer sums are
exact and associative, so a row's total is the same integer for every shard
layout and summation order. ``triton_exact_sum`` sums a row's ``exp(z - M)`` this
way; the support threshold (``kernels/support_threshold.py``) sums top-p masses.
"""

from __future__ import annotations

import torch

from tp_logprob.accumulation import fraction_bits

__all__ = ["fixed_point_terms", "fraction_bits"]


def fixed_point_terms(values: torch.Tensor, bits: int) -> torch.Tensor:
    """``floor(values 2^bits)`` as int64, for ``values`` in ``[0, 1]`` (fp32 or float64).

    The scaling by a power of two is exact in the values' own dtype (no overflow below
    ``2^62``, and a subnormal scaled up stays exact), so the floor is the only rounding,
    and an integral float below ``2^62`` converts to int64 exactly.
    """
    return torch.floor(values * float(2**bits)).to(torch.int64)
