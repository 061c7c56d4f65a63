"""End to end: the suite writes one artifact per failing property; the CLI replays it."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.artifacts import MUTANT, padding_case
from tp_logprob.kernels.builtin import TRITON_ONLINE
from tp_logprob.registry import registry
from tp_logprob.replay.artifacts import load_artifact, write_artifact
from tp_logprob.replay.catalogue import suite_properties
from tp_logprob.suite.backends import BackendUnderTest

SUITE = suite_properties()

ROOT = Path(__file__).resolve().parents[2]


def test_failing_property_writes_one_shrunk_artifact(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "TP_LOGPROB_HYPOTHESIS_DB": str(tmp_path / "db"),
        "TP_LOGPROB_ARTIFACTS": str(tmp_path / "failures"),
    }
    env.pop("TRITON_INTERPRET", None)
    command = [
        sys.executable,
        "-m",
        "pytest",
        "--pyargs",
        "tp_logprob.properties.test_metamorphic",
        "-k",
        "padding_is_ignored",
        f"--tp-logprob-backend={MUTANT}",
        "--tp-logprob-platform=cpu",
        "--tp-logprob-profile=ci",
        "-p",
        "no:cacheprovider",
        "-q",
    ]
    run = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 1, run.stdout[-2000:]
    written = sorted((tmp_path / "failures").iterdir())
    assert [p.suffix for p in written] == [".json", ".npz"], written
    artifact = load_artifact(written[0], SUITE)
    assert artifact.prop == "padding_ignored" and artifact.backend_spec == MUTANT
    assert f"python -m tp_logprob replay {written[0]}" in run.stdout
    document = json.loads(written[0].read_text())
    assert document["test"].endswith("test_padding_is_ignored[mutant_padding_not_masked]")
    assert "padding independence" in document["failure"]["summary"]
    pasted = re.search(r"^  artifact  (python -m tp_logprob replay .*)$", run.stdout, re.M)
    assert pasted is not None, run.stdout[-2000:]
    replayed = subprocess.run(
        [sys.executable, *shlex.split(pasted.group(1))[1:]],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    # The line works pasted as printed: it names the module:attr backend, so replay runs
    # (and fails again on the mutant) instead of asking for --backend (exit 2).
    assert replayed.returncode == 1, replayed.stdout + replayed.stderr
    assert "padding independence" in replayed.stdout, replayed.stdout


@pytest.mark.triton
def test_triton_artifact_replays_on_cpu_through_the_interpreter(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    backend = BackendUnderTest("triton_online", TRITON_ONLINE, registry, "cuda")
    path = write_artifact(
        tmp_path,
        SUITE,
        prop="oracle",
        backend=backend,
        case=padding_case(),
        params={},
        failure="recorded on a GPU",
    )
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-m", "tp_logprob", "replay", str(path), "--platform", "cpu"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "TRITON_INTERPRET=1" in run.stderr
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("PASS") and "oracle on triton_online" in run.stdout


VENDOR_MODULE = """
import dataclasses

from tp_logprob.kernels.builtin import TRITON_ONLINE

CAPABILITY = dataclasses.replace(TRITON_ONLINE, backend_id="vendor_triton")


def op(local_logits, targets, contract, group=None):
    from tp_logprob.kernels.triton.online import triton_online_logprob

    return triton_online_logprob(local_logits, targets, contract, group)


PAIR = (op, CAPABILITY)
"""


@pytest.mark.triton
def test_a_third_party_triton_backend_replays_on_cpu_through_the_interpreter(
    tmp_path: Path,
) -> None:
    """Nothing in its id says it uses Triton: the replay switches the interpreter on anyway."""
    pytest.importorskip("triton")
    (tmp_path / "vendor_triton_backend.py").write_text(VENDOR_MODULE)
    spec = "vendor_triton_backend:PAIR"
    capability = dataclasses.replace(TRITON_ONLINE, backend_id="vendor_triton")
    backend = BackendUnderTest(spec, capability, registry, "cpu")
    path = write_artifact(
        tmp_path / "failures",
        SUITE,
        prop="oracle",
        backend=backend,
        case=padding_case(),
        params={},
        failure="recorded on CPU",
    )
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "tp_logprob", "replay", str(path), "--backend", spec]
    run = subprocess.run(
        [*command, "--platform", "cpu"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "TRITON_INTERPRET=1" in run.stderr, run.stderr
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("PASS") and "vendor_triton" in run.stdout, run.stdout
