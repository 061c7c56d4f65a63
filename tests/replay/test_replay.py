"""Failure artifacts: written once and atomically, loaded only when valid, replayed anywhere."""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.artifacts import MUTANT, backend, padding_case, write_padding_artifact
from tp_logprob.__main__ import main
from tp_logprob.contract import LogprobInputKind
from tp_logprob.kernels.builtin import TORCH_NATIVE
from tp_logprob.properties.test_metamorphic import padding_ignored
from tp_logprob.replay.artifacts import ArtifactError, load_artifact, write_artifact
from tp_logprob.replay.catalogue import suite_properties
from tp_logprob.replay.pin import pin
from tp_logprob.replay.runner import Outcome, replay, replay_paths
from tp_logprob.strategies import LogprobCase
from tp_logprob.suite.backends import resolve_backends

SUITE = suite_properties()


def test_artifact_round_trip(tmp_path: Path) -> None:
    path = write_padding_artifact(tmp_path)
    artifact = load_artifact(path, SUITE)
    assert artifact.name == path.stem and len(artifact.name) == 64
    assert artifact.case == padding_case()
    np.testing.assert_array_equal(artifact.params["padding"], np.float32([[1e30], [np.nan]]))
    document = json.loads(path.read_text())
    assert document["backend"]["spec"] == MUTANT
    assert document["hypothesis_seed"] == 1234 and document["platform"] == "cpu"
    assert document["contract"] == padding_case().contract.to_dict()
    assert set(document["environment"]["packages"]) >= {"torch", "triton", "hypothesis"}
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".npz"]


def test_same_case_same_name_and_concurrent_writers(tmp_path: Path) -> None:
    paths: list[Path] = []
    threads = [
        threading.Thread(target=lambda: paths.append(write_padding_artifact(tmp_path)))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(paths)) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [paths[0].name, paths[0].stem + ".npz"]
    load_artifact(paths[0], SUITE)
    other = write_padding_artifact(tmp_path, spec="torch_native")
    assert other != paths[0]  # the backend is part of the content


def test_a_property_run_tags_the_failing_case() -> None:
    case = padding_case()
    params = {"padding": np.array([[1e30], [np.nan]], np.float32)}
    with pytest.raises(AssertionError) as caught:
        padding_ignored.run(backend(MUTANT), case, params)
    record = caught.value.tp_logprob_failure  # type: ignore[attr-defined]
    assert record.prop == "padding_ignored" and record.case == case
    padding_ignored.run(backend("torch_native"), case, params)


def test_replay_passes_on_the_fixed_backend_and_fails_on_the_buggy_one(tmp_path: Path) -> None:
    artifact = load_artifact(write_padding_artifact(tmp_path), SUITE)
    assert replay(artifact, backend("torch_native"), SUITE).outcome is Outcome.PASSED
    failed = replay(artifact, backend(MUTANT), SUITE)
    assert failed.outcome is Outcome.FAILED
    assert "padding independence" in failed.detail
    out = io.StringIO()
    assert replay_paths([str(tmp_path)], "cpu", [MUTANT], properties=SUITE, out=out) == 1
    assert "drift vs exact" in out.getvalue() and "tolerance ulp" in out.getvalue()


def test_a_real_group_only_backend_is_not_replayed_on_the_emulated_group(tmp_path: Path) -> None:
    artifact = load_artifact(write_padding_artifact(tmp_path), SUITE)
    only_real = dataclasses.replace(
        backend("torch_native"),
        capability=dataclasses.replace(TORCH_NATIVE, real_group_only=True),
    )
    result = replay(artifact, only_real, SUITE)
    assert result.outcome is Outcome.SKIPPED
    assert "real process group (real_group_only): rerun tests/replay" in result.detail


