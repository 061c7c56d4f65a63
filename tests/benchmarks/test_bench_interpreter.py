"""benchmarks/bench_interpreter.py on one backend, once: both timings, the same bits."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from tests.benchmarks import load_benchmark

pytestmark = [
    pytest.mark.triton,
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") != "1", reason="runs the Triton interpreter"
    ),
]


def test_one_backend_gives_both_timings_and_the_same_bits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("triton", reason="the interpreter needs triton")
    bench = load_benchmark("bench_interpreter")
    assert bench.main(["--repeat", "1", "--backend", "triton_online"]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("triton_")]
    assert len(row) == 1 and row[0].split()[-1] == "same", row


def test_a_repeat_below_one_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("triton", reason="the interpreter needs triton")
    with pytest.raises(SystemExit):
        load_benchmark("bench_interpreter").main(["--repeat", "0"])
    assert "--repeat=0: must be at least 1" in capsys.readouterr().err
