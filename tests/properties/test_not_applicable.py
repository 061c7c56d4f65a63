"""The harness's NotApplicable is a skip under the plugin, raised once inside Hypothesis.

The harness imports no pytest: a property that does not apply here raises
:class:`~tp_logprob.suite.outcomes.NotApplicable` (a ``unittest.SkipTest``), which
Hypothesis re-raises at once instead of shrinking, and the plugin reports as a skip
with the harness's reason, even with pytest's unittest support switched off.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tp_logprob

PROPERTY = """
from hypothesis import given, strategies as st

from tp_logprob.suite.outcomes import NotApplicable

CALLS = []


@given(st.integers())
def test_does_not_apply(value):
    CALLS.append(value)
    raise NotApplicable("serves no tp_world_size=2 contract")


def test_hypothesis_ran_it_once():
    assert len(CALLS) == 1, CALLS
"""


@pytest.mark.parametrize("unittest_plugin", [True, False], ids=["unittest", "no unittest"])
def test_not_applicable_is_a_skip_with_its_reason(tmp_path: Path, unittest_plugin: bool) -> None:
    (tmp_path / "test_property.py").write_text(PROPERTY)
    src = str(Path(tp_logprob.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-n", "0"]
    if not unittest_plugin:
        command += ["-p", "no:unittest"]
    done = subprocess.run(
        command,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 1 skipped" in done.stdout, done.stdout
    assert "serves no tp_world_size=2 contract" in done.stdout, done.stdout
