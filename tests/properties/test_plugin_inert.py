"""The pytest plugin leaves a project that did not ask for the suite untouched.

A foreign project's own Hypothesis tests run twice in fresh processes, each in a
directory of its own with ``TP_LOGPROB_PROFILE=ci`` in the environment: once with
tp-logprob's plugin blocked (``-p no:tp_logprob``), once with it loaded through
the ``pytest11`` entry point. Each run records what Hypothesis looked like from
inside (profile, example count, deadline, database, registered profiles, seed,
examples drawn) and the two records must be equal, as must the files each run
left in its directory. Comparing with a run without the plugin, rather than with
Hypothesis' documented defaults, keeps the test true wherever Hypothesis picks
other defaults itself (it loads its own ``ci`` profile when ``CI`` is set).

Both runs import tp-logprob from a copy under a ``site-packages`` directory, as a
user's ``pip install`` places it: Hypothesis reads constants from the source of
every module it considers the project's own (anything outside site-packages, an
editable install included) and caches them in ``.hypothesis/constants``, which
would be Hypothesis reacting to an editable checkout, not the plugin acting.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import tp_logprob

FOREIGN_TEST = """
import json, os
from hypothesis import given, settings, strategies as st

SEEN = []


def test_plugin_presence(request):
    loaded = request.config.pluginmanager.has_plugin("tp_logprob")
    assert loaded == (os.environ["FOREIGN_EXPECT_PLUGIN"] == "1"), loaded
    if loaded:
        import tp_logprob
        assert "/site-packages/" in tp_logprob.__file__, tp_logprob.__file__


@given(st.integers())
def test_drawn(value):
    SEEN.append(value)


def test_record_hypothesis_settings():
    default = settings.default
    record = {
        "profile": settings._current_profile,
        "registered_profiles": sorted(settings._profiles),
        "max_examples": default.max_examples,
        "deadline": repr(default.deadline),
        "derandomize": default.derandomize,
        "database": repr(default.database),
        "seed": repr(getattr(test_drawn, "_hypothesis_internal_use_seed", None)),
        "settings_on_test": repr(getattr(test_drawn, "_hypothesis_internal_use_settings", None)),
        "examples_drawn": len(SEEN),
    }
    here = os.getcwd()  # each run has its own directory: compare paths relative to it
    record = {key: str(value).replace(here, "<project>") if isinstance(value, str) else value
              for key, value in record.items()}
    with open(os.environ["FOREIGN_RECORD"], "w") as out:
        json.dump(record, out)
"""


def _run_foreign_project(
    tmp_path: Path, name: str, *args: str, plugin: bool = True
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], set[str]]:
    """Run the foreign project's tests; return the process, its record and the files left."""
    project = tmp_path / name
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    (project / "test_foreign.py").write_text(FOREIGN_TEST)
    record_path = tmp_path / f"{name}.json"
    installed = tmp_path / "site-packages"
    if not installed.exists():
        shutil.copytree(
            Path(tp_logprob.__file__).parent,
            installed / "tp_logprob",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(installed), os.environ.get("PYTHONPATH", "")]),
        "TP_LOGPROB_PROFILE": "ci",
        "FOREIGN_RECORD": str(record_path),
        "FOREIGN_EXPECT_PLUGIN": "1" if plugin else "0",
    }
    env.pop("PYTEST_ADDOPTS", None)
    blocked = [] if plugin else ["-p", "no:tp_logprob"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", *blocked, *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads(record_path.read_text())
    return proc, record, {path.name for path in project.iterdir()}


def test_a_foreign_projects_hypothesis_tests_keep_their_settings(tmp_path: Path) -> None:
    _, without, files_without = _run_foreign_project(tmp_path, "without", plugin=False)
    proc, with_plugin, files_with = _run_foreign_project(tmp_path, "with")
    assert with_plugin == without, (with_plugin, without)
    assert not any(name.startswith("tp_logprob") for name in with_plugin["registered_profiles"])
    assert ".tp_logprob" not in with_plugin["database"], with_plugin["database"]
    assert files_with == files_without, (files_with, files_without)
    assert "tp-logprob" not in proc.stdout, "the plugin printed to a project that did not ask"


def test_the_foreign_check_fails_when_the_suite_is_requested(tmp_path: Path) -> None:
    """Proof the comparison can fail: the project's opt-in is a request for the suite."""
    _, without, _ = _run_foreign_project(tmp_path, "without", plugin=False)
    _, opted_in, _ = _run_foreign_project(tmp_path, "opted_in", "-o", "tp_logprob_suite=true")
    assert opted_in["profile"] == "tp_logprob.ci", opted_in
    assert opted_in != without
    assert opted_in["seed"] != without["seed"], (opted_in, without)
