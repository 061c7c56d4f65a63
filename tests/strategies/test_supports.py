"""The support strategies: valid supports, boundaries that bite, targets inside replayed masks."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from tp_logprob import SupportMode
from tp_logprob.strategies import cases, contracts, logits, shard_edge_columns, supports

SETTINGS = settings(
    database=None, max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@SETTINGS
@given(cases(support_modes={"sampling_params", "replayed_mask"}, max_padded_vocab_size=24))
def test_drawn_cases_carry_a_valid_support_and_targets_inside_replayed_masks(case: Any) -> None:
    contract = case.contract
    assert contract.support is not None
    if contract.support_mode is SupportMode.REPLAYED_MASK:
        for row in np.flatnonzero(case.active):
            assert case.targets[row] in contract.support.kept_row(row)


def _z(case: Any) -> np.ndarray:
    live = case.logits[:, : case.contract.sharding.real_vocab_size]
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        z = live / np.float32(case.contract.temperature_fp32)
    return np.asarray(z, dtype=np.float64)


def test_top_k_boundaries_land_on_ties() -> None:
    """Some drawn top_k is the first of several tokens tied at the k-th value."""
    found = []

    @settings(database=None, max_examples=400, deadline=None)
    @given(cases(support_modes={"sampling_params"}, max_padded_vocab_size=24, max_num_tokens=3))
    def search(case: Any) -> None:
        k = case.contract.support.top_k
        if k is None:
            return
        for row in _z(case):
            ordered = np.sort(row[np.isfinite(row)])[::-1]
            if k < ordered.size and ordered[k - 1] == ordered[k] and k >= 2:
                found.append(k)

    search()
    assert found


@settings(database=None, max_examples=60, deadline=None)
@given(data=st.data())
def test_ties_inside_rows_tie_a_shard_edge_below_the_maximum(data: Any) -> None:
    """Every ``ties_inside`` row repeats one value in two live columns or more, one of them a
    shard's first or last live column."""
    contract = data.draw(contracts(max_padded_vocab_size=24, min_num_tokens=1), label="contract")
    real = contract.sharding.real_vocab_size
    if real < 2:
        return
    rows = data.draw(logits(contract, kinds={"ties_inside"}), label="logits")
    edges = set(shard_edge_columns(contract))
    for row in rows[:, :real]:
        shared = [np.flatnonzero(row == value) for value in np.unique(row)]
        assert any(len(cols) >= 2 and edges & set(cols.tolist()) for cols in shared), row


def test_top_k_reaches_a_tie_at_the_k_th_value_over_two_ranks() -> None:
    """Some drawn top_k >= 2 is the first of several tokens tied at the k-th value, held by
    two ranks: a rule that keeps exactly k tokens, or cuts the tie per shard, drops one."""

    def tie_over_ranks(case: Any) -> bool:
        k = case.contract.support.top_k
        sharding = case.contract.sharding
        bounds = [sharding.live_bounds(rank) for rank in range(sharding.tp_world_size)]
        for row in _z(case):
            finite = row[np.isfinite(row)]
            if np.isnan(row).any() or not 2 <= k < finite.size:
                continue
            tied = np.flatnonzero(row == np.sort(finite)[-k])
            ranks = {rank for col in tied for rank, (a, b) in enumerate(bounds) if a <= col < b}
            if np.sum(finite >= np.sort(finite)[-k]) > k and len(ranks) >= 2:
                return True
        return False

    found = find(
        cases(
            support_modes={"sampling_params"},
            support_rules=("top_k",),
            tp_world_sizes={2, 3, 4},
            max_padded_vocab_size=24,
        ),
        tie_over_ranks,
        settings=settings(database=None, max_examples=400, deadline=None),
    )
    assert tie_over_ranks(found)


def _survivors(finite: np.ndarray, support: Any) -> np.ndarray:
    """The values min-p and top-k keep (float64), over which top-p renormalises."""
    if support.min_p is not None:
        with np.errstate(under="ignore"):
            finite = finite[np.exp(finite - finite.max()) >= support.min_p]
    if support.top_k is not None and support.top_k < finite.size:
        finite = finite[finite >= np.sort(finite)[::-1][support.top_k - 1]]
    return finite


