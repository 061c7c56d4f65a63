"""``assert_support_admissible``: the exact support passes, a borderline token may go either
way, and a wrong set fails naming the token, the row and its borderline tokens."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tp_logprob.errors import LogprobContractError
from tp_logprob.oracle import exact_support
from tp_logprob.testing import assert_support_admissible

# Token 1's probability is min_p times the largest one's, up to fp32's rounding of log(0.1):
# a token within any fp32 engine's rounding error of the min-p boundary.
LOGITS = np.array(
    [[0.0, float(np.float32(math.log(0.1))), -5.0, -0.5], [2.0, 1.0, 0.0, -1.0]], np.float32
)


def test_the_exact_support_passes_as_a_mask_and_as_kept_lists() -> None:
    exact = exact_support(LOGITS, min_p=0.1, top_k=3)
    assert_support_admissible(exact.mask, LOGITS, min_p=0.1, top_k=3)
    kept = [np.flatnonzero(row).tolist() for row in exact.mask]
    assert_support_admissible(kept, LOGITS, min_p=0.1, top_k=3)


def test_a_borderline_token_may_be_kept_or_dropped() -> None:
    assert_support_admissible([[0, 1, 3], [0, 1, 2]], LOGITS, min_p=0.1, top_k=3)
    assert_support_admissible([[0, 3], [0, 1, 2]], LOGITS, min_p=0.1, top_k=3)


def test_a_dropped_certain_token_fails_naming_it_and_the_borderline_ones() -> None:
    with pytest.raises(AssertionError) as failure:
        assert_support_admissible([[0, 1], [0, 1, 2]], LOGITS, min_p=0.1, top_k=3)
    text = str(failure.value)
    assert text.startswith(
        "assert_support_admissible: the kept set is not admissible under min_p=0.1 top_k=3"
    )
    assert "row 0: token 3 (z=-0.5) is certainly in the support but was dropped" in text
    assert "row       0: kept |S| = 2, ids [0, 1]" in text
    assert "exact     the exact rules keep |S| = 2, ids [0, 3] (z >= -0.5)" in text
    z = float(LOGITS[0, 1])
    assert f"1 borderline tokens (a correct fp32 engine may keep or drop them): 1 (z={z!r})" in text


def test_a_kept_token_past_top_k_fails() -> None:
    with pytest.raises(AssertionError, match=r"row 1: token 3 \(z=-1.0\) is certainly out"):
        assert_support_admissible([[0, 3], [0, 1, 2, 3]], LOGITS, min_p=0.1, top_k=3)


def test_an_inactive_row_is_not_judged() -> None:
    mask = np.array([True, False])
    assert_support_admissible([[0, 3], [3]], LOGITS, min_p=0.1, top_k=3, active_mask=mask)


def test_temperature_is_applied_before_the_rules() -> None:
    # At T = 4 the z spread is a quarter: min_p=0.5 keeps tokens 0-2 of row 1 (e^-0.5 > 0.5).
    assert_support_admissible([[0, 1, 3], [0, 1, 2]], LOGITS, min_p=0.5, temperature=4.0)
    with pytest.raises(AssertionError, match="row 1: token 2"):
        assert_support_admissible([[0, 1, 3], [0, 1]], LOGITS, min_p=0.5, temperature=4.0)


def test_a_single_row_is_taken_as_it_is() -> None:
    row = LOGITS[0]
    assert_support_admissible([0, 3], row, min_p=0.1, top_k=3)
    assert_support_admissible(np.array([True, True, False, True]), row, min_p=0.1, top_k=3)
    assert_support_admissible(
        torch.tensor([True, False, False, True]), torch.from_numpy(row), min_p=0.1, top_k=3
    )
    assert_support_admissible([0, 3], None, min_p=0.1, top_k=3, tp_shards=[row[:1], row[1:]])
    with pytest.raises(AssertionError, match=r"row 0: token 3 \(z=-0.5\) is certainly in"):
        assert_support_admissible([0, 1], row, min_p=0.1, top_k=3)


def test_a_single_row_takes_a_single_row_of_kept_ids() -> None:
    for kept in ([[0, 3]], [[0, 3], [1]]):
        with pytest.raises(LogprobContractError, match=r"kept: 2-D with a single \[V\] row"):
            assert_support_admissible(kept, LOGITS[0], min_p=0.1, top_k=3)
