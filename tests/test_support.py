"""SupportSpec and the contract's support field: checks, round trips, fingerprints."""

from __future__ import annotations

import dataclasses
import json
import pickle

import numpy as np
import pytest

import tp_logprob as tpl
from tp_logprob import LogprobContractError, SupportMode, SupportSpec


def _contract(num_tokens: int = 3, active: list[bool] | None = None, **changes: object):
    contract = tpl.LogprobContract(
        role="train",
        dtype="fp32",
        mask=tpl.MaskSpec(num_tokens=num_tokens, active_mask=active),
        sharding=tpl.ShardingSpec(0, 2, tpl.even_shard_bounds(16, 2), 12, 16),
        reduction=tpl.ReductionSpec("fixed_topology"),
    )
    return dataclasses.replace(contract, **changes)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "neither sampling parameters"),
        ({"top_k": 0}, "support.top_k=0: must be >= 1"),
        ({"top_k": -1}, "support.top_k=-1"),
        ({"top_k": True}, "support.top_k=True: expected an int"),
        ({"top_k": 2.0}, "support.top_k=2.0: expected an int"),
        ({"top_p": 0.0}, "support.top_p=0.0: must lie in (0, 1]"),
        ({"top_p": 1.5}, "support.top_p=1.5"),
        ({"top_p": float("nan")}, "support.top_p=nan"),
        ({"top_p": True}, "support.top_p=True: expected None or a float"),
        ({"min_p": -0.1}, "support.min_p=-0.1: must lie in [0, 1]"),
        ({"min_p": "0.1"}, "support.min_p='0.1'"),
        ({"kept_offsets": [0, 1]}, "support.kept_ids=None"),
        ({"kept_ids": [1]}, "support.kept_offsets=None"),
        ({"top_k": 3, "kept_offsets": [0, 1], "kept_ids": [1]}, "not both"),
        ({"kept_offsets": [1, 2], "kept_ids": [1, 2]}, "must start at 0"),
        ({"kept_offsets": [0, 2, 1], "kept_ids": [1]}, "kept_offsets[2]=1: offsets must not"),
        ({"kept_offsets": [0, 1], "kept_ids": [1, 2]}, "must equal len(kept_ids)=2"),
        ({"kept_offsets": [0, 2], "kept_ids": [3, 3]}, "kept_ids[row 0]=[3, 3]: ids must be"),
        ({"kept_offsets": [0, 1, 3], "kept_ids": [5, 4, 2]}, "kept_ids[row 1]=[4, 2]"),
        ({"kept_offsets": [0, 1], "kept_ids": [-1]}, "kept_ids[row 0]=-1: token ids"),
        ({"kept_offsets": [0, 1], "kept_ids": [1.5]}, "kept_ids[0]=1.5: expected an int, got"),
        ({"kept_offsets": [0, 2], "kept_ids": [1, True]}, "kept_ids[1]=True: expected an int"),
        ({"kept_offsets": [0, 1.0], "kept_ids": [1]}, "kept_offsets[1]=1.0: expected an int"),
        ({"kept_offsets": [0, 1], "kept_ids": np.array([1.0])}, "expected a 1-D array of ints"),
        ({"kept_offsets": [0, 1], "kept_ids": np.array([True])}, "expected a 1-D array of ints"),
        ({"kept_offsets": "01", "kept_ids": [1]}, "expected a 1-D sequence"),
    ],
)
def test_bad_support_specs_name_the_field(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(LogprobContractError) as raised:
        SupportSpec(**kwargs)  # type: ignore[arg-type]
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([[1.5], [0]], "rows[row 0][0]=1.5: expected an int, got float"),
        ([[1.0], [0]], "rows[row 0][0]=1.0: expected an int, got float"),
        ([[0], [2, True]], "rows[row 1][1]=True: expected an int, got bool"),
        ([[0], [np.float32(3)]], "rows[row 1][0]=np.float32(3.0): expected an int"),
        ([[0], "12"], "rows[row 1]='12': expected a 1-D sequence"),
        ("01", "rows='01': expected one sequence of ids per row"),
    ],
)
def test_kept_lists_refuse_ids_that_are_not_ints(rows: object, message: str) -> None:
    with pytest.raises(LogprobContractError) as raised:
        SupportSpec.from_kept_lists(rows)  # type: ignore[arg-type]
    assert message in str(raised.value)