def test_top_p_boundaries_sit_on_a_mass() -> None:
    """Some drawn top_p equals the float64 mass strictly above a token of a row, relative to
    the survivors of the min-p and top-k drawn with it."""
    found = []

    @settings(database=None, max_examples=400, deadline=None)
    @given(cases(support_modes={"sampling_params"}, max_padded_vocab_size=24, max_num_tokens=3))
    def search(case: Any) -> None:
        support = case.contract.support
        p = support.top_p
        if p is None or p == 1.0:
            return
        for row in _z(case):
            finite = row[np.isfinite(row)]
            if finite.size == 0 or np.isnan(row).any() or np.isposinf(row).any():
                continue
            finite = _survivors(finite, support)
            with np.errstate(under="ignore"):
                masses = np.exp(finite - finite.max())
            ratios = {float(masses[finite > v].sum() / masses.sum()) for v in np.unique(finite)}
            if p in ratios:
                found.append(p)

    search()
    assert found


@given(st.data())
@settings(database=None, max_examples=30, deadline=None)
def test_supports_refuse_nonsense(data: Any) -> None:
    contract = data.draw(contracts(max_padded_vocab_size=8))
    with pytest.raises(InvalidArgument, match="name sampling_params or replayed_mask"):
        data.draw(supports(contract, modes=("full",)))
    with pytest.raises(InvalidArgument, match="is not a SupportMode"):
        data.draw(supports(contract, modes=("top_k",)))
    with pytest.raises(InvalidArgument, match="logits: shape"):
        data.draw(supports(contract, logits=np.zeros((contract.num_tokens + 1, 1))))


def test_every_param_kind_and_replayed_row_kind_is_drawn() -> None:
    seen: set[str] = set()

    @settings(database=None, max_examples=300, deadline=None)
    @given(cases(support_modes={"sampling_params", "replayed_mask"}, max_padded_vocab_size=16))
    def search(case: Any) -> None:
        support = case.contract.support
        if support.mode is SupportMode.REPLAYED_MASK:
            counts = support.kept_counts()
            real = case.contract.sharding.real_vocab_size
            seen.update({"every_live"} if (counts == real).any() else set())
            seen.update({"single"} if (counts == 1).any() else set())
            seen.update({"empty"} if (counts == 0).any() else set())
        else:
            rules = dataclasses.asdict(support)
            seen.update(name for name in ("top_k", "top_p", "min_p") if rules[name] is not None)

    search()
    assert {"every_live", "single", "empty", "top_k", "top_p", "min_p"} <= seen


@pytest.mark.parametrize(
    "rules", [("top_k",), ("top_p",), ("min_p",), ("top_k", "min_p"), ("top_p", "top_k", "min_p")]
)
def test_rules_turn_exactly_those_rules_on(rules: tuple[str, ...]) -> None:
    """``support_rules`` (``rules`` of ``supports``): every drawn support has those rules on
    and no other, at the TP degrees asked for."""

    @settings(database=None, max_examples=60, deadline=None)
    @given(
        cases(
            support_modes={"sampling_params"},
            tp_world_sizes=[2, 3],
            support_rules=rules,
            max_padded_vocab_size=24,
        )
    )
    def check(case: Any) -> None:
        support = case.contract.support
        assert case.contract.sharding.tp_world_size in (2, 3)
        on = {rule for rule in ("top_k", "top_p", "min_p") if getattr(support, rule) is not None}
        assert on == set(rules)

    check()


@pytest.mark.parametrize("rules", [(), ("top_q",), ("top_k", "top_k"), "min_p_top_k"])
@settings(database=None, max_examples=1, deadline=None)
@given(data=st.data())
def test_rules_refuse_what_is_not_a_rule_set(rules: Any, data: Any) -> None:
    contract = data.draw(contracts(support_modes={"sampling_params"}))
    with pytest.raises(InvalidArgument, match="rules="):
        supports(contract, modes=("sampling_params",), rules=rules)
