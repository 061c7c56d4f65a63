"""benchmarks/bench_main_job.py without running the suite: which plugin each tree runs, and
what it says when a tree has none."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

from tests.benchmarks import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    return load_benchmark("bench_main_job")


def test_each_tree_runs_the_plugin_its_pyproject_registers(tmp_path: Path) -> None:
    bench = _load()
    module = bench._plugin_module(ROOT)
    assert module == "tp_logprob.pytest_plugin"
    assert hasattr(importlib.import_module(module), "pytest_configure")
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "old"\n\n[project.entry-points.pytest11]\n'
        'tp_logprob = "tp_logprob.properties.plugin"\n'
    )
    assert bench._plugin_module(tmp_path) == "tp_logprob.properties.plugin"


def test_a_tree_without_the_plugin_is_named(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "other"\n')
    with pytest.raises(SystemExit, match=r"pyproject.toml registers no tp_logprob pytest plugin"):
        _load()._plugin_module(tmp_path)
