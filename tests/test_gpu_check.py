"""benchmarks/gpu_check.sh: its CPU dry run, and its report failing loudly on a failed step."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
REPORT = ROOT / "benchmarks" / "gpu_check_report.py"

pytest.importorskip("triton", reason="the dry run runs the Triton kernels interpreted")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_dry_run_prints_the_plan_runs_the_tiny_shape_and_writes_reports(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--out", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for planned in ("tp_logprob.kernels.triton.aot --matrix ci", "pytest tests/kernels"):
        assert planned in proc.stdout
    assert "--tp-logprob-platform=" in proc.stdout
    assert "THIS MEASURES NOTHING" in proc.stdout
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert report["dry_run"] and report["passed"]
    names = [step["name"] for step in report["steps"]]
    assert names[:5] == ["install", "compile", "kernel-tests", "properties", "bench"]
    assert {step["status"] for step in report["steps"][:5]} == {"planned"}
    assert set(report["bench"]["ran"]) >= {"triton_online", "triton_exact_sum", "torch baseline"}
    assert "PASSED" in (tmp_path / "gpu-check.md").read_text()


def test_report_fails_when_a_step_failed(tmp_path: Path) -> None:
    (tmp_path / "steps.tsv").write_text(
        "install\t0\t12\tinstall\ncompile\t1\t30\tpython -m tp_logprob.kernels.triton.aot\n"
    )
    proc = subprocess.run(
        [sys.executable, str(REPORT), "--out", str(tmp_path), "--platform", "cuda"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert not report["passed"]
    assert [step["passed"] for step in report["steps"]] == [True, False]
    assert "FAILED (exit 1)" in (tmp_path / "gpu-check.md").read_text()
