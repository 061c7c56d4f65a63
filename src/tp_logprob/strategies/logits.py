"""Adversarial logits: the rows that break a vocab-parallel logsumexp.

Each row of a drawn ``[N, padded]`` array is one of :data:`LOGIT_KINDS`, so a
single example mixes, say, a tie at the maximum, a row whose maximum hides in
the padding columns and a row of subnormals. Values are float32 and exactly
representable in the contract dtype, so casting to that dtype loses nothing and
the oracle sees exactly what the kernel sees.

Bulk values come from a numpy generator seeded by Hypothesis (cheap for wide
rows); the row kind, its scale and its special positions are drawn by
Hypothesis, so rows shrink toward the plain ``random`` kind with seed 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from tp_logprob.contract import LogprobContract, LogprobDType
from tp_logprob.oracle.formats import FORMATS
from tp_logprob.strategies.targets import shard_edge_columns

__all__ = [
    "DTYPE_MAX",
    "DTYPE_SMALLEST_SUBNORMAL",
    "LOGIT_KINDS",
    "SPECIAL_KINDS",
    "logits",
    "round_to_dtype",
]

LOGIT_KINDS = (
    "random",
    "ties_at_max",
    "ties_inside",
    "neg_inf_columns",
    "huge_range",
    "dtype_extremes",
    "near_uniform",
    "dominant",
    "max_in_padding",
    "subnormal",
)
"""Row kinds drawn by default. ``max_in_padding`` needs vocabulary padding.
``ties_inside`` repeats the row's second to fifth largest value across columns, one
of them the first or last live column of a shard: a tie below the maximum (unless a
copy lands on it), spread over the ranks, where top-k's k-th value or a top-p or
min-p boundary can fall."""

SPECIAL_KINDS = ("nan", "pos_inf", "all_neg_inf", "special_in_padding")
"""Row kinds drawn only with ``special_values=True``: NaN and +inf in live
columns, rows whose live columns are all -inf, and NaN/inf confined to padding."""

DTYPE_MAX = {dtype: FORMATS[dtype.value].max for dtype in LogprobDType}
"""Largest finite value of each logits dtype."""

DTYPE_SMALLEST_SUBNORMAL = {
    dtype: FORMATS[dtype.value].smallest_subnormal for dtype in LogprobDType
}
"""Smallest positive (subnormal) value of each logits dtype."""

_EPSILON = {dtype: FORMATS[dtype.value].epsilon for dtype in LogprobDType}


def round_to_dtype(values: npt.ArrayLike, dtype: LogprobDType | str) -> npt.NDArray[np.float32]:
    """Round ``values`` (first to float32) to the nearest ``dtype`` value, as float32.

    Round-to-nearest-even, like a hardware cast: bf16 by rounding the float32 bit
    pattern at bit 16, fp16 through ``np.float16``. Values past the dtype's range
    become +-inf, NaN stays NaN.

    >>> round_to_dtype([1.0 + 2.0**-9], "bf16")
    array([1.], dtype=float32)
    """
    dtype = LogprobDType(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        array = np.array(values, dtype=np.float32)
        if dtype is LogprobDType.FP16:
            return array.astype(np.float16).astype(np.float32)
        if dtype is LogprobDType.FP32:
            return array
        bits = array.view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        result = rounded.astype(np.uint32).view(np.float32)
    # A NaN whose payload sits in the low bits would round to inf: keep it NaN.
    return np.where(np.isnan(array), array, result).astype(np.float32)


def _positions(draw: Any, columns: int, min_size: int, max_size: int) -> list[int]:
    """A unique list of column indices in ``[0, columns)``."""
    positions: list[int] = draw(
        st.lists(st.sampled_from(range(columns)), min_size=min_size, max_size=max_size, unique=True)
    )
    return positions


@st.composite
def _row(draw: Any, contract: LogprobContract, kinds: tuple[str, ...]) -> npt.NDArray[np.float64]:
    padded = contract.sharding.padded_vocab_size
    real = contract.sharding.real_vocab_size
    top = DTYPE_MAX[contract.dtype]
    kind = draw(st.sampled_from(kinds))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([1.0, 4.0, 0.25, 30.0]))
    offset = draw(st.sampled_from([0.0, -10.0, 10.0, 1000.0, -1000.0]))
    row = offset + scale * rng.standard_normal(padded)
    live = row[:real]
    if kind == "ties_at_max":
        tied = _positions(draw, real, 2, real)
        live[tied] = live.max() + draw(st.sampled_from([0.0, 1.0, 100.0]))
    elif kind == "ties_inside":
        source = int(np.argsort(-live)[draw(st.integers(1, min(4, real - 1)))])
        edge = draw(st.sampled_from([c for c in shard_edge_columns(contract) if c != source]))
        others = [column for column in range(real) if column not in (source, edge)]
        more = _positions(draw, len(others), 0, len(others)) if others else []
        live[[edge, *(others[index] for index in more)]] = live[source]
    elif kind == "neg_inf_columns":
        live[_positions(draw, real, 1, real - 1)] = -np.inf
    elif kind == "huge_range":
        exponents = rng.uniform(-30.0, np.log10(top), padded)
        row = rng.choice([-1.0, 1.0], padded) * 10.0**exponents
    elif kind == "dtype_extremes":
        row = rng.choice([top, -top, top, 0.0, 1.0, -1.0], padded)
    elif kind == "near_uniform":
        level = draw(st.sampled_from([0.0, 1.0, -3.5, 100.0, top / 2]))
        row = level * (1.0 + _EPSILON[contract.dtype] * rng.integers(-2, 3, padded))
    elif kind == "dominant":
        live[draw(st.integers(0, real - 1))] = live.max() + draw(
            st.sampled_from([20.0, 100.0, 1e4])
        )
    elif kind == "max_in_padding":
        row[real:] = row.max() + draw(st.sampled_from([1.0, 100.0, 1e4, top]))
    elif kind == "subnormal":
        tiny = DTYPE_SMALLEST_SUBNORMAL[contract.dtype]
        row = tiny * rng.integers(-1000, 1001, padded) * rng.integers(0, 2, padded)
    elif kind == "nan":
        live[_positions(draw, real, 1, real)] = np.nan
    elif kind == "pos_inf":
        live[_positions(draw, real, 1, real)] = np.inf
        if draw(st.booleans()):
            live[_positions(draw, real, 1, real)] = -np.inf
    elif kind == "all_neg_inf":
        live[:] = -np.inf
    elif kind == "special_in_padding":
        specials = [np.nan, np.inf, -np.inf]
        row[real:] = rng.choice(specials, padded - real)
    return np.asarray(row, dtype=np.float64)


def logits(
    contract: LogprobContract,
    *,
    special_values: bool = False,
    kinds: Iterable[str] | None = None,
) -> st.SearchStrategy[npt.NDArray[np.float32]]:
    """Full logits, float32 ``[num_tokens, padded_vocab_size]``, adversarial row by row.

    Every value is exactly representable in ``contract.dtype`` and finite except
    -inf columns; NaN and +inf (and all -inf rows) appear only with
    ``special_values=True``. ``kinds`` restricts the row kinds (see
    :data:`LOGIT_KINDS` and :data:`SPECIAL_KINDS`).

    Example::

        @given(st.data())
        def test_rows(data):
            contract = data.draw(contracts(), label="contract")
            x = data.draw(logits(contract), label="logits")
    """
    if not isinstance(contract, LogprobContract):
        raise InvalidArgument(f"contract={contract!r}: expected a LogprobContract")
    allowed = LOGIT_KINDS + (SPECIAL_KINDS if special_values else ())
    if kinds is None:
        chosen = allowed
    else:
        if isinstance(kinds, (str, bytes)):
            raise InvalidArgument(f"kinds={kinds!r}: expected a collection, e.g. {{{kinds!r}}}")
        wanted = set(kinds)
        unknown = wanted - set(allowed)
        if unknown or not wanted:
            raise InvalidArgument(
                f"kinds={kinds!r}: expected a non-empty subset of {allowed}"
                + (
                    " (special kinds need special_values=True)"
                    if unknown & set(SPECIAL_KINDS)
                    else ""
                )
            )
        chosen = tuple(kind for kind in allowed if kind in wanted)
    chosen = tuple(kind for kind in chosen if _applies(kind, contract))
    if not chosen:
        raise InvalidArgument(
            f"kinds={kinds!r}: none applies to {contract.describe()} "
            "(padding kinds need real < padded, tie and -inf kinds need two live columns)"
        )
    rows = contract.num_tokens
    top = DTYPE_MAX[contract.dtype]
    return st.lists(_row(contract, chosen), min_size=rows, max_size=rows).map(
        lambda drawn: _finish(drawn, rows, contract.sharding.padded_vocab_size, top, contract.dtype)
    )


def _applies(kind: str, contract: LogprobContract) -> bool:
    sharding = contract.sharding
    if kind in ("max_in_padding", "special_in_padding"):
        return sharding.has_padding
    if kind in ("ties_at_max", "ties_inside", "neg_inf_columns"):
        return sharding.real_vocab_size >= 2
    return True


def _finish(
    rows: list[npt.NDArray[np.float64]], count: int, padded: int, top: float, dtype: LogprobDType
) -> npt.NDArray[np.float32]:
    array = np.stack(rows) if rows else np.empty((count, padded))
    # Saturate finite values at the dtype's largest value rather than overflow to inf.
    with np.errstate(invalid="ignore"):
        array = np.where(np.isfinite(array), np.clip(array, -top, top), array)
    result = round_to_dtype(array, dtype)
    result.flags.writeable = False
    return result
