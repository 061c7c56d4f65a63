"""The pytest plugin leaves a project that did not ask for the suite untouched.

A foreign project's own Hypothesis test runs in a fresh process, in a directory
of its own, with tp-logprob installed (its plugin loads through the ``pytest11``
entry point) and ``TP_LOGPROB_PROFILE=ci`` in the environment. The test asserts,
from inside that run, that the plugin is loaded and that Hypothesis still has its
own defaults: profile, example count, database, no pinned seed; and afterwards
that nothing was written to the project's directory but what Hypothesis writes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FOREIGN_TEST = """
from hypothesis import given, settings, strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

SEEN = []


def test_plugin_is_loaded(request):
    assert request.config.pluginmanager.has_plugin("tp_logprob"), "the plugin did not load"


def test_hypothesis_defaults_untouched():
    default = settings.default
    assert settings._current_profile == "default", settings._current_profile
    assert default.max_examples == 100, default.max_examples
    assert default.deadline is not None
    assert isinstance(default.database, DirectoryBasedExampleDatabase), default.database
    assert ".tp_logprob" not in str(default.database.path), default.database.path
    assert not any(name.startswith("tp_logprob") for name in settings._profiles), sorted(
        settings._profiles
    )


@given(st.integers())
def test_drawn(value):
    SEEN.append(value)


def test_drawn_is_not_reseeded():
    assert getattr(test_drawn, "_hypothesis_internal_use_seed", None) is None
    assert len(SEEN) == 100, len(SEEN)
"""


def _run_foreign_project(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    project = tmp_path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    (project / "test_foreign.py").write_text(FOREIGN_TEST)
    env = {**os.environ, "TP_LOGPROB_PROFILE": "ci"}
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_foreign_projects_hypothesis_tests_keep_their_settings(tmp_path: Path) -> None:
    proc = _run_foreign_project(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 passed" in proc.stdout, proc.stdout
    assert "tp-logprob" not in proc.stdout, "the plugin printed to a project that did not ask"
    project = tmp_path / "project"
    written = {path.name for path in project.iterdir()}
    assert written <= {"pytest.ini", "test_foreign.py", "__pycache__", ".hypothesis"}, written


def test_the_foreign_check_fails_when_the_suite_is_requested(tmp_path: Path) -> None:
    """Proof the foreign test can fail: asking for a tp-logprob profile is a request."""
    proc = _run_foreign_project(tmp_path, "-o", "tp_logprob_suite=true")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "test_hypothesis_defaults_untouched FAILED" in proc.stdout or (
        "FAILED test_foreign.py::test_hypothesis_defaults_untouched" in proc.stdout
    ), proc.stdout
