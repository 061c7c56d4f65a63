"""Wide vocabularies with the block structure that production kernels' bugs need.

Production kernels tile the vocabulary in blocks of 2^12 to 2^16 columns, so
their multi-block paths (rescaling between blocks, a block with no finite
value, the last partial block) need rows far wider than the suite's usual
shapes, and rows whose structure is aligned to powers of two. :func:`wide_cases`
draws such cases: vocabularies of up to ``2^18`` columns (log-uniform), padding
that spans a block boundary, shard bounds that cut blocks, and rows of
:data:`WIDE_ROW_KINDS`. Bulk values come from a seeded numpy generator, so a
2^18-column row costs microseconds to draw and shrinks by its parameters.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import numpy.typing as npt
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from tp_logprob.capability import LogprobBackendCapability
from tp_logprob.contract import (
    DeterminismScope,
    LogprobContract,
    LogprobDType,
    LogprobInputKind,
    LogprobRole,
    MaskMode,
    MaskSpec,
    ReductionSpec,
    ShardingSpec,
    SupportMode,
    even_shard_bounds,
)
from tp_logprob.errors import LogprobContractError
from tp_logprob.strategies.cases import LogprobCase
from tp_logprob.strategies.logits import DTYPE_MAX, round_to_dtype

__all__ = ["WIDE_ROW_KINDS", "block_cut_bounds", "wide_cases"]

WIDE_ROW_KINDS = (
    "random",
    "neg_inf_leading_blocks",
    "neg_inf_trailing_blocks",
    "constant_blocks",
    "lone_finite",
    "extreme_block",
    "max_in_last_partial_block",
)
"""``neg_inf_*_blocks``: whole leading / trailing blocks of ``2^k`` live columns are
``-inf``; ``constant_blocks``: each block one value; ``lone_finite``: one finite
column, far from the others (all ``-inf``); ``extreme_block``: one block of
magnitudes near the dtype's maximum amid ordinary values;
``max_in_last_partial_block``: the row maximum in the last, partial block."""

_NEG_INF = -np.inf


def _row(
    kind: str, width: int, block: int, seed: int, dtype: LogprobDType
) -> npt.NDArray[np.float64]:
    rng = np.random.default_rng(seed)
    row = rng.normal(0.0, 4.0, width)
    blocks = -(-width // block)
    if kind == "neg_inf_leading_blocks":
        row[: block * rng.integers(1, max(2, blocks))] = _NEG_INF
    elif kind == "neg_inf_trailing_blocks":
        cut = width - block * int(rng.integers(1, max(2, blocks)))
        row[max(cut, 1) :] = _NEG_INF
    elif kind == "constant_blocks":
        values = rng.normal(0.0, 8.0, blocks)
        row = np.repeat(values, block)[:width]
    elif kind == "lone_finite":
        row[:] = _NEG_INF
        row[int(rng.integers(0, width))] = rng.normal(0.0, 4.0)
    elif kind == "extreme_block":
        start = block * int(rng.integers(0, blocks))
        top = DTYPE_MAX[dtype] * 0.5
        row[start : start + block] = rng.uniform(-top, top, min(block, width - start))
    elif kind == "max_in_last_partial_block":
        last = block * (blocks - 1)
        row[last + int(rng.integers(0, width - last))] = 60.0
    return row


def block_cut_bounds(
    draw: Any, padded: int, block: int, world: int, *, uneven: bool
) -> tuple[int, tuple[tuple[int, int], ...]]:
    """``(padded, bounds)``: ``world`` shards of ``padded`` columns cut inside blocks.

    The cuts are a multiple of ``block`` plus an offset in ``[-3, 3]``, so shards end
    inside a block (at least 4 blocks are needed for ``world <= 4``; for a capability
    that serves only more ranks than there are blocks, the cuts fall inside blocks of
    ``padded // world`` columns instead). With ``uneven`` False the shards are equal
    instead, and ``padded`` is trimmed to a multiple of ``world``.
    """
    if not uneven:
        padded -= padded % world
        return padded, even_shard_bounds(padded, world)
    if padded // block - 1 < world - 1:
        block = padded // world
    chosen = draw(
        st.lists(
            st.integers(1, padded // block - 1),
            min_size=world - 1,
            max_size=world - 1,
            unique=True,
        ),
        label="cut blocks",
    )
    offsets = draw(st.lists(st.integers(-3, 3), min_size=world - 1, max_size=world - 1))
    edges = [0, *sorted(block * c + o for c, o in zip(chosen, offsets, strict=True)), padded]
    return padded, tuple(itertools.pairwise(edges))


@st.composite
def _cases(
    draw: Any,
    capability: LogprobBackendCapability,
    max_vocab: int,
    max_rows: int,
) -> LogprobCase:
    exponent = draw(st.integers(10, max(10, max_vocab.bit_length() - 1)), label="log2 vocabulary")
    block = 1 << draw(st.integers(4, min(exponent - 2, 16)), label="log2 block")
    padded = min(max_vocab, (1 << exponent) + draw(st.integers(0, block - 1), label="extra"))
    served_worlds = capability.served_values("tp_world_size")
    worlds = sorted({1, 2, 3, 4} if served_worlds is None else served_worlds)
    world = draw(st.sampled_from([w for w in worlds if w <= 4] or worlds[:1]), label="tp")
    pad = 0
    if capability.serves("vocab_padding", True):
        # Padding that spans a block boundary: real ends before it, padded after it.
        boundary = (padded // block) * block
        if 0 < boundary < padded and draw(st.booleans(), label="padding across a block edge"):
            pad = padded - boundary + draw(st.integers(1, block // 2), label="live cut")
    real = padded - pad
    padded, bounds = block_cut_bounds(
        draw, padded, block, world, uneven=capability.serves("even_layout", False)
    )
    real = min(real, padded)
    rows = draw(st.integers(1, max_rows), label="rows")
    dtypes = sorted(capability.served_values("dtype") or (), key=lambda d: d.value)
    dtype = draw(st.sampled_from(dtypes), label="dtype")
    role = LogprobRole.INFER if capability.serves("role", LogprobRole.INFER) else LogprobRole.TRAIN
    scope = DeterminismScope.FIXED_TOPOLOGY
    if not capability.serves("determinism_scope", scope):
        scope = DeterminismScope.RUN_TO_RUN  # what every backend serves
    # Every token is active: a backend that skips ignore_index targets gets no mask, others
    # an explicit one; both need only mask mode ignore_index, which every backend serves.
    mode = MaskMode.IGNORE_INDEX
    try:
        contract = LogprobContract(
            role=role,
            dtype=dtype,
            mask=MaskSpec(rows, None if mode in capability.mask_modes else np.ones(rows, bool)),
            sharding=ShardingSpec(0, len(bounds), bounds, max(real, 1), padded),
            reduction=ReductionSpec(scope),
            export_lse=capability.serves("export_lse", True),
            export_entropy=capability.serves("export_entropy", True),
        )
    except LogprobContractError as error:
        raise InvalidArgument(f"wide_cases: no valid contract: {error}") from None
    kinds = [draw(st.sampled_from(WIDE_ROW_KINDS), label=f"row {r} kind") for r in range(rows)]
    seed = draw(st.integers(0, 2**32 - 1), label="bulk seed")
    wide = np.stack([_row(kind, padded, block, seed + r, dtype) for r, kind in enumerate(kinds)])
    wide[:, real:] = np.random.default_rng(seed).normal(0.0, 1e3, (rows, padded - real))
    logits = round_to_dtype(wide, dtype)
    targets = np.array(
        [_target(logits[r, : contract.sharding.real_vocab_size], seed + r) for r in range(rows)]
    )
    return LogprobCase(contract, logits, targets)


def _target(row: npt.NDArray[np.float32], seed: int) -> int:
    """The row's maximum, or a random live column: both aim at real bugs."""
    rng = np.random.default_rng(seed)
    if rng.random() < 0.5 and np.isfinite(row).any():
        return int(np.nanargmax(np.where(np.isfinite(row), row, -np.inf)))
    return int(rng.integers(0, row.size))


def wide_cases(
    capability: LogprobBackendCapability, *, max_vocab: int = 1 << 18, max_rows: int = 3
) -> st.SearchStrategy[LogprobCase]:
    """Cases ``capability`` claims with ``2^10`` to ``max_vocab`` columns and block structure.

    Example::

        @given(wide_cases(MY_CAPABILITY, max_vocab=1 << 16))
        def test_wide(case): ...
    """
    if not isinstance(capability, LogprobBackendCapability):
        raise InvalidArgument(f"capability={capability!r}: expected a LogprobBackendCapability")
    if max_vocab < 1 << 10:
        raise InvalidArgument(f"max_vocab={max_vocab!r}: must be >= 1024")
    for dimension, value in (
        ("input_kind", LogprobInputKind.LOGITS),
        ("cp_world_size", 1),
        ("support_mode", SupportMode.FULL),
    ):
        if not capability.serves(dimension, value):
            raise InvalidArgument(
                f"capability={capability.backend_id!r}: serves no "
                f"{dimension}={getattr(value, 'value', value)!r} "
                "contract, and every wide case has one"
            )
    return _cases(capability, max_vocab, max_rows)
