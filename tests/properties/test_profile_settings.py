"""The suite's profile reaches each property: its example count, scaled by the property's mark.

The sessions run in a fresh process under ``ci`` (25 examples, no database replay) on
``torch_native``, without this project's opt-in (which would make ``ci`` every test's
default); the closing table counts the examples each property drew. A property that ran
under Hypothesis' defaults instead would draw 100.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tp_logprob.properties import test_gradients as gradients
from tp_logprob.properties import test_oracle as oracle
from tp_logprob.suite.profiles import examples_fraction

ROOT = Path(__file__).resolve().parents[2]
PROPERTIES = ROOT / "src" / "tp_logprob" / "properties"


def _examples(test: str, profile: str = "--tp-logprob-profile=ci") -> int:
    """The examples ``test`` drew on ``torch_native`` under ``profile``, from the closing table."""
    unset = ("TRITON_INTERPRET", "TP_LOGPROB_PROFILE")
    env = {key: value for key, value in os.environ.items() if key not in unset}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT)]))
    command = [sys.executable, "-m", "pytest", test, "-p", "no:cacheprovider", "-q"]
    command += [profile, "--tp-logprob-platform=cpu"]
    command += ["--tp-logprob-backend=torch_native", "-o", "tp_logprob_suite=false"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    row = re.search(r"^torch_native +1 passed, 0 failed, 0 skipped +(\d+) ", done.stdout, re.M)
    assert row is not None, done.stdout
    return int(row.group(1))


@pytest.mark.slow
def test_a_property_draws_the_profiles_examples() -> None:
    assert examples_fraction(oracle.test_matches_exact_oracle) == 1.0
    path = PROPERTIES / "test_oracle.py"
    assert _examples(f"{path}::test_matches_exact_oracle") == 25


def test_hypothesis_profile_names_the_suite_profile() -> None:
    """``--hypothesis-profile=dev`` is the suite's ``dev``, which Hypothesis' own plugin
    loads by that name (the suite registers it as ``tp_logprob.dev``)."""
    path = PROPERTIES / "test_oracle.py"
    assert _examples(f"{path}::test_matches_exact_oracle", "--hypothesis-profile=dev") == 25


@pytest.mark.slow
def test_a_scaled_property_draws_its_share() -> None:
    assert examples_fraction(gradients.test_gradients_match_exact) == 0.6
    assert _examples(str(PROPERTIES / "test_gradients.py")) == 15


def test_settings_are_given_once_and_never_replaced() -> None:
    """The items of one property share its function: the same settings apply once, and
    other settings for it in the same process are a usage error, not a silent keep."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from tp_logprob.pytest_plugin import _give_settings

    drawn: list[int] = []

    @given(st.integers())
    def prop(value: int) -> None:
        drawn.append(value)

    _give_settings(prop, settings(max_examples=3, database=None))
    _give_settings(prop, settings(max_examples=3, database=None))
    prop()
    assert len(drawn) == 3
    with pytest.raises(pytest.UsageError, match=r"prop already runs under settings\("):
        _give_settings(prop, settings(max_examples=4, database=None))
