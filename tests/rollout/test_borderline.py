"""A mask decision flips within the noise exactly when some perturbation flips it.

:func:`~tp_logprob.rollout.borderline.flippable` checks one perturbation per token
and direction; these tests search every perturbation built from the row's own
values (each logit moved to ``x_u``, ``x_u +- eps`` or to another token's
``x_w``, ``x_w +- eps`` where that is within ``eps``: the corners and every tie
the rules can see) and random ones, on small vocabularies of dyadic logits (exact
in fp32, so ties are real), and require the same answer.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tp_logprob.oracle import SupportMargins, exact_support, support_margins
from tp_logprob.rollout import borderline
from tp_logprob.rollout.borderline import flippable, judge_under_noise, supports_under_noise

RULES: list[dict[str, Any]] = [
    {"min_p": 0.3},
    {"min_p": 0.6},
    {"top_p": 0.5},
    {"top_p": 0.8},
    {"top_k": 1},
    {"top_k": 2},
    {"top_k": 2, "top_p": 0.7},
    {"min_p": 0.2, "top_p": 0.6},
    {"min_p": 0.4, "top_k": 2, "top_p": 0.9},
]


def _search(x: np.ndarray, v: int, keep: bool, eps: float, params: dict[str, Any]) -> bool:
    """Does any perturbation of the candidates (and 300 random ones) keep (or drop) ``v``?"""
    choices = []
    for u in range(x.size):
        values = {x[u] + s * eps for s in (-1.0, 0.0, 1.0)}
        values |= {x[w] + s * eps for w in range(x.size) for s in (-1.0, 0.0, 1.0)}
        choices.append(sorted(c for c in values if abs(c - x[u]) <= eps))
    rows = np.array(list(itertools.product(*choices)), dtype=np.float32)
    rng = np.random.default_rng(0)
    random = x + rng.uniform(-eps, eps, (300, x.size))
    rows = np.concatenate([rows, random.astype(np.float32)])
    kept = exact_support(rows, **params).mask[:, v]
    return bool(kept.any() if keep else (~kept).any())


@settings(max_examples=150, deadline=None)
@given(
    quarters=st.lists(st.integers(-12, 12), min_size=2, max_size=3),
    eps_quarters=st.integers(0, 3),
    rule=st.sampled_from(range(len(RULES))),
    data=st.data(),
)
@example(quarters=[4, 3, 0, -2], eps_quarters=1, rule=6, data=None)
@example(quarters=[-1, -4, 10], eps_quarters=3, rule=3, data=None)  # keep by a tie, not below
def test_a_decision_flips_iff_some_perturbation_flips_it(
    quarters: list[int], eps_quarters: int, rule: int, data: Any
) -> None:
    x = np.array(quarters, dtype=np.float32) / 4
    eps = eps_quarters / 4
    params = RULES[rule]
    # An @example (no data) asks whether column 1 can be kept.
    v = 1 if data is None else data.draw(st.integers(0, x.size - 1), label="column")
    keep = True if data is None else data.draw(st.booleans(), label="keep")
    found = flippable(
        x, np.array([v]), np.array([keep]), eps, SupportMargins.zero(), x.size, 1.0, params
    )
    assert bool(found[0]) == _search(x, v, keep, eps, params), (x.tolist(), eps, params, v, keep)


def test_a_mask_is_borderline_where_each_refused_decision_flips() -> None:
    """Top-p 0.5 keeps only the first of [1.0, 0.8, -3.0]: a mask that keeps the second too is
    support with no noise and with 0.05, borderline at 0.1 (the two can tie)."""
    x = np.array([[1.0, 0.8, -3.0]], dtype=np.float32)
    both = np.array([[True, True, False]])
    margins = support_margins("fp32", 3)
    params = {"top_p": 0.5}
    assert exact_support(x, **params).mask.tolist() == [[True, False, False]]
    for eps in (0.0, 0.05):
        assert judge_under_noise(x, both, margins, 3, 1.0, np.array([eps]), params) == [False]
    assert judge_under_noise(x, both, margins, 3, 1.0, np.array([0.1]), params) == [True]
    # Dropping the third while keeping nothing above it cannot be ordered within 0.1.
    odd = np.array([[True, False, True]])
    assert judge_under_noise(x, odd, margins, 3, 1.0, np.array([0.1]), params) == [False]


@settings(max_examples=60, deadline=None)
@given(
    quarters=st.lists(st.integers(-12, 12), min_size=2, max_size=4),
    eps_quarters=st.integers(0, 3),
    rule=st.sampled_from(range(len(RULES))),
)
def test_the_supports_under_noise_are_those_some_perturbation_gives(
    quarters: list[int], eps_quarters: int, rule: int
) -> None:
    """Every column the search can drop lies past ``low``, every one it can keep before
    ``high``: the galloping counts leave out no flip and take in none."""
    x = np.array(quarters, dtype=np.float32) / 4
    eps = eps_quarters / 4
    params = RULES[rule]
    kept = exact_support(x[None], **params).mask[0]
    order, low, high = supports_under_noise(
        x, kept, SupportMargins.zero(), x.size, 1.0, eps, params
    )
    wide = borderline.ALL_AT_ONCE
    borderline.ALL_AT_ONCE = 0  # the galloping search a wide row takes gives the same
    try:
        galloped = supports_under_noise(x, kept, SupportMargins.zero(), x.size, 1.0, eps, params)
    finally:
        borderline.ALL_AT_ONCE = wide
    assert (galloped[0].tolist(), galloped[1:]) == (order.tolist(), (low, high))
    assert sorted(order.tolist()) == list(range(x.size))
    sure = {v for v in range(x.size) if kept[v] and not _search(x, v, False, eps, params)}
    possible = {v for v in range(x.size) if kept[v] or _search(x, v, True, eps, params)}
    assert set(order[:low].tolist()) == sure, (x.tolist(), eps, params)
    assert set(order[:high].tolist()) == possible, (x.tolist(), eps, params)