def test_recorded_module_backend_must_be_named_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_padding_artifact(tmp_path)
    assert main(["replay", str(tmp_path), "--platform", "cpu"]) == 2
    out = capsys.readouterr().out
    assert "never imports a module named in an artifact" in out
    assert f"--backend {MUTANT}" in out
    assert main(["replay", str(tmp_path), "--platform", "cpu", "--backend", "torch_native"]) == 0
    assert main(["replay", str(tmp_path), "--platform", "cpu", "--backend", MUTANT]) == 1


def test_replay_of_a_registered_backend_and_all_backends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:

    write_padding_artifact(tmp_path, spec="torch_native")
    assert main(["replay", str(tmp_path), "--platform", "cpu"]) == 0
    assert "PASS" in capsys.readouterr().out
    status = main(["replay", str(tmp_path), "--platform", "cpu", "--all-backends"])
    if os.environ.get("TRITON_INTERPRET") is None and importlib.util.find_spec("triton"):
        # In-process, the interpreter cannot be switched on after the fact: say how instead.
        assert status == 2
        assert "TRITON_INTERPRET=1 -m tp_logprob replay" in capsys.readouterr().err
    else:
        assert status == 0
        out = capsys.readouterr().out
        takes_logits = [
            b
            for b in resolve_backends([], "cpu")
            if LogprobInputKind.LOGITS in b.capability.input_kinds
        ]
        assert out.count("PASS") == len(takes_logits)
        assert out.count("not applicable: input_kind 'logits'") == (
            len(resolve_backends([], "cpu")) - len(takes_logits)
        )


def test_pin_copies_a_validated_pair(tmp_path: Path) -> None:
    source = write_padding_artifact(tmp_path / "failures")
    pinned = pin(source, SUITE, tmp_path / "regressions")
    assert [a.json_path for a in pinned] == [tmp_path / "regressions" / source.name]
    assert (tmp_path / "regressions" / source.with_suffix(".npz").name).read_bytes() == (
        source.with_suffix(".npz").read_bytes()
    )
    source.with_suffix(".npz").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ArtifactError):
        pin(source, SUITE, tmp_path / "elsewhere")
    assert not (tmp_path / "elsewhere").exists()


def test_pinned_regressions_fail_on_their_planted_bug() -> None:
    """The pinned padding artifact still catches the mutant it was found on (exit 1)."""
    regressions = Path(__file__).resolve().parents[1] / "regressions"
    out = io.StringIO()
    assert replay_paths([str(regressions)], "cpu", ["torch_native"], properties=SUITE, out=out) == 0
    padding = [p for p in regressions.glob("*.json") if "padding_ignored" in p.read_text()]
    assert padding
    assert (
        replay_paths([str(padding[0])], "cpu", [MUTANT], properties=SUITE, out=io.StringIO()) == 1
    )


def test_artifact_records_temperature_and_entropy_and_replays_them(tmp_path: Path) -> None:
    """A failure of an entropy mutant at T = 0.5 replays with both: it fails there again,
    and passes on torch_native."""
    case = padding_case()
    hot = dataclasses.replace(case.contract, temperature=0.5, export_entropy=True)
    logits = np.array([[0.5, -np.inf, 2.0, 0.25, 3.0], [1.0, 2.0, 3.0, 4.0, 5.0]], np.float32)
    hot_case = LogprobCase(hot, logits, case.targets)
    spec = "tests.mutants.rl_bugs:entropy_zero_times_neg_inf"
    path = write_artifact(
        tmp_path,
        SUITE,
        prop="oracle",
        backend=backend(spec),
        case=hot_case,
        params={},
        failure="oracle agreement: output outside the tolerance table",
        seed=1,
        test="tests/replay/test_replay.py::example",
    )
    document = json.loads(path.read_text())
    assert document["contract"]["temperature"] == 0.5
    assert document["contract"]["export_entropy"] is True
    artifact = load_artifact(path, SUITE)
    assert artifact.case.contract.temperature == 0.5 and artifact.case.contract.export_entropy
    assert replay(artifact, backend(spec), SUITE).outcome is Outcome.FAILED
    assert replay(artifact, backend("torch_native"), SUITE).outcome is Outcome.PASSED
