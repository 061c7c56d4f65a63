"""Wide fused LM-head cases: shards of 2^10 to 2^14 columns, hidden sizes up to 256.

A fused kernel walks a shard's weight rows in column tiles (64 to 256 on a GPU);
the bugs that live past the first tiles (a bias or a padding mask applied in one
tile only, a loop that drops the last partial tile) need shards many tiles wide,
with the row maximum, the target and the last live column in the last, partial
tile. :func:`wide_hidden_cases` draws such cases: shard cuts at a tile multiple
plus an odd offset, padding across a tile edge, garbage in the weight's and the
bias's padding rows, temperatures and entropy where the capability claims them.

The operands are small integers (hidden and weight in [-8, 8], bias in [-64, 64]),
so every fp32 product and partial sum is exact in any order: the backend's logits
are the exact ones, and the float64 reference with its bound judges the outputs
at any width. With ``general_row`` one more row of ordinary fp32 hidden values
is added for the exact dot-product oracle.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from tp_logprob.capability import LogprobBackendCapability
from tp_logprob.contract import (
    DeterminismScope,
    LogprobContract,
    LogprobInputKind,
    LogprobRole,
    MaskSpec,
    ReductionSpec,
    ShardingSpec,
)
from tp_logprob.errors import LogprobContractError
from tp_logprob.oracle import exact_hidden_logits
from tp_logprob.strategies.fused import HiddenCase
from tp_logprob.strategies.logits import round_to_dtype
from tp_logprob.strategies.wide import block_cut_bounds

__all__ = ["INTEGER_BOUND", "wide_hidden_cases"]

INTEGER_BOUND = 8
"""Hidden and weight entries are integers in ``[-8, 8]``, the bias in ``[-64, 64]``: with
``H <= 256`` every partial sum stays below ``2^17``, exact in fp32."""

_GARBAGE = np.array([np.nan, np.inf, -np.inf, 3e38, -3e38])
_TEMPERATURES = (1.0, 0.7, 0.125, 3.0)


def _contract(
    draw: Any, capability: LogprobBackendCapability, max_vocab: int, max_hidden: int, rows: int
) -> LogprobContract:
    """A contract whose shard cuts and padding fall inside tiles of a drawn width."""
    exponent = draw(st.integers(10, max(10, max_vocab.bit_length() - 1)), label="log2 vocabulary")
    tile = 1 << draw(st.integers(4, 8), label="log2 tile")
    padded = min(max_vocab, (1 << exponent) + draw(st.integers(0, tile - 1), label="extra"))
    served_worlds = capability.served_values("tp_world_size")
    worlds = sorted({1, 2, 3, 4} if served_worlds is None else served_worlds)
    world = draw(st.sampled_from([w for w in worlds if w <= 4] or worlds[:1]), label="tp")
    real = padded
    if capability.serves("vocab_padding", True) and draw(st.booleans(), label="padding"):
        edge = (padded // tile) * tile  # the live columns end inside a tile, past its edge
        real = max(1, min(padded - 1, edge - tile + draw(st.integers(1, tile - 1))))
    padded, bounds = block_cut_bounds(
        draw, padded, tile, world, uneven=capability.serves("even_layout", False)
    )
    real = min(real, padded)
    hidden_size = draw(
        st.sampled_from([h for h in (1, 3, 16, 61, 64, 128, 256) if h <= max_hidden]),
        label="hidden size",
    )
    role = LogprobRole.INFER if capability.serves("role", LogprobRole.INFER) else LogprobRole.TRAIN
    scope = DeterminismScope.FIXED_TOPOLOGY
    if not capability.serves("determinism_scope", scope):
        scope = DeterminismScope.RUN_TO_RUN  # what every backend serves
    temperatures = [t for t in _TEMPERATURES if capability.serves("temperature", t)]
    temperature = draw(st.sampled_from(temperatures), label="temperature")
    dtypes = sorted(capability.served_values("dtype") or (), key=lambda d: d.value)
    bias = capability.serves("has_bias", True) and draw(st.booleans(), label="bias")
    try:
        contract = LogprobContract(
            role=role,
            dtype=draw(st.sampled_from(dtypes), label="dtype"),
            mask=MaskSpec(rows),
            sharding=ShardingSpec(0, len(bounds), bounds, real, padded),
            reduction=ReductionSpec(scope),
            export_lse=capability.serves("export_lse", True),
            export_entropy=capability.serves("export_entropy", True),
            temperature=temperature,
            input_kind=LogprobInputKind.HIDDEN,
            hidden_size=hidden_size,
            has_bias=bias,
        )
    except LogprobContractError as error:
        raise InvalidArgument(f"wide_hidden_cases: no valid contract: {error}") from None
    reasons = capability.incompatibilities(contract)
    if reasons:
        raise InvalidArgument(f"wide_hidden_cases: {capability.backend_id} refuses: {reasons}")
    return contract


def _last_live_columns(contract: LogprobContract) -> list[int]:
    """The last live column of every shard that has one: the end of its last partial tile."""
    sharding = contract.sharding
    ends = []
    for rank in range(sharding.tp_world_size):
        start, end = sharding.live_bounds(rank)
        if end > start:
            ends.append(end - 1)
    return ends


@st.composite
def _cases(
    draw: Any,
    capability: LogprobBackendCapability,
    max_vocab: int,
    max_hidden: int,
    max_rows: int,
    general_row: bool,
) -> HiddenCase:
    integer_rows = draw(st.integers(1, max_rows), label="integer rows")
    extra = int(general_row and draw(st.booleans(), label="a row of general operands"))
    contract = _contract(draw, capability, max_vocab, max_hidden, integer_rows + extra)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="bulk seed"))
    size = contract.hidden_size or 1
    real, padded = contract.sharding.real_vocab_size, contract.sharding.padded_vocab_size
    bound = INTEGER_BOUND
    hidden = rng.integers(-bound, bound + 1, (integer_rows + extra, size)).astype(np.float64)
    if extra:
        hidden[-1] = rng.standard_normal(size)
    weight = rng.integers(-bound, bound + 1, (padded, size)).astype(np.float64)
    weight[real:] = rng.choice(_GARBAGE, (padded - real, size))
    bias = None
    if contract.has_bias:
        bias = rng.integers(-8 * bound, 8 * bound + 1, padded).astype(np.float64)
        bias[real:] = rng.choice(_GARBAGE, padded - real)
    # Each integer row's maximum sits at the end of some shard's last, partial tile.
    ends = _last_live_columns(contract)
    peaks = [ends[int(rng.integers(len(ends)))] for _ in range(integer_rows)]
    for row, column in enumerate(peaks):
        weight[column] = bound * np.sign(hidden[row])
        if bias is not None:
            bias[column] = 8 * bound
    with np.errstate(over="ignore"):  # garbage padding rows may overflow the dtype: inf
        hidden32, weight32 = (round_to_dtype(a, contract.dtype) for a in (hidden, weight))
        bias32 = None if bias is None else round_to_dtype(bias, contract.dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        exact = hidden32.astype(np.float64) @ weight32.astype(np.float64).T
        if bias32 is not None:
            exact = exact + bias32
    if extra:
        exact[-1:, :real] = exact_hidden_logits(
            hidden32[-1:], weight32[:real], None if bias32 is None else bias32[:real]
        )
    # The target: the row's maximum, the last live column, or the first shard's last one.
    targets = []
    for row in range(integer_rows + extra):
        peak = peaks[row] if row < integer_rows else real - 1
        choices = sorted({peak, real - 1, ends[0]})
        targets.append(draw(st.sampled_from(choices), label=f"target of row {row}"))
    with np.errstate(over="ignore"):
        logits = exact.astype(np.float32)
    case = HiddenCase(
        contract, logits, np.array(targets), hidden=hidden32, weight=weight32, bias=bias32
    )
    case.__dict__["exact_logits"] = exact[:, :real]  # the cached property, computed exactly here
    return case


def wide_hidden_cases(
    capability: LogprobBackendCapability,
    *,
    max_vocab: int = 1 << 14,
    max_hidden: int = 256,
    max_rows: int = 3,
    general_row: bool = True,
) -> st.SearchStrategy[HiddenCase]:
    """Fused LM-head cases ``capability`` claims with ``2^10`` to ``max_vocab`` columns.

    Example::

        @given(wide_hidden_cases(MY_FUSED_CAPABILITY, max_vocab=1 << 12))
        def test_wide_fused(case): ...
    """
    if not isinstance(capability, LogprobBackendCapability):
        raise InvalidArgument(f"capability={capability!r}: expected a LogprobBackendCapability")
    if not capability.serves("input_kind", LogprobInputKind.HIDDEN):
        raise InvalidArgument(f"capability={capability.backend_id!r} takes no hidden input")
    if max_vocab < 1 << 10:
        raise InvalidArgument(f"max_vocab={max_vocab!r}: must be >= 1024")
    if not 1 <= max_hidden <= 256:
        raise InvalidArgument(f"max_hidden={max_hidden!r}: expected 1..256")
    return _cases(capability, max_vocab, max_hidden, max_rows, general_row)
