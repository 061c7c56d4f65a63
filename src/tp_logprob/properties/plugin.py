"""pytest plugin (entry point ``pytest11``): options and Hypothesis profiles of the suite."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from tp_logprob.properties.profiles import CI_SEED, DEFAULT_PROFILE, register_profiles


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tp-logprob")
    group.addoption(
        "--tp-logprob-profile",
        default=os.environ.get("TP_LOGPROB_PROFILE", DEFAULT_PROFILE),
        choices=("dev", "ci", "thorough"),
        help="Hypothesis profile for tp-logprob tests (default: dev, or $TP_LOGPROB_PROFILE)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    profile = config.getoption("--tp-logprob-profile")
    if profile == "ci" and getattr(config.option, "hypothesis_seed", "") is None:
        config.option.hypothesis_seed = str(CI_SEED)  # read by Hypothesis' own plugin
    register_profiles()
    settings.load_profile(config.getoption("--tp-logprob-profile"))


def pytest_report_header(config: pytest.Config) -> str:
    return f"tp-logprob: hypothesis profile {config.getoption('--tp-logprob-profile')}"
