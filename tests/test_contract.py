"""The contract: valid metadata builds, invalid metadata raises LogprobContractError naming it."""

from __future__ import annotations

import json
import math
import pickle
import re

import numpy as np
import pytest
import torch

import tp_logprob as tpl
from tests.helpers.contracts import make_contract, make_sharding
from tp_logprob.contract_schema import CONTRACT_SCHEMA_VERSION


def test_valid_contract_coerces_strings_to_enums() -> None:
    contract = make_contract()
    assert contract.role is tpl.LogprobRole.TRAIN
    assert contract.dtype is tpl.LogprobDType.BF16
    assert contract.reduction.determinism_scope is tpl.DeterminismScope.FIXED_TOPOLOGY
    assert contract.mask_mode is tpl.MaskMode.EXPLICIT_ACTIVE_MASK
    assert contract.sharding.local_bounds == (0, 5)
    assert contract.sharding.live_bounds(1) == (5, 7)


def test_default_reduction_is_cross_tp_bitwise() -> None:
    assert tpl.ReductionSpec().determinism_scope is tpl.DeterminismScope.CROSS_TP_BITWISE


@pytest.mark.parametrize(
    ("padded", "world", "expected"),
    [
        (10, 1, ((0, 10),)),
        (10, 3, ((0, 4), (4, 8), (8, 10))),
        (256, 4, ((0, 64), (64, 128), (128, 192), (192, 256))),
        (7, 7, tuple((i, i + 1) for i in range(7))),
    ],
)
def test_even_shard_bounds(padded: int, world: int, expected: tuple[tuple[int, int], ...]) -> None:
    bounds = tpl.even_shard_bounds(padded, world)
    assert bounds == expected
    assert bounds[-1][1] == padded


@pytest.mark.parametrize(
    ("padded", "world", "message"),
    [
        (4, 5, "more ranks"),
        (5, 4, "leaves a rank without columns"),
        (0, 1, "padded_vocab_size=0"),
        (True, 1, "padded_vocab_size=True"),
        (8, 2.0, "tp_world_size=2.0"),
    ],
)
def test_even_shard_bounds_refuses(padded: object, world: object, message: str) -> None:
    with pytest.raises(tpl.LogprobContractError, match=re.escape(message)):
        tpl.even_shard_bounds(padded, world)  # type: ignore[arg-type]


INVALID_SHARDING = [
    pytest.param({"tp_rank": 2}, "tp_rank=2: must be < tp_world_size=2", id="rank>=world"),
    pytest.param({"tp_rank": -1}, "tp_rank=-1", id="negative-rank"),
    pytest.param({"tp_rank": True}, "tp_rank=True: expected an int", id="bool-rank"),
    pytest.param({"tp_world_size": 0}, "tp_world_size=0", id="zero-world"),
    pytest.param({"real_vocab_size": 9}, "padded_vocab_size=8: must be >=", id="padded<real"),
    pytest.param({"real_vocab_size": "7"}, "real_vocab_size='7'", id="str-real"),
    pytest.param({"vocab_shard_bounds": ((0, 5),)}, "has 1 shards", id="too-few-shards"),
    pytest.param(
        {"vocab_shard_bounds": ((0, 5), (6, 8))}, "vocab_shard_bounds[1]=(6, 8)", id="gap"
    ),
    pytest.param(
        {"vocab_shard_bounds": ((0, 5), (4, 8))}, "vocab_shard_bounds[1]=(4, 8)", id="overlap"
    ),
    pytest.param(
        {"vocab_shard_bounds": ((0, 5), (5, 5))},
        "vocab_shard_bounds[1]=(5, 5): end must be greater than start",
        id="empty-shard",
    ),
    pytest.param(
        {"vocab_shard_bounds": ((0, 5), (5, 7))}, "last end must equal padded", id="short"
    ),
    pytest.param({"vocab_shard_bounds": ((1, 5), (5, 8))}, "expected start 0", id="not-from-0"),
    pytest.param({"vocab_shard_bounds": 5}, "vocab_shard_bounds=5", id="not-a-sequence"),
    pytest.param({"vocab_shard_bounds": ((0, 5), 8)}, "vocab_shard_bounds[1]=8", id="not-pair"),
    pytest.param(
        {"vocab_shard_bounds": ((0, 5.0), (5, 8))}, "vocab_shard_bounds[0][1]=5.0", id="float"
    ),
    pytest.param({"cp_rank": 1}, "cp_rank=1: must be < cp_world_size=1", id="cp-rank"),
]


