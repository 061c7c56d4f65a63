"""Covering arrays of strength 2: few rows in which every two values of any two options meet.

A sweep over every combination of ``k`` options grows as their product; most
interaction bugs need only two options at particular values (a padded vocabulary
at TP=8, fp16 with a temperature), and every such pair is in some row of
:func:`pairwise`, whose size grows as the product of the two largest option
counts. The compile matrix's paired variants use it (:mod:`.recorder`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["pairwise"]


def pairwise(choices: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Rows giving every option one of its values such that any two values of any two
    options are together in some row; an option's first value is its default.

    Built greedily and deterministically: each row starts from the first pair not yet
    covered (options in the mapping's order, values in theirs), then gives every other
    option the value that covers the most uncovered pairs (ties: the earlier value).
    No options gives one empty row; an option without values gives none.

    >>> pairwise({"a": (0, 1), "b": ("x", "y")})
    [{'a': 0, 'b': 'x'}, {'a': 0, 'b': 'y'}, {'a': 1, 'b': 'x'}, {'a': 1, 'b': 'y'}]
    >>> len(pairwise({name: (False, True) for name in "abcdefgh"}))  # of 256 combinations
    9
    """
    keys = list(choices)
    if any(len(choices[key]) == 0 for key in keys):
        return []
    index = {key: i for i, key in enumerate(keys)}

    def pair(a: str, i: int, b: str, j: int) -> tuple[tuple[str, int], tuple[str, int]]:
        return ((a, i), (b, j)) if index[a] < index[b] else ((b, j), (a, i))

    uncovered = {
        ((a, i), (b, j))
        for a, b in itertools.combinations(keys, 2)
        for i in range(len(choices[a]))
        for j in range(len(choices[b]))
    }
    rows: list[dict[str, Any]] = []
    while uncovered:
        (a, i), (b, j) = min(
            uncovered, key=lambda p: (index[p[0][0]], p[0][1], index[p[1][0]], p[1][1])
        )
        chosen = {a: i, b: j}
        for key in keys:
            if key not in chosen:  # the value covering most uncovered pairs, the earliest of ties
                gains = [
                    sum(pair(key, v, other, w) in uncovered for other, w in chosen.items())
                    for v in range(len(choices[key]))
                ]
                chosen[key] = gains.index(max(gains))
        uncovered -= {
            pair(x, i, y, j) for (x, i), (y, j) in itertools.combinations(chosen.items(), 2)
        }
        rows.append({key: choices[key][chosen[key]] for key in keys})
    if not rows:  # fewer than two options: every value of the one option, or one empty row
        rows = [{key: value} for key in keys for value in choices[key]] or [{}]
    return rows
