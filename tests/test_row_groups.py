"""Row groups of a heterogeneous batch: which rows share their parameters, and the
contract of each group (docs/semantics.md, "Heterogeneous batches")."""

from __future__ import annotations

import numpy as np

import tp_logprob as tpl
from tp_logprob import SupportSpec
from tp_logprob.row_groups import contract_rows, row_groups, rule_groups


def _contract(num_tokens: int, **fields: object) -> tpl.LogprobContract:
    active = [row != 2 for row in range(num_tokens)]
    return tpl.LogprobContract(
        role="infer",
        dtype="bf16",
        mask=tpl.MaskSpec(num_tokens, active),
        sharding=tpl.ShardingSpec(0, 2, tpl.even_shard_bounds(16, 2), 12, 16),
        reduction=tpl.ReductionSpec("fixed_topology"),
        **fields,  # type: ignore[arg-type]
    )


def test_one_set_per_batch_is_one_group_of_every_row() -> None:
    contract = _contract(4, temperature=0.7, support=SupportSpec(top_k=3))
    (group,) = row_groups(contract)
    assert group.rows.tolist() == [0, 1, 2, 3] and group.contract is contract


def test_rows_group_by_temperature_and_rules_and_greedy_rows_drop_their_rules() -> None:
    support = SupportSpec(top_k=[3, 3, None, 5, 3, 2], top_p=0.9)
    contract = _contract(6, temperature=[0.7, 0.7, 1.0, 0.7, 0.0, 0.0], support=support)
    groups = row_groups(contract)
    assert [group.rows.tolist() for group in groups] == [[0, 1], [2], [3], [4, 5]]
    first, single, other, greedy = (group.contract for group in groups)
    assert (first.temperature, first.support) == (0.7, SupportSpec(top_k=3, top_p=0.9))
    assert (single.temperature, single.support) == (1.0, SupportSpec(top_p=0.9))
    assert other.support == SupportSpec(top_k=5, top_p=0.9)
    assert (greedy.temperature, greedy.support) == (1.0, SupportSpec(top_p=1.0))
    assert not any(group.contract.heterogeneous for group in groups)
    assert single.mask.dense().tolist() == [False]  # row 2 is inactive
    assert first.sharding == contract.sharding and first.dtype is contract.dtype


def test_a_greedy_row_without_rules_joins_the_rows_at_temperature_one() -> None:
    contract = _contract(3, temperature=[1.0, 0.0, 0.5])
    assert [group.rows.tolist() for group in row_groups(contract)] == [[0, 1], [2]]
    assert row_groups(contract)[0].contract.support is None


def test_a_replayed_mask_groups_by_temperature_and_keeps_each_rows_ids() -> None:
    kept = [[1], [2, 3], [], [0, 11]]
    contract = _contract(
        4, temperature=[0.5, 2.0, 0.5, 0.0], support=SupportSpec.from_kept_lists(kept)
    )
    groups = row_groups(contract)
    assert [group.rows.tolist() for group in groups] == [[0, 2], [1], [3]]
    first = groups[0].contract.support
    assert first is not None and [first.kept_row(r).tolist() for r in range(2)] == [[1], []]
    greedy = groups[2].contract
    assert greedy.temperature == 1.0 and greedy.support is not None
    assert greedy.support.kept_row(0).tolist() == [0, 11]


def test_contract_rows_picks_every_per_row_value_in_order_with_repeats() -> None:
    support = SupportSpec(top_k=[3, None, 5], min_p=[0.1, 0.2, None])
    contract = _contract(3, temperature=[0.7, 0.0, 1.5], support=support)
    picked = contract_rows(contract, np.array([2, 0, 2]))
    assert picked.temperature == (1.5, 0.7, 1.5)
    assert picked.support == SupportSpec(top_k=[5, 3, 5], min_p=[None, 0.1, None])
    assert picked.mask.dense().tolist() == [False, True, False]


def test_an_empty_heterogeneous_batch_is_one_empty_group_at_temperature_one() -> None:
    contract = _contract(0, temperature=[])
    (group,) = row_groups(contract)
    assert group.rows.tolist() == [] and group.contract.temperature == 1.0


def test_rule_groups_keep_each_rows_temperature_and_share_one_set_of_rules() -> None:
    support = SupportSpec(top_k=[3, 3, None, 3, 3, 2], top_p=0.9)
    contract = _contract(6, temperature=[0.7, 1.3, 1.0, 0.0, 0.0, 2.0], support=support)
    groups = rule_groups(contract)
    assert [group.rows.tolist() for group in groups] == [[0, 1], [2], [3, 4], [5]]
    sampled, single, greedy, last = (group.contract for group in groups)
    assert sampled.temperature == (0.7, 1.3)
    assert sampled.support == SupportSpec(top_k=3, top_p=0.9)
    assert single.support == SupportSpec(top_p=0.9)
    assert greedy.temperature == (0.0, 0.0) and greedy.support == SupportSpec(top_p=1.0)
    assert greedy.row_divisors().tolist() == [1.0, 1.0]
    assert last.support == SupportSpec(top_k=2, top_p=0.9)
    assert len(row_groups(contract)) == 5


def test_rule_groups_of_temperatures_alone_are_one_call() -> None:
    contract = _contract(3, temperature=[0.7, 0.0, 1.3])
    (group,) = rule_groups(contract)
    assert group.rows.tolist() == [0, 1, 2] and group.contract == contract
    assert contract.row_divisors().tolist() == [np.float32(0.7), 1.0, np.float32(1.3)]
