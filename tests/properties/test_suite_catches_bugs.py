"""The property suite's power: broken copies of torch_native fail it, with a readable report.

Each planted bug (from ``tests.mutants``) runs through the whole suite in a fresh
process, as a third party would run it, with an empty example database. The run
must fail, the report must name the property the bug breaks, and it must carry
what an engineer needs: the contract, observed and expected values, the error
against its tolerance and the command that replays it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CAUGHT = [
    pytest.param(
        "tests.mutants.partial_bugs:padding_not_masked",
        "padding independence: values in padding columns changed the result",
        id="padding mask dropped",
    ),
    pytest.param(
        "tests.mutants.merge_bugs:lse_average",
        "oracle agreement: output outside the tolerance table",
        id="per-rank LSEs averaged",
    ),
    pytest.param(
        "tests.mutants.mask_bugs:inactive_not_zeroed",
        "mask semantics: an inactive row's selected_logp is not exactly +0.0",
        id="inactive rows not zeroed",
    ),
    pytest.param(
        "tests.mutants.processed_bugs:mask_not_renormalised",
        "processed oracle: output outside the tolerance table of the exact values on the "
        "backend's support",
        id="sampling mask not renormalised",
    ),
]


def _run_suite(spec: str, database: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TP_LOGPROB_HYPOTHESIS_DB": str(database)}
    env.pop("TRITON_INTERPRET", None)  # compare with torch_native only: fast
    command = [
        sys.executable,
        "-m",
        "pytest",
        "--pyargs",
        "tp_logprob.properties",
        f"--tp-logprob-backend={spec}",
        "--tp-logprob-profile=ci",
        "--tp-logprob-platform=cpu",
        "-p",
        "no:cacheprovider",
        "-q",
    ]
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.mark.slow
@pytest.mark.parametrize(("spec", "header"), CAUGHT)
def test_suite_catches_the_planted_bug(spec: str, header: str, tmp_path: Path) -> None:
    result = _run_suite(spec, tmp_path / "db")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    backend_id = "mutant_" + spec.rpartition(":")[2]
    start = output.index(header + "\n")
    report = output[start : output.index("\n\n", start) if "\n\n" in output[start:] else None]
    labels = ["backend", "contract", "shapes", "worst", "observed", "expected", "replay"]
    if header.startswith("processed"):  # the support's rule and the tokens that decided it
        labels += ["support", "boundary"]
    for label in labels:
        assert re.search(rf"^  {label} +\S", report, re.MULTILINE), (label, report)
    assert f"  backend   {backend_id}\n" in report
    replay = re.search(r"^  replay +(pytest .*)$", report, re.MULTILINE)
    assert replay is not None
    assert f"--tp-logprob-backend={spec}" in replay.group(1)
    assert "--hypothesis-seed=" in replay.group(1)
    summary = re.search(rf"^{backend_id} +\d+ passed, (\d+) failed, \d+ skipped", output, re.M)
    assert summary is not None and int(summary.group(1)) >= 1, output
