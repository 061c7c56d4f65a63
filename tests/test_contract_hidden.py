"""The input kind: hidden-state contracts, their validation, provenance and dispatch."""

from __future__ import annotations

import dataclasses
import re

import pytest

import tp_logprob as tpl
from tp_logprob.contract_schema import CONTRACT_SCHEMA_VERSION
from tp_logprob.kernels.builtin import (
    TORCH_NATIVE,
    TORCH_NATIVE_FUSED,
    register_builtin_backends,
)
from tp_logprob.kernels.native_fused import torch_native_fused_logprob
from tp_logprob.replay.schema import capability_from_dict


def make_contract(**overrides: object) -> tpl.LogprobContract:
    fields: dict[str, object] = {
        "role": "train",
        "dtype": "bf16",
        "mask": tpl.MaskSpec(num_tokens=3, active_mask=[True, False, True]),
        "sharding": tpl.ShardingSpec(0, 2, ((0, 5), (5, 8)), 7, 8),
        "reduction": tpl.ReductionSpec("fixed_topology"),
        "input_kind": "hidden",
        "hidden_size": 16,
    }
    fields.update(overrides)
    return tpl.LogprobContract(**fields)  # type: ignore[arg-type]


def test_defaults_keep_the_logits_contract() -> None:
    contract = make_contract(input_kind="logits", hidden_size=None)
    assert contract.input_kind is tpl.LogprobInputKind.LOGITS
    assert (contract.hidden_size, contract.has_bias, contract.allow_tf32) == (None, False, False)
    hidden = make_contract(has_bias=True)
    assert hidden.input_kind is tpl.LogprobInputKind.HIDDEN and hidden.hidden_size == 16


INVALID = [
    ({"input_kind": "embeddings"}, "input_kind='embeddings': expected one of 'logits', 'hidden'"),
    ({"input_kind": 1}, "input_kind=1"),
    ({"hidden_size": None}, "hidden_size=None: input_kind='hidden' needs"),
    ({"hidden_size": 0}, "hidden_size=0: must be >= 1"),
    ({"hidden_size": -4}, "hidden_size=-4: must be >= 1"),
    ({"hidden_size": 16.0}, "hidden_size=16.0: expected an int"),
    ({"hidden_size": True}, "hidden_size=True: expected an int"),
    ({"hidden_size": "16"}, "hidden_size='16': expected an int"),
    ({"has_bias": 1}, "has_bias=1: expected a bool"),
    ({"allow_tf32": "no"}, "allow_tf32='no': expected a bool"),
    ({"input_kind": "logits", "hidden_size": 16}, "hidden_size=16: only meaningful with"),
    ({"input_kind": "logits", "hidden_size": None, "has_bias": True}, "has_bias=True: only"),
    ({"input_kind": "logits", "hidden_size": None, "allow_tf32": True}, "allow_tf32=True: only"),
]


@pytest.mark.parametrize(("change", "message"), INVALID, ids=[m for _, m in INVALID])
def test_invalid_input_fields_raise_naming_the_field(
    change: dict[str, object], message: str
) -> None:
    with pytest.raises(tpl.LogprobContractError, match=re.escape(message)):
        make_contract(**change)


def test_positional_construction_still_works() -> None:
    base = make_contract(input_kind="logits", hidden_size=None)
    positional = tpl.LogprobContract(
        base.role,
        base.dtype,
        base.mask,
        base.sharding,
        base.reduction,
        base.output,
        True,
        1.0,
        False,
    )
    assert positional == base


def test_provenance_round_trips_and_fingerprint_sees_the_input_fields() -> None:
    contract = make_contract(has_bias=True)
    data = contract.to_dict()
    assert data["schema"] == CONTRACT_SCHEMA_VERSION == 5
    assert data["input"] == {
        "kind": "hidden",
        "hidden_size": 16,
        "has_bias": True,
        "allow_tf32": False,
    }
    assert tpl.LogprobContract.from_dict(data, contract.mask.active_mask) == contract
    prints = {
        make_contract(**change).cross_rank_fingerprint()
        for change in (
            {},
            {"hidden_size": 32},
            {"has_bias": True},
            {"allow_tf32": True},
            {"input_kind": "logits", "hidden_size": None},
        )
    }
    assert len(prints) == 5
    assert contract.with_rank(1).cross_rank_fingerprint() == contract.cross_rank_fingerprint()
    assert "hidden H=16 +bias" in contract.describe()
    assert "hidden" not in make_contract(input_kind="logits", hidden_size=None).describe()


