"""A replayed support on one rank: its bool mask per block of rows, and its packed bits (the
Triton kernels' form) hold the same columns."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import tp_logprob as tpl
from tests.helpers.native_cases import make_contract
from tp_logprob.kernels.support_mask import PACKED_BITS, ReplayedSupport


def unpacked(words: torch.Tensor, width: int) -> torch.Tensor:
    """bool ``[N, width]`` from int32 words: bit ``c % 32`` of word ``c // 32``."""
    columns = torch.arange(width)
    chosen = words[:, columns // PACKED_BITS].to(torch.int64)
    return ((chosen >> (columns % PACKED_BITS)) & 1).bool()


@pytest.mark.parametrize(
    ("real", "bounds"),
    [
        (70, ((0, 70),)),  # three words a row, the last partial
        (64, ((0, 64),)),  # two full words
        (70, ((0, 31), (31, 33), (33, 70), (70, 72))),  # every rank, the padding-only one too
    ],
)
def test_packed_bits_are_the_kept_columns(real: int, bounds: tuple[tuple[int, int], ...]) -> None:
    rng = np.random.default_rng(5)
    keep = rng.random((6, real)) < 0.4
    keep[:, [0, 31, 32, real - 1]] = True  # word edges and the last column
    keep[3] = False  # a row that keeps nothing (inactive)
    active = np.ones(6, dtype=bool)
    active[3] = False
    support = tpl.SupportSpec.from_mask(keep)
    base = make_contract(bounds, num_tokens=6, active_mask=active, real=real)
    base = dataclasses.replace(base, support=support)
    for rank in range(len(bounds)):
        replayed = ReplayedSupport(base.with_rank(rank), torch.device("cpu"))
        words = replayed.packed()
        assert words.dtype == torch.int32
        assert words.shape == (6, max(1, -(-replayed.width // PACKED_BITS)))
        assert torch.equal(unpacked(words, replayed.width), replayed.keep())
        start, end = base.with_rank(rank).sharding.live_bounds()
        assert torch.equal(replayed.keep(), torch.from_numpy(keep[:, start:end]))
