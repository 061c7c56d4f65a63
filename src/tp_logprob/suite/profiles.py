"""Hypothesis settings for the suite: the ``dev`` (fast), ``ci`` (fixed seed) and ``thorough``
profiles, and the per-property share of a profile's examples.

The profiles are registered under their own names (:func:`profile_name`, e.g.
``tp_logprob.ci``), never as ``dev``/``ci``/``thorough``, so registering them cannot
replace a profile of the same short name that a project, or Hypothesis itself
(its built-in ``ci``), has. The plugin registers them only when the suite is
requested, and gives each property its settings (:func:`property_settings`)
rather than loading a profile for the whole session, unless the project opts in.

Hypothesis refuses ``derandomize=True`` together with a database, and its own ``ci``
profile drops the database. Ours derandomizes by pinning the seed instead: the plugin
seeds every property with :data:`CI_SEED` unless ``--hypothesis-seed`` is given (it
sets the seed the way ``hypothesis.seed()`` does, minus switching the database off).

Under ``ci`` the verdict is the seed's alone: the profile writes the database but
never reads it (no ``Phase.reuse``). Replaying saved examples first would make the
draws depend on what the database holds, which is whatever earlier runs left in
the working directory (every backend's runs share a property's key): replayed
examples count against ``max_examples``, their sampling advances Hypothesis'
seeded random, and the choices they made are ones the generator then avoids, so
the same seed stops short of, or steers around, the example that fails. Under
``dev`` and ``thorough`` a failure found once is still replayed first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import InvalidArgument

from tp_logprob.suite.databases import example_database

__all__ = [
    "CI_SEED",
    "DEFAULT_PROFILE",
    "PROFILES",
    "SEEDED_PHASES",
    "examples_fraction",
    "name_suite_profile",
    "profile_name",
    "property_settings",
    "register_profiles",
    "scaled",
]

DEFAULT_PROFILE = "dev"
PROFILES = ("dev", "ci", "thorough")
CI_SEED = 20261130

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]
# The explain phase reruns variants of a shrunk failure to annotate it; on a failing
# backend it can cost minutes, so the fast profiles skip it (thorough keeps it).
_FAST_PHASES = [phase for phase in Phase if phase is not Phase.explain]
SEEDED_PHASES = [phase for phase in _FAST_PHASES if phase is not Phase.reuse]
"""The ``ci`` profile's phases: no explain, and no replay of the database."""
_FRACTION_ATTRIBUTE = "_tp_logprob_examples_fraction"

Test = TypeVar("Test", bound=Callable[..., Any])


def profile_name(profile: str) -> str:
    """The name a suite profile is registered under in Hypothesis: ``tp_logprob.<profile>``.

    A name that is not one of :data:`PROFILES` is a Hypothesis profile of the user's
    own (``--hypothesis-profile``) and is returned as it is.
    """
    return f"tp_logprob.{profile}" if profile in PROFILES else profile


def register_profiles() -> None:
    """Register the three profiles under :func:`profile_name`; idempotent.

    The database is the local directory one, multiplexed with a shared one when
    ``TP_LOGPROB_SHARED_DB`` or ``TP_LOGPROB_HYPOTHESIS_REDIS`` is set (see
    :mod:`tp_logprob.suite.databases`).
    """
    database = example_database()
    settings.register_profile(
        profile_name("dev"),
        max_examples=25,
        deadline=None,
        database=database,
        phases=_FAST_PHASES,
        suppress_health_check=_SLOW_OK,
    )
    settings.register_profile(
        profile_name("ci"),
        max_examples=25,
        deadline=None,
        database=database,
        phases=SEEDED_PHASES,
        report_multiple_bugs=False,
        print_blob=True,
        suppress_health_check=_SLOW_OK,
    )
    settings.register_profile(
        profile_name("thorough"),
        max_examples=10_000,
        deadline=None,
        database=database,
        phases=list(Phase),
        suppress_health_check=_SLOW_OK,
    )


def name_suite_profile(name: str) -> None:
    """Let Hypothesis load the suite's profile ``name`` by its plain name, as
    ``--hypothesis-profile=dev`` (or ``ci``, ``thorough``) asks it to.

    The suite registers its profiles under :func:`profile_name` only, so that a project's
    own ``dev`` stays its own; a name already registered (the project's, or Hypothesis' own
    ``ci``) is left as it is.
    """
    if name not in PROFILES:
        return
    try:
        settings.get_profile(name)
    except InvalidArgument:
        register_profiles()
        settings.register_profile(name, parent=settings.get_profile(profile_name(name)))


def scaled(fraction: float) -> Callable[[Test], Test]:
    """Give a property ``fraction`` of the profile's examples (at least 1).

    For properties that run several backends or layouts per example. It only marks
    the test; the plugin turns the mark into settings once it knows the profile
    (:func:`property_settings`), so importing a property module reads no profile.
    """

    def mark(test: Test) -> Test:
        setattr(test, _FRACTION_ATTRIBUTE, fraction)
        return test

    return mark


def examples_fraction(test: object) -> float:
    """The share of the profile's examples :func:`scaled` gave ``test`` (1.0 if none)."""
    return float(getattr(test, _FRACTION_ATTRIBUTE, 1.0))


def property_settings(profile: str, test: object) -> settings:
    """The settings ``test`` runs under with ``profile``: the profile, scaled by its mark."""
    base = settings.get_profile(profile_name(profile))
    return settings(base, max_examples=max(1, round(base.max_examples * examples_fraction(test))))