def test_schema_two_documents_load_as_logits_contracts() -> None:
    contract = make_contract(input_kind="logits", hidden_size=None, temperature=0.5)
    old = {**contract.to_dict(), "schema": 2}
    del old["input"]
    assert tpl.LogprobContract.from_dict(old, contract.mask.active_mask) == contract
    with pytest.raises(tpl.LogprobContractError, match="missing field 'input'"):
        tpl.LogprobContract.from_dict({**old, "schema": 3}, contract.mask.active_mask)


def test_capability_input_kinds_are_validated_and_recorded() -> None:
    assert TORCH_NATIVE.input_kinds == frozenset({tpl.LogprobInputKind.LOGITS})
    assert TORCH_NATIVE_FUSED.to_dict()["input_kinds"] == ["hidden"]
    for bad, message in ((frozenset(), "must not be empty"), ("hidden", "expected an iterable")):
        with pytest.raises(
            tpl.LogprobContractError, match=re.escape(f"input_kinds={bad!r}: {message}")
        ):
            dataclasses.replace(TORCH_NATIVE, input_kinds=bad)
    recorded = TORCH_NATIVE.to_dict()
    del recorded["input_kinds"]  # recorded before the fused LM head
    assert capability_from_dict(recorded) == TORCH_NATIVE
    assert capability_from_dict(TORCH_NATIVE_FUSED.to_dict()) == TORCH_NATIVE_FUSED


def test_rejection_reasons_name_the_input_kind_both_ways() -> None:
    hidden = make_contract()
    logits = make_contract(input_kind="logits", hidden_size=None)
    assert "input_kind 'hidden' not in input_kinds ['logits']" in TORCH_NATIVE.incompatibilities(
        hidden
    )
    assert "input_kind 'logits' not in input_kinds ['hidden']" in (
        TORCH_NATIVE_FUSED.incompatibilities(logits)
    )
    assert TORCH_NATIVE_FUSED.supports(hidden) and TORCH_NATIVE.supports(logits)
    tf32 = TORCH_NATIVE_FUSED.incompatibilities(make_contract(allow_tf32=True))
    assert any("allow_tf32=True" in reason for reason in tf32)


def test_a_fused_backend_without_bias_says_so_and_is_sent_no_bias() -> None:
    no_bias = dataclasses.replace(TORCH_NATIVE_FUSED, supports_bias=False)
    assert no_bias.supports(make_contract())
    assert "has_bias=True requested but supports_bias=False" in no_bias.incompatibilities(
        make_contract(has_bias=True)
    )
    assert TORCH_NATIVE_FUSED.supports(make_contract(has_bias=True))
    with pytest.raises(tpl.LogprobContractError, match="supports_bias=1: expected a bool"):
        dataclasses.replace(TORCH_NATIVE_FUSED, supports_bias=1)
    recorded = TORCH_NATIVE_FUSED.to_dict()
    del recorded["supports_bias"]  # recorded before supports_bias: bias was served
    assert capability_from_dict(recorded).supports_bias


@pytest.fixture
def registry() -> tpl.KernelRegistry:
    """A fresh registry of the built-in backends, fused ones included."""
    registry = tpl.KernelRegistry()
    register_builtin_backends(registry)
    return registry


def test_the_default_registry_holds_the_fused_backend() -> None:
    assert any(cap.backend_id == "torch_native_fused" for cap in tpl.registry.backends("cpu"))


def test_dispatch_picks_the_fused_backend_for_hidden_only(registry: tpl.KernelRegistry) -> None:
    hidden = make_contract()
    logits = make_contract(input_kind="logits", hidden_size=None)
    chosen = registry.get_logprob_op(hidden, platform="cpu", preflighted=True)
    assert chosen.capability.backend_id == "torch_native_fused"
    assert registry.get_logprob_op(
        logits, platform="cpu", preflighted=True
    ).capability.backend_id != ("torch_native_fused")
    with pytest.raises(tpl.LogprobDispatchError, match="input_kind 'hidden' not in"):
        registry.get_logprob_op(hidden, "torch_native", platform="cpu")
    with pytest.raises(tpl.LogprobDispatchError, match="input_kind 'logits' not in"):
        registry.get_logprob_op(logits, "torch_native_fused", platform="cpu")
    assert chosen.op is torch_native_fused_logprob
    with pytest.raises(tpl.LogprobDispatchError, match="allow_tf32=True"):
        registry.get_logprob_op(make_contract(allow_tf32=True), platform="cpu", preflighted=True)
