"""The suite's session: what one run of the suite decided, handed to every property.

The pytest plugin builds one :class:`Suite` per session from its options and
gives it to the properties as the ``tp_logprob_suite`` fixture; the properties
read the backends under test, the platform, the profile, the seed and the
counters from it. Nothing here is resolved until asked: importing it imports
neither torch nor triton.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hypothesis import settings

from tp_logprob.suite.profiles import (
    PROFILES,
    profile_name,
    property_settings,
    register_profiles,
)
from tp_logprob.suite.summary import NotClaimed, SuiteStats

if TYPE_CHECKING:
    from tp_logprob.suite.backends import BackendUnderTest, RankGroup

__all__ = ["DEFAULT_ARTIFACTS_DIR", "Suite"]

DEFAULT_ARTIFACTS_DIR = ".tp_logprob/failures"


@dataclass
class Suite:
    """What one run of the suite decided: backends, platform, profile, seed, stats."""

    specs: list[str]
    platform_option: str | None
    profile: str
    seed: int | str
    stats: SuiteStats
    artifacts: str = DEFAULT_ARTIFACTS_DIR
    wide_max_vocab: int = 1 << 18
    active: bool = False
    everywhere: bool = False
    launcher: list[str] = field(default_factory=list)
    writes_artifacts: bool = True
    not_claimed: NotClaimed = field(default_factory=NotClaimed)
    group: RankGroup | None = None
    _backends: list[BackendUnderTest] | None = None
    _platform: str | None = None

    @property
    def platform(self) -> str:
        if self._platform is None:
            from tp_logprob.registry import detect_platform

            self._platform = self.platform_option or detect_platform()
        return self._platform

    def backends(self) -> list[BackendUnderTest]:
        """The backends under test, resolved once; a
        :class:`~tp_logprob.suite.backends.BackendSpecError` for a spec that names none."""
        if self._backends is None:
            from tp_logprob.suite.backends import resolve_backends

            backends = resolve_backends(self.specs, self.platform)
            self._backends = [dataclasses.replace(b, group=self.group) for b in backends]
        return self._backends

    def join(self, group: RankGroup) -> None:
        """Run on ``group`` from now on: every property under its settings, every backend
        handed out bound to it (a case of its TP degree runs there)."""
        self.group = group
        if self._backends is not None:
            self._backends = [dataclasses.replace(b, group=group) for b in self._backends]

    def settings_for(self, test: object) -> settings:
        """The settings property ``test`` runs under: the profile scaled by its mark and, on
        a real process group, with nothing left to the clock or the process."""
        chosen = property_settings(self.profile, test)
        return chosen if self.group is None else self.group.settings_for(chosen)

    def activate(self) -> None:
        """The suite was requested: register its profiles (once); with the project's
        opt-in, also make the chosen profile the session's default."""
        if self.active:
            return
        self.active = True
        register_profiles()
        if self.everywhere and self.profile in PROFILES:
            settings.load_profile(profile_name(self.profile))  # else the user's own was loaded
