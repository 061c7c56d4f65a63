"""engine_batches: heterogeneous engine batches made from a case with a support."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from tp_logprob import SupportMode
from tp_logprob.row_groups import row_groups
from tp_logprob.strategies import cases
from tp_logprob.strategies.engine_batches import MAX_REQUESTS, engine_batches

SETTINGS = settings(
    database=None, max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
SUPPORTED = cases(
    support_modes={"sampling_params", "replayed_mask"}, max_padded_vocab_size=24, max_num_tokens=6
)


def _batches() -> Any:
    return SUPPORTED.filter(lambda case: case.contract.num_tokens > 0).flatmap(engine_batches)


@SETTINGS
@given(_batches())
def test_a_batch_has_per_row_values_and_at_most_max_requests_groups(case: Any) -> None:
    contract = case.contract
    assert contract.heterogeneous
    assert len(contract.temperature) == contract.num_tokens
    assert len(row_groups(contract)) <= MAX_REQUESTS
    if contract.support_mode is SupportMode.SAMPLING_PARAMS:
        assert contract.support.per_row and contract.support.num_rows == contract.num_tokens
    else:  # the engine's kept ids stay, so every active target is still inside them
        for row in np.flatnonzero(case.active):
            assert case.targets[row] in contract.support.kept_row(row)


def test_greedy_rows_sit_beside_sampled_rows_with_other_rules() -> None:
    def mixed(case: Any) -> bool:
        contract = case.contract
        greedy = contract.greedy_rows()
        rules = {contract.support.row_rules(row) for row in np.flatnonzero(~greedy)}
        return bool(greedy.any() and (~greedy).sum() >= 2 and len(rules) >= 2)

    case = find(
        SUPPORTED.filter(lambda c: c.contract.support_mode is SupportMode.SAMPLING_PARAMS)
        .filter(lambda c: c.contract.num_tokens > 0)
        .flatmap(engine_batches),
        mixed,
        settings=settings(database=None, max_examples=2000),
    )
    assert mixed(case)


def test_a_batch_shrinks_to_requests_alike_at_temperature_one() -> None:
    case = find(_batches(), lambda case: True, settings=settings(database=None))
    assert set(case.contract.temperature) == {1.0}
    assert len(row_groups(case.contract)) == 1


def test_a_case_without_a_support_is_refused() -> None:
    plain = find(cases(max_num_tokens=2), lambda case: True, settings=settings(database=None))
    with pytest.raises(ValueError, match="needs a sampling support"):
        find(engine_batches(plain), lambda case: True, settings=settings(database=None))


@settings(database=None, max_examples=30, deadline=None)
@given(st.data())
def test_a_greedy_request_is_temperature_zero_and_others_are_valid(data: Any) -> None:
    case = data.draw(_batches())
    for value in case.contract.temperature:
        assert value == 0.0 or np.float32(value) > 0
