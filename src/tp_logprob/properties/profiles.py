"""Hypothesis profiles for the suite: ``dev`` (fast), ``ci`` (fixed seed), ``thorough``.

Hypothesis refuses ``derandomize=True`` together with a database, and its own ``ci``
profile drops the database. Ours keeps the database (so a failure found once is
replayed first next time) and derandomizes by pinning the seed instead: the plugin
seeds every test with :data:`CI_SEED` unless ``--hypothesis-seed`` is given (it sets
the seed the way ``hypothesis.seed()`` does, minus switching the database off).
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings

from tp_logprob.replay.databases import example_database

__all__ = ["CI_SEED", "DEFAULT_PROFILE", "register_profiles"]

DEFAULT_PROFILE = "dev"
CI_SEED = 20261130

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]
# The explain phase reruns variants of a shrunk failure to annotate it; on a failing
# backend it can cost minutes, so the fast profiles skip it (thorough keeps it).
_FAST_PHASES = [phase for phase in Phase if phase is not Phase.explain]


def register_profiles() -> None:
    """Register the three profiles; idempotent.

    The database is the local directory one, multiplexed with a shared one when
    ``TP_LOGPROB_SHARED_DB`` or ``TP_LOGPROB_HYPOTHESIS_REDIS`` is set (see
    :mod:`tp_logprob.replay.databases`).
    """
    database = example_database()
    settings.register_profile(
        "dev",
        max_examples=25,
        deadline=None,
        database=database,
        phases=_FAST_PHASES,
        suppress_health_check=_SLOW_OK,
    )
    settings.register_profile(
        "ci",
        max_examples=25,
        deadline=None,
        database=database,
        phases=_FAST_PHASES,
        report_multiple_bugs=False,
        print_blob=True,
        suppress_health_check=_SLOW_OK,
    )
    settings.register_profile(
        "thorough",
        max_examples=10_000,
        deadline=None,
        database=database,
        phases=list(Phase),
        suppress_health_check=_SLOW_OK,
    )


def scaled(fraction: float) -> settings:
    """The active profile with ``fraction`` of its examples (at least 1).

    For properties that run several backends or layouts per example; apply it as a
    decorator, which reads the profile the plugin loaded before collection.
    """
    return settings(max_examples=max(1, round(settings().max_examples * fraction)))
