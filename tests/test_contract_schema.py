"""Older contract documents upgrade to the current schema one version at a time."""

from __future__ import annotations

import copy

import pytest

import tp_logprob as tpl
from tp_logprob.contract_schema import CONTRACT_SCHEMA_VERSION, READABLE_SCHEMAS, upgrade

CONTRACT = tpl.LogprobContract(
    role=tpl.LogprobRole.TRAIN,
    dtype=tpl.LogprobDType.BF16,
    mask=tpl.MaskSpec(num_tokens=2),
    sharding=tpl.ShardingSpec(0, 1, ((0, 8),), 8, 8),
    reduction=tpl.ReductionSpec(),
)


def schema_one_document() -> dict[str, object]:
    """:data:`CONTRACT` as schema 1 wrote it."""
    data = CONTRACT.to_dict()
    del data["temperature"], data["export_entropy"], data["input"], data["support"]
    mask = data["mask"]
    data["mask"] = {
        "num_tokens": mask["num_tokens"],
        "ignore_index": mask["ignore_index"],
        "sha256": mask["active_mask_sha256"],
    }
    return {**data, "schema": 1}


def test_a_schema_one_document_gains_every_later_field_and_is_not_changed() -> None:
    old = schema_one_document()
    before = copy.deepcopy(old)
    document = upgrade(old)
    assert old == before
    assert document["schema"] == CONTRACT_SCHEMA_VERSION == READABLE_SCHEMAS[-1]
    assert (document["temperature"], document["export_entropy"]) == (1.0, False)
    assert document["mask"]["active_mask_sha256"] == old["mask"]["sha256"]  # type: ignore[index]
    assert document["input"] == {
        "kind": "logits",
        "hidden_size": None,
        "has_bias": False,
        "allow_tf32": False,
    }
    assert document["support"] is None
    assert tpl.LogprobContract.from_dict(old) == CONTRACT


def test_a_current_document_is_returned_as_it_is() -> None:
    current = upgrade(schema_one_document())
    assert upgrade(current) == current


@pytest.mark.parametrize(
    "schema", [0, CONTRACT_SCHEMA_VERSION + 1, str(CONTRACT_SCHEMA_VERSION), None]
)
def test_an_unreadable_schema_names_the_value(schema: object) -> None:
    with pytest.raises(tpl.LogprobContractError, match=rf"schema={schema!r}: expected one of"):
        upgrade({**schema_one_document(), "schema": schema})
