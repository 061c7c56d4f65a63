"""Artifacts of processed cases: the support in the contract, a replayed mask's kept ids in the
npz, refused when tampered with; a failing processed property replays from its artifact."""

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

from tests.helpers.artifacts import backend, padding_case
from tp_logprob.replay.artifacts import (
    SCHEMA_VERSION,
    ArtifactError,
    load_artifact,
    write_artifact,
)
from tp_logprob.replay.catalogue import suite_properties
from tp_logprob.replay.runner import Outcome, replay
from tp_logprob.strategies import LogprobCase
from tp_logprob.support import SupportMode, SupportSpec

SUITE = suite_properties()
ROOT = Path(__file__).resolve().parents[2]
MUTANT = "tests.mutants.processed_bugs:replayed_local_ids"

REPLAYED = SupportSpec.from_kept_lists([[0, 2, 3], []])
SAMPLING = SupportSpec(top_k=2, top_p=0.9)


def processed_case(support: SupportSpec) -> LogprobCase:
    """The padding case of the replay tests (two ranks, one padding column) with ``support``."""
    case = padding_case()
    return case.replace(contract=dataclasses.replace(case.contract, support=support))


def write(directory: Path, support: SupportSpec, spec: str = "torch_native") -> Path:
    return write_artifact(
        directory,
        SUITE,
        prop="processed_oracle",
        backend=backend(spec),
        case=processed_case(support),
        params={},
        failure="recorded by tests/replay/test_replay_processed.py",
        seed=1234,
    )


@pytest.mark.parametrize("support", [REPLAYED, SAMPLING], ids=["replayed", "sampling"])
def test_processed_case_round_trip(tmp_path: Path, support: SupportSpec) -> None:
    path = write(tmp_path, support)
    document = json.loads(path.read_text())
    assert document["schema_version"] == SCHEMA_VERSION == 5
    kept = {"kept_offsets", "kept_ids"}
    stored = kept & set(document["arrays"])
    assert stored == (kept if support.mode is SupportMode.REPLAYED_MASK else set())
    artifact = load_artifact(path, SUITE)
    assert artifact.case.contract.support == support
    assert artifact.case.digest() == processed_case(support).digest()
    assert replay(artifact, backend("torch_native"), SUITE).outcome is Outcome.PASSED


def test_a_heterogeneous_batch_round_trips_and_replays(tmp_path: Path) -> None:
    """Per-row temperatures and rules (a greedy row among them) are stored as lists and
    judged group by group on replay."""
    case = processed_case(SAMPLING)
    rows = case.contract.num_tokens
    mixed = dataclasses.replace(
        case.contract,
        temperature=tuple(0.0 if row % 2 else 0.7 for row in range(rows)),
        support=SupportSpec(top_k=[2 + row % 2 for row in range(rows)], top_p=0.9),
    )
    path = write_artifact(
        tmp_path,
        SUITE,
        prop="processed_oracle",
        backend=backend("torch_native"),
        case=case.replace(contract=mixed),
        params={},
        failure="recorded by tests/replay/test_replay_processed.py",
        seed=1234,
    )
    contract = json.loads(path.read_text())["contract"]
    assert contract["schema"] == 5 and contract["temperature"][:2] == [0.7, 0.0]
    artifact = load_artifact(path, SUITE)
    assert artifact.case.contract == mixed and artifact.case.contract.heterogeneous
    assert replay(artifact, backend("torch_native"), SUITE).outcome is Outcome.PASSED


def test_older_artifacts_still_load(tmp_path: Path) -> None:
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
    document["schema_version"] = 2
    document.pop("output_bits")  # schema 4 added it
    document.pop("input_form")  # schema 5 added it
    path.write_text(json.dumps(document))
    assert load_artifact(path, SUITE).case == padding_case()


def _edit(
    json_change: Callable[[dict[str, Any]], None] | None = None,
    arrays_change: Callable[[dict[str, Any]], None] | None = None,
) -> Callable[[Path], None]:
    """Change the artifact's JSON and arrays as given, keeping the JSON's declarations in step."""

    def edit(path: Path) -> None:
        document = json.loads(path.read_text())
        npz = path.with_suffix(".npz")
        with np.load(npz, allow_pickle=False) as stored:
            arrays = {key: np.array(stored[key]) for key in stored.files}
        if arrays_change is not None:
            arrays_change(arrays)
        if json_change is not None:
            json_change(document)
        document["arrays"] = {
            key: {"dtype": array.dtype.name, "shape": list(array.shape)}
            for key, array in arrays.items()
        }
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        npz.write_bytes(buffer.getvalue())
        path.write_text(json.dumps(document))

    return edit


