"""The covering arrays behind the compile matrix's paired variants."""

from __future__ import annotations

import doctest
import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

covering = pytest.importorskip("tools.gpu_readiness.covering")


def _every_pair_meets(choices: dict[str, tuple[Any, ...]], rows: list[dict[str, Any]]) -> bool:
    for a, b in itertools.combinations(choices, 2):
        for x in choices[a]:
            for y in choices[b]:
                if not any(row[a] == x and row[b] == y for row in rows):
                    return False
    return True


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=0, max_size=7))
def test_every_two_values_of_any_two_options_meet(sizes: list[int]) -> None:
    choices = {f"o{k}": tuple(range(size)) for k, size in enumerate(sizes)}
    rows = covering.pairwise(choices)
    assert all(set(row) == set(choices) for row in rows) or not choices
    assert _every_pair_meets(choices, rows)
    for key, values in choices.items():  # one option alone: each of its values appears
        assert {row[key] for row in rows} == set(values)
    assert covering.pairwise(choices) == rows  # deterministic
    total = 1
    for size in sizes:
        total *= size
    assert len(rows) <= max(total, 1)


def test_size_follows_the_two_largest_options_not_their_product() -> None:
    choices = {"scope": tuple(range(4)), "dtype": tuple(range(3)), "support": tuple(range(3))}
    choices |= {name: (False, True) for name in ("lse", "entropy", "temperature", "targets")}
    rows = covering.pairwise(choices)
    assert 12 <= len(rows) <= 20  # 4 x 3 at least; the product is 576
    assert rows[0] == {key: values[0] for key, values in choices.items()}  # defaults first


@pytest.mark.parametrize("choices", [{}, {"only": (1, 2, 3)}])
def test_fewer_than_two_options(choices: dict[str, tuple[int, ...]]) -> None:
    rows = covering.pairwise(choices)
    assert rows == ([{}] if not choices else [{"only": 1}, {"only": 2}, {"only": 3}])
    assert covering.pairwise({"a": (), "b": (1,)}) == []


def test_docstring_examples() -> None:
    assert doctest.testmod(covering).failed == 0
