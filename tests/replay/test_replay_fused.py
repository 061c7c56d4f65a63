"""Fused LM-head failures as artifacts: operands round trip, replay, tampering is refused."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers.artifacts import backend, padding_case
from tp_logprob.contract import LogprobContract, MaskSpec, ReductionSpec, ShardingSpec
from tp_logprob.kernels.builtin import TORCH_NATIVE_FUSED
from tp_logprob.kernels.native_fused import torch_native_fused_logprob
from tp_logprob.oracle import exact_hidden_logits
from tp_logprob.replay.artifacts import (
    SCHEMA_VERSION,
    ArtifactError,
    load_artifact,
    write_artifact,
)
from tp_logprob.replay.catalogue import suite_properties
from tp_logprob.replay.runner import replay_paths
from tp_logprob.result import LogprobResult
from tp_logprob.strategies import HiddenCase, LogprobCase, round_to_dtype

SUITE = suite_properties()

ROOT = Path(__file__).resolve().parents[2]
BROKEN = "tests.replay.test_replay_fused:BROKEN_FUSED"


def _broken_fused(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
    *,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> LogprobResult:
    """torch_native_fused with 1e-3 added to every selected logprob."""
    result = torch_native_fused_logprob(hidden, targets, contract, group, weight=weight, bias=bias)
    return LogprobResult(result.selected_logp + 1e-3, result.lse, result.entropy)


BROKEN_FUSED = (_broken_fused, dataclasses.replace(TORCH_NATIVE_FUSED, backend_id="broken_fused"))


def fused_case(*, has_bias: bool = True, hidden_value: float | None = None) -> HiddenCase:
    """bf16, TP=2 with a padding column, row 1 inactive with NaN hidden; garbage padding rows.

    ``hidden_value`` replaces ``hidden[0, 0]`` (the logits follow it).
    """
    contract = LogprobContract(
        role="train",
        dtype="bf16",
        mask=MaskSpec(2, np.array([True, False])),
        sharding=ShardingSpec(0, 2, ((0, 3), (3, 5)), 4, 5),
        reduction=ReductionSpec("fixed_topology"),
        input_kind="hidden",
        hidden_size=3,
        has_bias=has_bias,
    )
    rng = np.random.default_rng(7)
    hidden = round_to_dtype(rng.standard_normal((2, 3)), "bf16")
    hidden[1] = np.nan
    if hidden_value is not None:
        hidden[0, 0] = hidden_value
    weight = round_to_dtype(rng.standard_normal((5, 3)), "bf16")
    weight[4] = [np.nan, np.inf, 1.0]
    bias = round_to_dtype(rng.standard_normal(5), "bf16") if has_bias else None
    if bias is not None:
        bias[4] = -np.inf
    logits = exact_hidden_logits(hidden, weight, bias).astype(np.float32)
    return HiddenCase(
        contract, logits, np.array([2, -100]), hidden=hidden, weight=weight, bias=bias
    )


def write_fused(directory: Path, case: LogprobCase | None = None, prop: str = "oracle") -> Path:
    return write_artifact(
        directory,
        SUITE,
        prop=prop,
        backend=backend("torch_native_fused"),
        case=fused_case() if case is None else case,
        params={},
        failure="recorded by tests/replay/test_replay_fused.py",
        seed=1234,
    )


@pytest.mark.parametrize("has_bias", [True, False], ids=["bias", "no bias"])
def test_hidden_case_round_trip(tmp_path: Path, has_bias: bool) -> None:
    case = fused_case(has_bias=has_bias)
    finite = np.isfinite(case.logits)
    assert not np.array_equal(round_to_dtype(case.logits, "bf16")[finite], case.logits[finite])
    path = write_fused(tmp_path, case)
    artifact = load_artifact(path, SUITE)
    assert isinstance(artifact.case, HiddenCase)
    assert artifact.case.digest() == case.digest()
    for name in ("hidden", "weight", "bias"):
        stored, original = getattr(artifact.case, name), getattr(case, name)
        if original is None:
            assert stored is None
        else:
            np.testing.assert_array_equal(stored, original)
    document = json.loads(path.read_text())
    assert document["schema_version"] == SCHEMA_VERSION
    expected = {"logits", "targets", "mask", "hidden", "weight"} | ({"bias"} if has_bias else set())
    assert set(document["arrays"]) == expected
    assert document["arrays"]["weight"] == {"dtype": "float32", "shape": [5, 3]}


def test_version_1_logits_artifacts_still_load(tmp_path: Path) -> None:
    path = write_artifact(
        tmp_path,
        SUITE,
        prop="oracle",
        backend=backend("torch_native"),
        case=padding_case(),
        params={},
        failure="x",
    )
    document = json.loads(path.read_text())
    document["schema_version"] = 1
    document.pop("output_bits")  # schema 4 added it
    document.pop("input_form")  # schema 5 added it
    path.write_text(json.dumps(document))
    assert load_artifact(path, SUITE).case == padding_case()


def _edit(
    arrays: Callable[[dict[str, np.ndarray[Any, Any]]], None] | None = None,
    document: Callable[[dict[str, Any]], None] | None = None,
) -> Callable[[Path], None]:
    """Change the stored arrays and/or the JSON in place (the name is not recomputed)."""

    def edit(path: Path) -> None:
        data = json.loads(path.read_text())
        if arrays is not None:
            npz = path.with_suffix(".npz")
            with np.load(npz, allow_pickle=False) as stored:
                found = {key: np.array(stored[key]) for key in stored.files}
            arrays(found)
            buffer = io.BytesIO()
            np.savez(buffer, allow_pickle=False, **found)
            npz.write_bytes(buffer.getvalue())
            data["arrays"] = {
                key: {"dtype": value.dtype.name, "shape": list(value.shape)}
                for key, value in found.items()
            }
        if document is not None:
            document(data)
        path.write_text(json.dumps(data))

    return edit


def _set_weight(arrays: dict[str, np.ndarray[Any, Any]]) -> None:
    arrays["weight"][0, 0] = 0.5 if arrays["weight"][0, 0] != 0.5 else 0.25


def _drop(name: str) -> Callable[[dict[str, np.ndarray[Any, Any]]], None]:
    def drop(arrays: dict[str, np.ndarray[Any, Any]]) -> None:
        del arrays[name]

    return drop


def _schema_1(document: dict[str, Any]) -> None:
    document["schema_version"] = 1
    document.pop("output_bits")  # schema 4 added it
    document.pop("input_form")  # schema 5 added it


TAMPERED: dict[str, tuple[Callable[[Path], None], tuple[str, ...]]] = {
    "weight changed after writing": (_edit(_set_weight), ("logits:", "weight")),
    "weight missing": (_edit(_drop("weight")), ("weight: missing",)),
    "bias missing": (_edit(_drop("bias")), ("bias: missing",)),
    "hidden of another hidden size": (
        _edit(lambda a: a.__setitem__("hidden", np.zeros((2, 4), np.float32))),
        ("hidden: float32 [2, 4], the contract needs float32 [2, 3]",),
    ),
    "hidden stored as float64": (
        _edit(lambda a: a.__setitem__("hidden", a["hidden"].astype(np.float64))),
        ("arrays.hidden.dtype='float64'",),
    ),
    "schema 1 cannot hold a fused case": (_edit(document=_schema_1), ("schema_version=1",)),
}


@pytest.mark.parametrize("tamper", list(TAMPERED))
def test_tampered_fused_artifact_is_refused(tmp_path: Path, tamper: str) -> None:
    edit, messages = TAMPERED[tamper]
    path = write_fused(tmp_path)
    edit(path)
    with pytest.raises(ArtifactError, match="refused") as caught:
        load_artifact(path, SUITE)
    for message in messages:
        assert message in str(caught.value)


def _nan_at(name: str, index: tuple[int, ...]) -> Callable[[HiddenCase], HiddenCase]:
    """``case`` with NaN at ``name[index]`` and the logits that follow from it."""

    def change(case: HiddenCase) -> HiddenCase:
        found = {"hidden": case.hidden, "weight": case.weight, "bias": case.bias}
        operands: dict[str, Any] = {
            key: None if value is None else np.array(value) for key, value in found.items()
        }
        operands[name][index] = np.nan
        logits = exact_hidden_logits(operands["hidden"], operands["weight"], operands["bias"])
        return HiddenCase(case.contract, logits.astype(np.float32), case.targets, **operands)

    return change


# Written with a matching name: only the checks on the operands themselves can refuse these.
INCONSISTENT: dict[str, tuple[Callable[[], HiddenCase], str]] = {
    "bf16 contract, hidden value not bf16": (
        lambda: fused_case(hidden_value=1.0 + 2.0**-12),
        "hidden: values not representable in bf16 (hidden[0, 0]=1.000244140625)",
    ),
    "logits not those of the operands": (
        lambda: dataclasses.replace(fused_case(), logits=fused_case().logits + np.float32(1.0)),
        "logits: 4 of 10 differ from fp32(exact hidden @ weight.T + bias)",
    ),
    "NaN in an active hidden row": (
        lambda: _nan_at("hidden", (0, 1))(fused_case()),
        "hidden[0, 1]=nan: only inactive rows may hold a non-finite value",
    ),
    "NaN in a live weight row": (
        lambda: _nan_at("weight", (3, 2))(fused_case()),
        "weight[3, 2]=nan: live rows (< real_vocab_size=4) must be finite",
    ),
    "NaN in a live bias entry": (
        lambda: _nan_at("bias", (1,))(fused_case()),
        "bias[1]=nan: live rows (< real_vocab_size=4) must be finite",
    ),
}


@pytest.mark.parametrize("problem", list(INCONSISTENT))
def test_inconsistent_fused_case_is_refused(tmp_path: Path, problem: str) -> None:
    make, message = INCONSISTENT[problem]
    path = write_fused(tmp_path, make())
    with pytest.raises(ArtifactError, match="refused") as caught:
        load_artifact(path, SUITE)
    assert message in str(caught.value)


def test_operands_in_a_logits_artifact_are_refused(tmp_path: Path) -> None:
    path = write_artifact(
        tmp_path,
        SUITE,
        prop="oracle",
        backend=backend("torch_native"),
        case=padding_case(),
        params={},
        failure="x",
    )
    _edit(lambda a: a.__setitem__("weight", np.zeros((5, 3), np.float32)))(path)
    with pytest.raises(ArtifactError, match="weight: a fused LM-head operand"):
        load_artifact(path, SUITE)


def test_a_hidden_contract_needs_a_hidden_case_to_be_written(tmp_path: Path) -> None:
    case = fused_case()
    plain = padding_case().replace(contract=case.contract, logits=case.logits)
    with pytest.raises(ValueError, match="not a HiddenCase"):
        write_fused(tmp_path, plain)
    assert not list(tmp_path.iterdir())


def test_replay_prints_the_operands(tmp_path: Path) -> None:
    path = write_fused(tmp_path)
    out = io.StringIO()
    assert replay_paths([str(path)], "cpu", [BROKEN], properties=SUITE, out=out) == 1
    text = out.getvalue()
    assert text.startswith("FAIL") and "oracle on broken_fused" in text
    assert "hidden H=3 +bias" in text and ", 1 rows with NaN hidden" in text
    assert "operands: hidden [2, 3], weight [5, 3], bias [5] (bf16 values)" in text
    assert "drift vs exact" in text
    fixed = io.StringIO()
    assert (
        replay_paths([str(path)], "cpu", ["torch_native_fused"], properties=SUITE, out=fixed) == 0
    )


def test_failing_fused_property_writes_an_artifact_that_replays(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "TP_LOGPROB_HYPOTHESIS_DB": str(tmp_path / "db"),
        "TP_LOGPROB_ARTIFACTS": str(tmp_path / "failures"),
    }
    env.pop("TRITON_INTERPRET", None)
    suite = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--pyargs",
            "tp_logprob.properties.test_fused",
            "-k",
            "fused_matches_exact_oracle",
            f"--tp-logprob-backend={BROKEN}",
            "--tp-logprob-platform=cpu",
            "--tp-logprob-profile=ci",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "-q",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert suite.returncode == 1, suite.stdout[-3000:] + suite.stderr[-2000:]
    written = sorted((tmp_path / "failures").iterdir())
    assert [p.suffix for p in written] == [".json", ".npz"], written
    artifact = load_artifact(written[0], SUITE)
    assert artifact.prop == "oracle" and artifact.backend_spec == BROKEN
    assert isinstance(artifact.case, HiddenCase)
    assert f"python -m tp_logprob replay {written[0]}" in suite.stdout

    def replay_on(spec: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "tp_logprob", "replay", str(written[0])]
        return subprocess.run(
            [*command, "--backend", spec, "--platform", "cpu"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    broken = replay_on(BROKEN)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert broken.stdout.startswith("FAIL") and "oracle on broken_fused" in broken.stdout
    assert "operands: hidden [" in broken.stdout
    fixed = replay_on("torch_native_fused")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert fixed.stdout.startswith("PASS")
