"""benchmarks/gpu_check.sh: its CPU dry run, and its report failing loudly on a failed step."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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
    for planned in ("tools.gpu_readiness --matrix ci", "pytest tests/kernels"):
        assert planned in proc.stdout
    assert "--tp-logprob-platform=" in proc.stdout
    assert "THIS MEASURES NOTHING" in proc.stdout
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert report["dry_run"] and report["passed"]
    names = [step["name"] for step in report["steps"]]
    assert names[:6] == ["install", "compile", "kernel-tests", "properties", "real-group", "bench"]
    assert {step["status"] for step in report["steps"][:6]} == {"planned"}
    assert "torch.distributed.run --standalone --nproc-per-node N -m pytest" in proc.stdout
    assert set(report["bench"]["ran"]) >= {"triton_online", "triton_exact_sum", "torch baseline"}
    assert "bench_fused.py --gpu-shapes" in proc.stdout
    assert "bench-fused" in names and "bench-fused (cpu)" in names
    fused = report["bench_fused"]["shapes"]
    assert [(shape["rows"], shape["role"]) for shape in fused] == [(256, "infer"), (256, "train")]
    for shape in fused:
        peaks = {name: item["peak_bytes"] for name, item in shape["candidates"].items()}
        assert 0 < peaks["torch_native_fused"] < peaks["logits path"]
    markdown = (tmp_path / "gpu-check.md").read_text()
    assert "PASSED" in markdown
    assert "## Fused LM head vs logits path" in markdown


def test_report_fails_when_a_step_failed(tmp_path: Path) -> None:
    (tmp_path / "steps.tsv").write_text(
        "install\t0\t12\tinstall\ncompile\t1\t30\tpython -m tools.gpu_readiness\n"
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


def test_report_renders_the_fused_bench_with_its_goals_and_skips(tmp_path: Path) -> None:
    (tmp_path / "steps.tsv").write_text("bench-fused\t0\t95\tpython benchmarks/bench_fused.py\n")
    candidate = {
        "peak_bytes": 3 * 2**20,
        "cuda_peak_bytes": 4 * 2**20,
        "largest": {"shape": [27, 262144], "dtype": "torch.float32", "bytes": 27 * 2**20},
        "ms": 12.5,
    }
    shapes = [
        {
            "rows": 4096,
            "hidden": 4096,
            "vocab": 152064,
            "padded": 152064,
            "role": "train",
            "candidates": {"torch_native_fused": candidate},
            "notes": ["triton_fused: skipped, out of device memory"],
            "targets": {
                "torch_native_fused": {
                    "peak_ratio": 0.05,
                    "peak_met": True,
                    "ms": 12.5,
                    "allowed_ms": 10.0,
                    "time_met": False,
                }
            },
        },
        {
            "rows": 32768,
            "hidden": 4096,
            "vocab": 152064,
            "padded": 152064,
            "role": "train",
            "skipped": "skipped: estimated 300 s, 100 s of --budget-s left",
        },
    ]
    bench = {"device": "H200", "dtype": "bf16", "reps": 3, "shapes": shapes}
    (tmp_path / "bench-fused.json").write_text(json.dumps(bench))
    proc = subprocess.run(
        [sys.executable, str(REPORT), "--out", str(tmp_path), "--platform", "cuda"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "gpu-check.json").read_text())["bench_fused"] == bench
    markdown = (tmp_path / "gpu-check.md").read_text()
    assert "| 4096 | 4096 | 152064 | train | torch_native_fused | 3.0 | 4.0 |" in markdown
    assert "peak 0.050 of the logits path (goal <= 0.125): met" in markdown
    assert "12.50 ms (goal <= logits path + matmul, 10.00 ms): **not met**" in markdown
    assert "| 32768 | 4096 | 152064 | train | skipped: estimated 300 s" in markdown
    assert "triton_fused: skipped, out of device memory" in markdown


def test_report_renders_the_processed_bench(tmp_path: Path) -> None:
    (tmp_path / "steps.tsv").write_text(
        "bench-processed\t0\t80\tpython benchmarks/bench_processed.py\n"
    )
    table = {
        "backend": "triton_fused",
        "rows": 1024,
        "vocab": 152064,
        "hidden": 4096,
        "role": "infer",
        "dtype": "bf16",
        "repeats": 3,
        "candidates": {
            "raw": {"ms": 20.0, "of_raw": 1.0},
            "vLLM-like": {"ms": 45.0, "of_raw": 2.25},
        },
    }
    bench = {"device": "cuda", "tables": [table]}
    (tmp_path / "bench-processed.json").write_text(json.dumps(bench))
    proc = subprocess.run(
        [sys.executable, str(REPORT), "--out", str(tmp_path), "--platform", "cuda"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "gpu-check.json").read_text())["bench_processed"] == bench
    markdown = (tmp_path / "gpu-check.md").read_text()
    assert "## Processed over raw logprobs (cuda, TP=1)" in markdown
    assert "| triton_fused | infer | 1024 | 4096 | 152064 | bf16 | vLLM-like | 45.00 | 2.25x |" in (
        markdown
    )
