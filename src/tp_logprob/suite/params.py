"""What a property draws besides its case, declared so an artifact can store and check it.

Scalars and short lists go into the artifact's JSON (``params``); arrays go into
its ``.npz`` next to the logits. Every value is data: a replayed artifact is
validated against these declarations before a check sees it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tp_logprob.contract import LogprobContract

__all__ = [
    "PARAM_KINDS",
    "ArraySpec",
    "PropertySpec",
    "any_length",
    "live_columns",
    "padding_columns",
    "per_row",
]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_bounds(value: object) -> bool:
    return (
        isinstance(value, list)
        and 0 < len(value) <= 4096
        and all(
            isinstance(pair, list) and len(pair) == 2 and all(_is_int(v) for v in pair)
            for pair in value
        )
    )


PARAM_KINDS: dict[str, Callable[[object], bool]] = {
    "int": _is_int,
    "float": lambda v: isinstance(v, float) and bool(np.isfinite(v)),
    "str": lambda v: isinstance(v, str) and len(v) <= 200,
    "int_list": lambda v: isinstance(v, list) and len(v) <= 8 and all(_is_int(x) for x in v),
    "bounds": _is_bounds,
}
"""How each kind of scalar parameter is checked (JSON types only; no NaN or inf)."""


@dataclass(frozen=True)
class ArraySpec:
    """One extra array: its numpy dtype and its shape given the case's contract.

    A ``None`` in the shape is any length up to ``max_length``.
    """

    dtype: str
    shape: Callable[[LogprobContract], tuple[int | None, ...]]
    max_length: int = 4096

    def problem(self, name: str, array: np.ndarray[Any, Any], contract: LogprobContract) -> str:
        """Why ``array`` does not fit; empty when it does."""
        if array.dtype != np.dtype(self.dtype):
            return f"array {name!r}: dtype {array.dtype}, expected {self.dtype}"
        expected = self.shape(contract)
        fits = len(array.shape) == len(expected) and all(
            (size <= self.max_length) if want is None else size == want
            for size, want in zip(array.shape, expected, strict=True)
        )
        if not fits:
            return f"array {name!r}: shape {list(array.shape)}, expected {list(expected)}"
        return ""


@dataclass(frozen=True)
class PropertySpec:
    """The params (name -> kind; optional ones may be absent or null) and arrays a check takes."""

    params: Mapping[str, str] = field(default_factory=dict)
    optional: frozenset[str] = frozenset()
    arrays: Mapping[str, ArraySpec] = field(default_factory=dict)

    def param_problems(self, params: Mapping[str, Any]) -> list[str]:
        """Every way ``params`` breaks this declaration."""
        problems = [f"params: unknown key {key!r}" for key in params if key not in self.params]
        for key, kind in self.params.items():
            if key not in params or params[key] is None:
                if key not in self.optional:
                    problems.append(f"params.{key}: missing (expected {kind})")
            elif not PARAM_KINDS[kind](params[key]):
                problems.append(f"params.{key}={params[key]!r}: expected {kind}")
        return problems


def per_row(contract: LogprobContract) -> tuple[int | None, ...]:
    """An array shape: one value per row of the case."""
    return (contract.num_tokens,)


def padding_columns(contract: LogprobContract) -> tuple[int | None, ...]:
    """An array shape: every row's padding columns."""
    sharding = contract.sharding
    return (contract.num_tokens, sharding.padded_vocab_size - sharding.real_vocab_size)


def live_columns(contract: LogprobContract) -> tuple[int | None, ...]:
    """An array shape: one value per live column."""
    return (contract.sharding.real_vocab_size,)


def any_length(contract: LogprobContract) -> tuple[int | None, ...]:
    """An array shape: any length up to the spec's ``max_length``."""
    return (None,)