@pytest.mark.parametrize(("overrides", "message"), INVALID_SHARDING)
def test_invalid_sharding_names_field_and_value(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(tpl.LogprobContractError, match=re.escape(message)):
        make_sharding(**overrides)


INVALID_MASK = [
    pytest.param({"num_tokens": -1}, "num_tokens=-1", id="negative"),
    pytest.param({"num_tokens": 2.0}, "num_tokens=2.0", id="float"),
    pytest.param({"active_mask": [1, 0]}, "use True/False, not 1/0", id="int-mask"),
    pytest.param({"active_mask": [True]}, "has shape (1,), expected (2,)", id="short"),
    pytest.param({"active_mask": "ab"}, "active_mask='ab'", id="string"),
    pytest.param({"active_mask": torch.ones(2)}, "torch.bool tensor", id="float-tensor"),
    pytest.param({"ignore_index": False}, "ignore_index=False", id="bool-ignore"),
]


@pytest.mark.parametrize(("overrides", "message"), INVALID_MASK)
def test_invalid_mask_names_field_and_value(overrides: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"num_tokens": 2, **overrides}
    with pytest.raises(tpl.LogprobContractError, match=re.escape(message)):
        tpl.MaskSpec(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "mask",
    [
        (True, False, True),
        [True, False, True],
        np.array([True, False, True]),
        torch.tensor([True, False, True]),
    ],
    ids=["tuple", "list", "numpy", "torch"],
)
def test_mask_accepts_every_container(mask: object) -> None:
    spec = tpl.MaskSpec(num_tokens=3, active_mask=mask)
    assert spec.active_token_count == 2
    assert spec == tpl.MaskSpec(num_tokens=3, active_mask=[True, False, True])
    assert not spec.active_mask.flags.writeable


def test_mask_is_a_copy() -> None:
    source = np.array([True, True])
    spec = tpl.MaskSpec(num_tokens=2, active_mask=source)
    source[0] = False
    assert spec.active_token_count == 2


INVALID_CONTRACT = [
    pytest.param({"role": "eval"}, "role='eval': expected one of 'train', 'infer'", id="role"),
    pytest.param({"dtype": "fp8"}, "dtype='fp8'", id="dtype"),
    pytest.param({"dtype": None}, "dtype=None", id="dtype-none"),
    pytest.param({"mask": 3}, "mask=3: expected a MaskSpec", id="mask"),
    pytest.param({"sharding": None}, "sharding=None: expected a ShardingSpec", id="sharding"),
    pytest.param({"reduction": "fixed"}, "reduction='fixed'", id="reduction"),
    pytest.param({"export_lse": 1}, "export_lse=1: expected a bool", id="export-int"),
    pytest.param(
        {"mask": tpl.MaskSpec(num_tokens=1, ignore_index=3)},
        "mask.ignore_index=3: lies inside [0, real_vocab_size=7)",
        id="ignore-inside-vocab",
    ),
    pytest.param(
        {"temperature": 0.0},
        "temperature=0.0: must be a finite float > 0; greedy decoding (T=0) has no logprob",
        id="temperature-zero",
    ),
    pytest.param({"temperature": -0.5}, "temperature=-0.5: must be", id="temperature-negative"),
    pytest.param({"temperature": math.nan}, "temperature=nan: must be", id="temperature-nan"),
    pytest.param({"temperature": math.inf}, "temperature=inf: must be", id="temperature-inf"),
    pytest.param({"temperature": True}, "temperature=True: expected a", id="temperature-bool"),
    pytest.param({"temperature": "0.7"}, "temperature='0.7': expected", id="temperature-str"),
    pytest.param({"temperature": 1e-50}, "temperature=1e-50: rounds to 0.0", id="temperature-tiny"),
    pytest.param({"temperature": 1e39}, "temperature=1e+39: rounds to inf", id="temperature-huge"),
    pytest.param({"export_entropy": 1}, "export_entropy=1: expected a bool", id="entropy-int"),
]


def test_temperature_and_entropy_defaults_and_provenance() -> None:
    plain = make_contract()
    assert plain.temperature == 1.0 and plain.export_entropy is False
    hot = make_contract(temperature=0.7, export_entropy=True)
    assert hot.temperature_fp32 == float(np.float32(0.7)) != 0.7
    data = hot.to_dict()
    assert (data["temperature"], data["export_entropy"]) == (0.7, True)
    assert hot.cross_rank_fingerprint() != plain.cross_rank_fingerprint()
    assert make_contract(temperature=0.7).cross_rank_fingerprint() != (hot.cross_rank_fingerprint())
    assert "T=0.7 +entropy" in hot.describe()
    assert tpl.LogprobContract.from_dict(data, hot.mask.active_mask) == hot


def test_schema_one_documents_load_without_temperature_or_entropy() -> None:
    contract = make_contract()
    data = contract.to_dict()
    mask = data["mask"]
    old = {**data, "schema": 1}
    del old["temperature"], old["export_entropy"]
    old["mask"] = {
        "num_tokens": mask["num_tokens"],
        "mode": "per_token",
        "active_count": mask["active_token_count"],
        "ignore_index": mask["ignore_index"],
        "sha256": mask["active_mask_sha256"],
    }
    assert tpl.LogprobContract.from_dict(old, contract.mask.active_mask) == contract


def test_result_unpacks_as_a_pair_without_entropy_and_a_triple_with_it() -> None:
    selected, lse = tpl.LogprobResult("s", "l")
    assert (selected, lse) == ("s", "l")
    result = tpl.LogprobResult("s", None, "h")
    selected, lse, _entropy = result
    assert (result.selected_logp, result.lse, result.entropy) == ("s", None, "h")
    assert tpl.LogprobResult("s", "l").entropy is None
    assert pickle.loads(pickle.dumps(result)) == result
    assert isinstance(pickle.loads(pickle.dumps(result)), tpl.LogprobResult)


def test_mask_mode_is_what_a_backend_needs() -> None:
    assert tpl.MaskSpec(3).mode is tpl.MaskMode.IGNORE_INDEX
    assert tpl.MaskSpec(3, [True, True, True]).mode is tpl.MaskMode.IGNORE_INDEX
    assert tpl.MaskSpec(3, [True, False, True]).mode is tpl.MaskMode.EXPLICIT_ACTIVE_MASK
    explicit, ignore = tpl.MaskMode.EXPLICIT_ACTIVE_MASK, tpl.MaskMode.IGNORE_INDEX
    assert explicit.serves(ignore) and explicit.serves(explicit)
    assert ignore.serves(ignore) and not ignore.serves(explicit)


@pytest.mark.parametrize(("overrides", "message"), INVALID_CONTRACT)
def test_invalid_contract_names_field_and_value(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(tpl.LogprobContractError, match=re.escape(message)):
        make_contract(**overrides)


def test_invalid_reduction_and_output() -> None:
    with pytest.raises(tpl.LogprobContractError, match="determinism_scope='bitwise'"):
        tpl.ReductionSpec("bitwise")  # type: ignore[arg-type]
    with pytest.raises(tpl.LogprobContractError, match=re.escape("output.dtype='fp64'")):
        tpl.LogprobOutputSpec("fp64")  # type: ignore[arg-type]


def test_errors_are_value_and_runtime_errors() -> None:
    assert issubclass(tpl.LogprobContractError, ValueError)
    assert issubclass(tpl.LogprobDispatchError, RuntimeError)


def test_with_rank_keeps_everything_but_the_rank() -> None:
    contract = make_contract()
    other = contract.with_rank(1)
    assert other.sharding.tp_rank == 1
    assert other.sharding.local_bounds == (5, 8)
    assert other.mask == contract.mask
    assert other.cross_rank_fingerprint() == contract.cross_rank_fingerprint()
    with pytest.raises(tpl.LogprobContractError, match="tp_rank=2"):
        contract.with_rank(2)


@pytest.mark.parametrize(
    "change",
    [
        {"dtype": "fp16"},
        {"role": "infer"},
        {"mask": tpl.MaskSpec(num_tokens=3, active_mask=[True, True, False])},
        {"mask": tpl.MaskSpec(num_tokens=3, active_mask=[True, False, True], ignore_index=-1)},
        {"sharding": make_sharding(vocab_shard_bounds=((0, 4), (4, 8)))},
        {"sharding": make_sharding(real_vocab_size=8)},
        {"reduction": tpl.ReductionSpec()},
        {"export_lse": False},
    ],
    ids=["dtype", "role", "mask", "ignore_index", "bounds", "real", "scope", "export_lse"],
)
def test_fingerprint_sees_every_shared_field(change: dict[str, object]) -> None:
    assert (
        make_contract(**change).cross_rank_fingerprint() != make_contract().cross_rank_fingerprint()
    )


def test_to_dict_is_json_and_carries_mask_digest_not_mask() -> None:
    contract = make_contract()
    data = contract.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["schema"] == CONTRACT_SCHEMA_VERSION
    assert data["mask"]["active_token_count"] == 2
    assert data["mask"]["mode"] == "explicit_active_mask" and data["mask"]["explicit"]
    assert len(data["mask"]["active_mask_sha256"]) == 64
    assert '"active_mask":' not in json.dumps(data)
    assert data["sharding"]["local_bounds"] == [0, 5]


def test_to_dict_is_stable() -> None:
    assert json.dumps(make_contract().to_dict()) == json.dumps(make_contract().to_dict())


def test_from_dict_round_trips_and_checks_the_mask_digest() -> None:
    contract = make_contract()
    mask = contract.mask.active_mask
    assert tpl.LogprobContract.from_dict(contract.to_dict(), mask) == contract
    with pytest.raises(tpl.LogprobContractError, match="does not match"):
        tpl.LogprobContract.from_dict(contract.to_dict(), [True, True, True])
    broken = contract.to_dict()
    del broken["sharding"]
    with pytest.raises(tpl.LogprobContractError, match="missing field 'sharding'"):
        tpl.LogprobContract.from_dict(broken, mask)
    tampered = contract.to_dict()
    tampered["role"] = ["train"]
    with pytest.raises(tpl.LogprobContractError, match="role="):
        tpl.LogprobContract.from_dict(tampered, mask)


def test_owner_of_and_describe() -> None:
    sharding = make_sharding()
    assert [sharding.owner_of(v) for v in (0, 4, 5, 7)] == [0, 0, 1, 1]
    with pytest.raises(tpl.LogprobContractError, match="column=8"):
        sharding.owner_of(8)
    assert "tp=0/2" in make_contract().describe()