def test_rows_may_restart_ids_and_be_empty() -> None:
    spec = SupportSpec.from_kept_lists([[5, 9], [], [0, 1, 2], [3]])
    assert spec.mode is SupportMode.REPLAYED_MASK
    assert spec.kept_counts().tolist() == [2, 0, 3, 1]
    assert spec.kept_row(2).tolist() == [0, 1, 2]
    dense = spec.dense(12)
    assert dense.sum() == 6 and dense[0, 9] and not dense[1].any()
    assert SupportSpec.from_mask(dense) == spec
    offsets, local = spec.local_kept(2, 9)
    assert offsets.tolist() == [0, 1, 1, 2, 3] and local.tolist() == [3, 0, 1]


@pytest.mark.parametrize(
    ("support", "active", "message"),
    [
        (SupportSpec.from_kept_lists([[1], [2]]), None, "describes 2 rows, expected num_tokens=3"),
        (SupportSpec.from_kept_lists([[1], [2], [12]]), None, "kept_ids[row 2]=12: outside"),
        (SupportSpec.from_kept_lists([[1], [], [2]]), None, "kept_ids[row 1]=[]: an active"),
    ],
)
def test_the_contract_checks_a_replayed_support(
    support: SupportSpec, active: list[bool] | None, message: str
) -> None:
    with pytest.raises(LogprobContractError) as raised:
        _contract(support=support, mask=tpl.MaskSpec(3, active))
    assert message in str(raised.value)


def test_an_inactive_row_may_keep_nothing() -> None:
    support = SupportSpec.from_kept_lists([[1], [], [2]])
    contract = _contract(mask=tpl.MaskSpec(3, [True, False, True]), support=support)
    assert contract.support_mode is SupportMode.REPLAYED_MASK


def test_a_support_must_be_a_spec() -> None:
    with pytest.raises(LogprobContractError, match=r"support=.*expected a SupportSpec"):
        _contract(support={"top_k": 3})


@pytest.mark.parametrize(
    "support",
    [
        None,
        SupportSpec(top_k=4),
        SupportSpec(top_p=0.9, min_p=0.05),
        SupportSpec.from_kept_lists([[1, 3], [0], [11]]),
    ],
)
def test_contract_round_trips_with_its_support(support: SupportSpec | None) -> None:
    contract = _contract(support=support)
    data = contract.to_dict()
    kept = (
        None
        if support is None or support.kept_offsets is None
        else (
            support.kept_offsets,
            support.kept_ids,
        )
    )
    assert tpl.LogprobContract.from_dict(data, kept=kept) == contract
    assert contract.support_mode is (SupportMode.FULL if support is None else support.mode)


def test_the_fingerprint_sees_the_support() -> None:
    fingerprints = {
        _contract(support=support).cross_rank_fingerprint()
        for support in (
            None,
            SupportSpec(top_k=4),
            SupportSpec(top_k=5),
            SupportSpec(top_p=0.9),
            SupportSpec.from_kept_lists([[1, 3], [0], [11]]),
            SupportSpec.from_kept_lists([[1, 3], [0], [10]]),
        )
    }
    assert len(fingerprints) == 6


def test_from_dict_refuses_kept_ids_that_do_not_match() -> None:
    support = SupportSpec.from_kept_lists([[1, 3], [0], [11]])
    data = _contract(support=support).to_dict()
    with pytest.raises(LogprobContractError, match=r"support\.sha256"):
        tpl.LogprobContract.from_dict(data, kept=(np.array([0, 2, 3, 4]), np.array([1, 3, 0, 10])))
    with pytest.raises(LogprobContractError, match="kept=None"):
        tpl.LogprobContract.from_dict(data)


