"""Drift reports: per dtype and TP degree, against the exact oracle; JSON and a PNG."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.artifacts import MUTANT, backend, write_padding_artifact
from tp_logprob.__main__ import main
from tp_logprob.kernels.builtin import TORCH_NATIVE
from tp_logprob.replay.catalogue import suite_properties
from tp_logprob.replay.report import (
    ASTRONOMICAL_ULP,
    axis_top,
    build_report,
    generate_cases,
    load_cases,
    plot_report,
)

SUITE = suite_properties()


def test_generated_cases_are_reproducible_and_spread() -> None:
    first = generate_cases(TORCH_NATIVE, 12, seed=5)
    assert [case.digest() for case in first] == [
        case.digest() for case in generate_cases(TORCH_NATIVE, 12, seed=5)
    ]
    assert {case.contract.dtype.value for case in first} == {"bf16", "fp16", "fp32"}
    assert {case.contract.sharding.tp_world_size for case in first} == {1, 2, 4, 8}
    assert all(case.contract.sharding.padded_vocab_size <= 64 for case in first)


def test_report_on_a_correct_backend_is_within_tolerance() -> None:
    report = build_report(backend("torch_native"), generate_cases(TORCH_NATIVE, 12, 1), "test")
    summary = report.summary()
    assert {(e["dtype"], e["tp"]) for e in summary} >= {("fp32", 1), ("bf16", 8)}
    assert all(e["out_of_tolerance"] == 0 and e["max_used"] <= 1.0 for e in summary)
    assert all(e["max_ulp_error"] < 4 for e in summary)
    table = report.markdown().splitlines()
    assert table[2].startswith("| dtype | tp | quantity |")
    assert len([line for line in table if line.startswith("| ")]) == len(summary) + 1


def test_report_on_a_buggy_backend_finds_the_rows(tmp_path: Path) -> None:
    write_padding_artifact(tmp_path)
    report = build_report(backend(MUTANT), load_cases([str(tmp_path)], SUITE), "artifacts")
    (entry,) = [e for e in report.summary() if e["quantity"] == "lse"]
    assert entry["out_of_tolerance"] >= 1 and entry["max_used"] > 1
    assert entry["worst_rows"][0]["row"] in (0, 1)


def test_report_cli_writes_json_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    out_json, out_png = tmp_path / "drift.json", tmp_path / "drift.png"
    argv = ["report", "--backend", "torch_native", "--platform", "cpu", "--generate", "6"]
    assert main([*argv, "--json", str(out_json), "--plot", str(out_png)]) == 0
    assert "| dtype | tp |" in capsys.readouterr().out
    document = json.loads(out_json.read_text())
    assert document["backend"] == "torch_native" and document["groups"]
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_plot_leaves_the_callers_backend_alone(tmp_path: Path) -> None:
    matplotlib = pytest.importorskip("matplotlib")
    report = build_report(backend("torch_native"), generate_cases(TORCH_NATIVE, 2, 0), "test")
    saved = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        plot_report(report, str(tmp_path / "drift.png"))
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(saved)
    assert (tmp_path / "drift.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_cli_exits_1_when_out_of_tolerance(tmp_path: Path) -> None:
    write_padding_artifact(tmp_path)
    argv = ["report", "--backend", MUTANT, "--platform", "cpu", "--cases", str(tmp_path)]
    assert main(argv) == 1


def test_plot_without_matplotlib_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    report = build_report(backend("torch_native"), generate_cases(TORCH_NATIVE, 1, 0), "test")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(RuntimeError, match=r"tp-logprob\[plot\]"):
        plot_report(report, str(tmp_path / "x.png"))


def test_the_plot_axis_ignores_astronomical_tolerances_however_many() -> None:
    """Rows whose exact value is zero have tolerances near 1e39 ulps; when more than a tenth
    of the rows have one (inactive rows), the axis still ends near the ordinary ones."""
    errors = np.full(100, 0.5)
    tolerance = np.concatenate([np.full(80, 10.0), np.full(20, 7.5e38)])
    assert axis_top(errors, tolerance) == 20.0
    assert axis_top(errors, np.full(100, 7.5e38)) == 2.0
    assert axis_top(np.array([300.0]), np.array([10.0])) == 600.0
    generated = build_report(backend("torch_native"), generate_cases(TORCH_NATIVE, 64, 0), "test")
    for errors, tolerance in generated.ulp_errors().values():
        assert axis_top(errors, tolerance) < ASTRONOMICAL_ULP
