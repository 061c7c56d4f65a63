"""Output bits: recorded with an artifact, compared bit for bit on replay where promised."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.artifacts import backend, padding_case
from tests.helpers.portable import portable_backend
from tp_logprob.contract import DeterminismScope, ReductionSpec
from tp_logprob.kernels.builtin import TORCH_NATIVE
from tp_logprob.replay.artifacts import ArtifactError, load_artifact, write_artifact
from tp_logprob.replay.bits import compare_bits, observed_bits, promises_bits
from tp_logprob.replay.catalogue import suite_properties
from tp_logprob.replay.runner import Outcome, replay, replay_paths
from tp_logprob.replay.schema import MAX_RECORDED_ELEMENTS, bits_problems
from tp_logprob.suite.backends import BackendUnderTest

SUITE = suite_properties()


def _portable_case() -> Any:
    case = padding_case()
    reduction = ReductionSpec(DeterminismScope.CROSS_PLATFORM_BITWISE)
    return dataclasses.replace(
        case, contract=dataclasses.replace(case.contract, reduction=reduction)
    )


def _write(tmp_path: Path, chosen: BackendUnderTest, case: Any) -> Path:
    return write_artifact(
        tmp_path, SUITE, prop="oracle", backend=chosen, case=case, params={}, failure="x"
    )


def _recorded_on_gpu(path: Path, flip: str | None = None) -> None:
    """Rewrite the artifact as if recorded on cuda; ``flip`` one bit of that output's first
    element (platform and bits are not part of the content name)."""
    document = json.loads(path.read_text())
    document["platform"] = "cuda"
    if flip is not None:
        entry = document["output_bits"][flip]
        first = int(entry["hex"][:8], 16) ^ 0x01000000  # the lowest bit, little-endian
        entry["hex"] = f"{first:08x}" + entry["hex"][8:]
    path.write_text(json.dumps(document))


def test_an_artifact_records_the_bits_of_its_outputs(tmp_path: Path) -> None:
    chosen = backend("torch_native")
    path = _write(tmp_path, chosen, padding_case())
    document = json.loads(path.read_text())
    assert document["schema_version"] == 5
    bits = observed_bits(chosen, padding_case())
    assert set(document["output_bits"]) == {"selected_logp", "lse"} == set(bits)
    for field, array in bits.items():
        assert document["output_bits"][field]["hex"] == array.astype("<u4").tobytes().hex()
        assert document["output_bits"][field]["shape"] == [2]
    artifact = load_artifact(path, SUITE)
    assert artifact.platform == "cpu"
    for field, array in bits.items():
        np.testing.assert_array_equal(artifact.output_bits[field], array)


def test_bits_bind_only_where_the_backend_claims_both_platforms() -> None:
    portable = portable_backend().capability
    contract = _portable_case().contract
    assert promises_bits(portable, contract, "cuda", "cpu")
    assert not promises_bits(portable, contract, "rocm", "cpu")  # rocm not claimed
    assert not promises_bits(portable, padding_case().contract, "cuda", "cpu")  # not asked
    assert not promises_bits(TORCH_NATIVE, contract, "cpu", "cpu")


def test_replay_of_a_portable_gpu_failure_must_give_its_bits(tmp_path: Path) -> None:
    chosen = portable_backend()
    path = _write(tmp_path, chosen, _portable_case())
    _recorded_on_gpu(path)
    result = replay(load_artifact(path, SUITE), chosen, SUITE)
    assert result.outcome is Outcome.PASSED
    assert result.bits == "identical to those recorded on cuda (lse, selected_logp)"
    _recorded_on_gpu(path, flip="lse")
    result = replay(load_artifact(path, SUITE), chosen, SUITE)
    assert result.outcome is Outcome.FAILED
    assert result.detail.startswith("cross_platform_bitwise: differ from those recorded on cuda")
    assert "lse: 1 of 2 differ, first at [0]" in result.detail
    assert "selected_logp" not in result.detail


def test_a_bit_difference_without_the_promise_is_information(tmp_path: Path) -> None:
    chosen = portable_backend(frozenset({"cpu", "rocm"}))  # not cuda, where it was recorded
    path = _write(tmp_path, chosen, _portable_case())
    _recorded_on_gpu(path, flip="selected_logp")
    result = replay(load_artifact(path, SUITE), chosen, SUITE)
    assert result.outcome is Outcome.PASSED
    assert result.bits.startswith("differ from those recorded on cuda: selected_logp: 1 of 2")
    assert result.bits.endswith("(information only: no bits are promised)")
    out = io.StringIO()
    native = _write(tmp_path, backend("torch_native"), padding_case())
    _recorded_on_gpu(native, flip="lse")
    assert replay_paths([str(native)], "cpu", properties=SUITE, out=out) == 0
    assert "output bits: differ from those recorded on cuda: lse" in out.getvalue()


def test_old_artifacts_replay_without_bits(tmp_path: Path) -> None:
    path = _write(tmp_path, backend("torch_native"), padding_case())
    document = json.loads(path.read_text())
    document["schema_version"] = 3
    document.pop("output_bits")
    document.pop("input_form")  # schema 5 added it
    path.write_text(json.dumps(document))
    artifact = load_artifact(path, SUITE)
    assert artifact.output_bits is None
    assert replay(artifact, backend("torch_native"), SUITE).bits == ""
    document["output_bits"] = None
    path.write_text(json.dumps(document))
    with pytest.raises(ArtifactError, match=r"keys: unexpected \['output_bits'\]"):
        load_artifact(path, SUITE)


def test_compare_names_missing_fields_and_shapes() -> None:
    one = {"lse": np.array([1, 2], np.uint32)}
    assert (
        compare_bits(one, {}, "rocm").detail
        == "differ from those recorded on rocm: lse only recorded"
    )
    wide = {"lse": np.array([1, 2, 3], np.uint32)}
    assert "lse: shape [2] recorded, [3] now" in compare_bits(one, wide, "rocm").detail
    assert compare_bits(one, dict(one), "rocm").identical


@pytest.mark.parametrize(
    ("recorded", "problem"),
    [
        ([], "output_bits: expected an object or null"),
        ({"logits": {"shape": [1], "hex": "00000000"}}, "output_bits.logits: not one of"),
        ({"lse": {"shape": [2], "hex": "00000000"}}, "output_bits.lse.hex: expected 16"),
        ({"lse": {"shape": [1], "hex": "0000000G"}}, "output_bits.lse.hex: expected 8"),
        ({"lse": {"shape": [MAX_RECORDED_ELEMENTS + 1], "hex": ""}}, "output_bits.lse.shape="),
        ({"lse": {"hex": ""}}, "output_bits.lse: expected an object with keys hex, shape"),
    ],
    ids=["not-object", "unknown-field", "short-hex", "not-hex", "too-large", "no-shape"],
)
def test_malformed_bits_are_refused(recorded: Any, problem: str) -> None:
    assert any(line.startswith(problem) for line in bits_problems(recorded))


@pytest.mark.parametrize("name", ["torch_portable", "triton_portable"])
def test_a_portable_backend_replays_a_gpu_artifact_bit_for_bit(tmp_path: Path, name: str) -> None:
    chosen = backend(name)
    assert promises_bits(chosen.capability, _portable_case().contract, "rocm", "cpu")
    path = _write(tmp_path, chosen, _portable_case())
    _recorded_on_gpu(path)
    assert replay(load_artifact(path, SUITE), chosen, SUITE).bits.startswith("identical")
    _recorded_on_gpu(path, flip="selected_logp")
    result = replay(load_artifact(path, SUITE), chosen, SUITE)
    assert result.outcome is Outcome.FAILED
    assert "cross_platform_bitwise: differ from those recorded on cuda" in result.detail
