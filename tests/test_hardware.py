"""``python -m tp_logprob hardware`` reports the code paths the libraries really took."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tp_logprob.__main__ import main


def _report(**env: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "tp_logprob", "hardware"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return proc.stdout.splitlines()


def _line(lines: list[str], start: str) -> str:
    return next(line for line in lines if line.startswith(start))


def test_hardware_prints_every_library(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hardware"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("environment: ")
    assert "OpenBLAS core" in _line(lines, "numpy ")
    assert "ATen CPU capability" in _line(lines, "torch ")
    assert "fp32 product fingerprint" in _line(lines, "torch BLAS")


def test_a_restriction_shows_in_the_report() -> None:
    """Restricted ATen dispatch is reported as such; the environment line echoes it."""
    lines = _report(ATEN_CPU_CAPABILITY="default")
    assert "ATEN_CPU_CAPABILITY=default" in lines[0]
    assert _line(lines, "torch ").endswith("ATen CPU capability DEFAULT")


@pytest.mark.skipif(
    "avx2" not in Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else True,
    reason="OpenBLAS can take its Haswell kernels only on a CPU with AVX2",
)
def test_openblas_core_is_read_from_the_library() -> None:
    assert "OpenBLAS core Haswell" in _line(_report(OPENBLAS_CORETYPE="Haswell"), "numpy ")