def _kept_id_changed(arrays: dict[str, Any]) -> None:
    arrays["kept_ids"][1] = 1


def _kept_dropped(arrays: dict[str, Any]) -> None:
    del arrays["kept_offsets"], arrays["kept_ids"]


def _kept_added(arrays: dict[str, Any]) -> None:
    arrays["kept_offsets"] = np.array([0, 1, 1])
    arrays["kept_ids"] = np.array([2])


def _rule_changed(document: dict[str, Any]) -> None:
    document["contract"]["support"]["top_p"] = 0.5


def _schema_2(document: dict[str, Any]) -> None:
    document["schema_version"] = 2
    document.pop("output_bits")  # schema 4 added it
    document.pop("input_form")  # schema 5 added it


REFUSALS = {
    "kept id changed": (REPLAYED, _edit(arrays_change=_kept_id_changed), "support.sha256"),
    "rule changed in the JSON": (SAMPLING, _edit(json_change=_rule_changed), "support.sha256"),
    "kept ids missing": (REPLAYED, _edit(arrays_change=_kept_dropped), "kept_offsets: missing"),
    "kept ids without a replayed support": (
        SAMPLING,
        _edit(arrays_change=_kept_added),
        "kept_offsets: stored, but the contract has no replayed support",
    ),
    "replayed support in a schema 2 artifact": (
        REPLAYED,
        _edit(json_change=_schema_2),
        "stored from version 3 on",
    ),
}


@pytest.mark.parametrize("tamper", list(REFUSALS))
def test_tampered_support_is_refused(tmp_path: Path, tamper: str) -> None:
    support, edit, message = REFUSALS[tamper]
    path = write(tmp_path, support)
    edit(path)
    with pytest.raises(ArtifactError, match="refused") as caught:
        load_artifact(path, SUITE)
    assert message in str(caught.value)


def test_failing_processed_property_writes_an_artifact_that_replays(tmp_path: Path) -> None:
    """The suite on a backend that reads replayed ids as local ones: the shrunk failure is an
    artifact with the replayed mask, which fails again on that backend and passes on
    torch_native, through the command line."""
    env = {
        **os.environ,
        "TP_LOGPROB_HYPOTHESIS_DB": str(tmp_path / "db"),
        "TP_LOGPROB_ARTIFACTS": str(tmp_path / "failures"),
    }
    env.pop("TRITON_INTERPRET", None)
    suite = [
        sys.executable,
        "-m",
        "pytest",
        "--pyargs",
        "tp_logprob.properties.test_processed",
        "-k",
        "processed_matches_exact_oracle",
        f"--tp-logprob-backend={MUTANT}",
        "--tp-logprob-platform=cpu",
        "--tp-logprob-profile=ci",
        "-p",
        "no:cacheprovider",
        "-q",
    ]
    run = subprocess.run(
        suite, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 1, run.stdout[-3000:]
    (path,) = sorted((tmp_path / "failures").glob("*.json"))
    artifact = load_artifact(path, SUITE)
    assert artifact.prop == "processed_oracle"
    support = artifact.case.contract.support
    assert support is not None and support.mode is SupportMode.REPLAYED_MASK
    assert artifact.case.contract.sharding.tp_world_size >= 2
    document = json.loads(path.read_text())
    assert {"kept_offsets", "kept_ids"} <= set(document["arrays"])
    env["TRITON_INTERPRET"] = "1"
    outcomes = {}
    for spec in ("torch_native", MUTANT):
        command = [sys.executable, "-m", "tp_logprob", "replay", str(path), "--backend", spec]
        replayed = subprocess.run(
            [*command, "--platform", "cpu"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        outcomes[spec] = (replayed.returncode, replayed.stdout)
    assert outcomes["torch_native"][0] == 0, outcomes
    assert outcomes["torch_native"][1].startswith("PASS")
    code, out = outcomes[MUTANT]
    assert code == 1 and out.startswith("FAIL"), out
    assert "processed oracle" in out and "support_lse" in out, out