def test_results_carry_the_support_outputs_without_changing_iteration() -> None:
    result = tpl.LogprobResult(1.0, 2.0, support_lse=1.5, support_size=3, support_threshold=0.25)
    selected, lse = result
    assert (selected, lse, result.support_lse, result.support_size) == (1.0, 2.0, 1.5, 3)
    copied = pickle.loads(pickle.dumps(result))
    assert copied.support_threshold == 0.25 and copied == result
    assert "support_lse=1.5" in repr(result)
    with pytest.raises(AttributeError):
        result.support_lse = 0.0  # type: ignore[misc]
    assert tpl.LogprobResult(1.0, 2.0).support_lse is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"top_k": [1, 0]}, "support.top_k[row 1]=0: must be >= 1"),
        ({"top_k": [2, True]}, "support.top_k[row 1]=True: expected an int"),
        ({"top_p": [0.5, 1.5]}, "support.top_p[row 1]=1.5: must lie in (0, 1]"),
        ({"min_p": [None, "0.1"]}, "support.min_p[row 1]='0.1'"),
        ({"top_k": []}, "support.top_k=[]: per-row values need one entry per row"),
        (
            {"top_k": [1, 2], "top_p": [0.5]},
            "different row counts (support.top_k 2, support.top_p 1)",
        ),
        ({"top_k": [1], "kept_offsets": [0, 1], "kept_ids": [1]}, "not both"),
    ],
)
def test_bad_per_row_rules_name_the_row(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(LogprobContractError) as raised:
        SupportSpec(**kwargs)  # type: ignore[arg-type]
    assert message in str(raised.value)


def test_per_row_rules_give_each_row_its_own() -> None:
    spec = SupportSpec(top_k=np.array([3, 5, 2]), top_p=0.9, min_p=[None, 0.1, None])
    assert spec.per_row and spec.num_rows == 3 and spec.mode is SupportMode.SAMPLING_PARAMS
    assert spec.top_k == (3, 5, 2) and type(spec.top_k[0]) is int
    assert [spec.row_rules(row) for row in range(3)] == [
        (3, 0.9, None),
        (5, 0.9, 0.1),
        (2, 0.9, None),
    ]
    assert spec.rules() == "per-row min_p/top_k/top_p (3 rows)"
    assert spec != SupportSpec(top_k=3, top_p=0.9)
    assert not SupportSpec(top_k=3).per_row and SupportSpec(top_k=3).num_rows is None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"support": SupportSpec(top_k=[1, 2])}, "per-row sampling parameters describe 2 rows"),
        ({"temperature": [0.5, 1.0]}, "temperature: 2 per-row values, expected num_tokens=3"),
        ({"temperature": [0.5, -1.0, 1.0]}, "temperature[row 1]=-1.0: must be a finite float"),
        ({"temperature": [0.5, True, 1.0]}, "temperature[row 1]=True: expected a finite float"),
        ({"temperature": [0.5, 1e-50, 1.0]}, "temperature[row 1]=1e-50: rounds to 0.0 in fp32"),
        ({"temperature": 0.0}, "temperature=0.0: must be a finite float > 0"),
    ],
)
def test_the_contract_checks_per_row_values(changes: dict[str, object], message: str) -> None:
    with pytest.raises(LogprobContractError) as raised:
        _contract(**changes)
    assert message in str(raised.value)


def test_a_heterogeneous_contract_round_trips_as_schema_five() -> None:
    support = SupportSpec(top_k=[3, None, 5], top_p=0.8)
    contract = _contract(support=support, temperature=[0.7, 0.0, 1.5])
    data = contract.to_dict()
    assert data["schema"] == 5 and data["temperature"] == [0.7, 0.0, 1.5]
    assert data["support"]["top_k"] == [3, None, 5] and data["support"]["kept_rows"] is None
    assert json.loads(json.dumps(data)) == data
    again = tpl.LogprobContract.from_dict(data)
    assert again == contract and again.heterogeneous
    assert again.cross_rank_fingerprint() == contract.cross_rank_fingerprint()
    assert again.greedy_rows().tolist() == [False, True, False]
    assert again.row_divisors().tolist() == [np.float32(0.7), 1.0, 1.5]
    assert "T=per-row (3 values, 1 greedy rows)" in contract.describe()
    with pytest.raises(LogprobContractError, match="per-row values have no single divisor"):
        contract.temperature_fp32  # noqa: B018


def test_a_schema_four_document_loads_unchanged() -> None:
    contract = _contract(support=SupportSpec(top_k=4, top_p=0.9), temperature=0.7)
    data = contract.to_dict()
    assert tpl.LogprobContract.from_dict({**data, "schema": 4}) == contract
    assert data["support"]["sha256"] == SupportSpec(top_k=4, top_p=0.9).digest
    assert not contract.heterogeneous and contract.row_divisors().tolist() == [np.float32(0.7)] * 3
