"""The property suite on a real process group: ``torchrun ... -m pytest --pyargs ...``.

:mod:`tp_logprob.pytest_plugin` calls :func:`start` from ``pytest_configure`` when
``torchrun`` started the process (:func:`~tp_logprob.real_group.group.launched_by_torchrun`)
and the suite is requested; otherwise nothing here runs. :func:`start` refuses
pytest-xdist and plugins that reorder tests per process, joins the process group
(gloo on CPU, NCCL on GPUs, see :class:`~tp_logprob.real_group.group.RealGroup`),
gives every rank rank 0's seed, sends the non-zero ranks' output to their logs, and
registers :class:`RealGroupPlugin`, which checks that every rank collected the same
tests, runs every property test in lockstep
(:mod:`tp_logprob.real_group.lockstep`) under settings with nothing left to the
clock, and stops the session cleanly when the ranks abort.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

from tp_logprob.real_group.group import Launch, RealGroup, RealGroupError
from tp_logprob.real_group.lockstep import (
    RealGroupAbort,
    suspend_shrink_time_limit,
)
from tp_logprob.suite.session import Suite

__all__ = [
    "REORDERING_PLUGINS",
    "RealGroupPlugin",
    "check_scheduling",
    "collection_difference",
    "redirect_output",
    "start",
]

REORDERING_PLUGINS = {
    "randomly": "pytest-randomly",
    "random_order": "pytest-random-order",
    "random-order": "pytest-random-order",
}
"""Plugins known to reorder (or reseed) tests per process, by the name pytest loads them as."""


def start(
    config: pytest.Config, suite: Suite, is_property: Callable[[pytest.Item], bool]
) -> RealGroupPlugin:
    """Join the real process group for this session and register the plugin that runs on it
    (which runs the items ``is_property`` picks in lockstep)."""
    check_scheduling(config)
    timeout = config.getoption("--tp-logprob-group-timeout")
    if not timeout > 0:  # NaN too
        raise pytest.UsageError(
            f"--tp-logprob-group-timeout={timeout!r}: expected a positive number of seconds"
        )
    try:
        launch = Launch.from_environ()
        group = RealGroup.start(
            launch,
            platform=suite.platform,
            timeout=timeout,
            log_dir=config.getoption("--tp-logprob-rank-logs"),
        )
    except RealGroupError as error:
        raise pytest.UsageError(f"tp-logprob on a real process group: {error}") from None
    chosen = (suite.seed, _choices(config, suite))
    agreed = group.gather_object(chosen)
    differing = [rank for rank, (_, choices) in enumerate(agreed) if choices != chosen[1]]
    if differing:
        group.close()
        raise pytest.UsageError(
            f"tp-logprob on a real process group: rank(s) {differing} were started with other "
            f"options or environment than rank {group.rank} (command line, profile, platform, "
            "backends): every rank must run the same suite"
        )
    suite.seed = agreed[0][0]  # every rank draws from rank 0's seed
    suite.join(group)  # its properties run under lockstep settings, its cases on the group
    plugin = RealGroupPlugin(config, suite, group, is_property)
    config.pluginmanager.register(plugin, "tp_logprob_real_group")
    return plugin


def redirect_output(rank: int, log_dir: str | Path) -> Path:
    """Send this process's stdout and stderr (file descriptors 1 and 2) to ``rank{rank}.out``
    under ``log_dir``, for good: a rank other than 0 keeps the terminal to rank 0.

    Called before pytest starts capturing, so that what pytest restores between tests
    is the file too.
    """
    path = Path(log_dir) / f"rank{rank}.out"
    path.parent.mkdir(parents=True, exist_ok=True)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for fd in (1, 2):
        os.dup2(target, fd)
    os.close(target)
    return path


def check_scheduling(config: pytest.Config) -> None:
    """pytest-xdist and test-reordering plugins would give each rank other tests."""
    workers = config.getoption("numprocesses", None)
    mode = config.getoption("dist", "no")
    if workers or mode not in (None, "no"):
        raise pytest.UsageError(
            f"-n {workers} (--dist={mode}): pytest-xdist cannot run the suite on a real process "
            "group, where each torchrun process is one rank and every rank must run every "
            "test in the same order; drop -n (or pass -p no:xdist)"
        )
    for name, distribution in REORDERING_PLUGINS.items():
        if config.pluginmanager.has_plugin(name):
            raise pytest.UsageError(
                f"{distribution} is active: it orders (or seeds) tests per process, and every "
                f"rank of a real process group must run the same tests in the same order; "
                f"pass -p no:{name}"
            )


def _choices(config: pytest.Config, suite: Suite) -> str:
    """What must be the same on every rank: the command line and what the suite chose."""
    text = repr(
        (
            list(config.invocation_params.args),
            suite.profile,
            suite.platform,
            suite.specs,
            suite.wide_max_vocab,
        )
    )
    return hashlib.sha256(text.encode()).hexdigest()


def collection_difference(rank: int, collected: list[list[str]]) -> str | None:
    """What differs between rank ``rank``'s tests and another rank's (``collected`` holds
    every rank's node ids, in rank order), or None when every rank has the same."""
    mine = collected[rank]
    for other, theirs in enumerate(collected):
        if theirs == mine:
            continue
        index = next(
            (i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b),
            min(len(mine), len(theirs)),
        )
        ours = mine[index] if index < len(mine) else "(the end)"
        their = theirs[index] if index < len(theirs) else "(the end)"
        return (
            f"rank {other} collected other tests than rank {rank} ({len(theirs)} against "
            f"{len(mine)}); first difference at position {index}: {their!r} against {ours!r}. "
            "Every rank must run the same tests in the same order (no -k, --lf or reordering "
            "plugin on one rank only)"
        )
    return None


class RealGroupPlugin:
    """Hooks for a session whose process is one rank of a real process group."""

    def __init__(
        self,
        config: pytest.Config,
        suite: Suite,
        group: RealGroup,
        is_property: Callable[[pytest.Item], bool],
    ) -> None:
        self.config, self.suite, self.group = config, suite, group
        self.is_property = is_property
        self.rank, self.world_size = group.rank, group.world_size
        self.log_dir = Path(config.getoption("--tp-logprob-rank-logs"))
        suite.launcher = ["torchrun", "--standalone", f"--nproc-per-node={self.world_size}", "-m"]
        suite.writes_artifacts = self.rank == 0

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        group = self.group
        return [
            f"tp-logprob: real process group of {group.describe()} (this is rank {self.rank}), "
            f"timeout {group.tp.timeout:g} s, control group gloo; lockstep: rank 0's seed "
            f"{self.suite.seed} on every rank, no example database, no deadline, no shrinking "
            f"time limit in the properties; rank logs in {self.log_dir}/ (ranks 1+ also "
            "write rank<r>.out)"
        ]

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """Every property test runs in lockstep (under the settings
        :meth:`~tp_logprob.suite.session.Suite.settings_for` gives on a real group)."""
        lockstep = self.group.lockstep
        for item in items:
            if not self.is_property(item):
                continue
            test: Any = getattr(item, "obj", None)
            inner = getattr(getattr(test, "hypothesis", None), "inner_test", None)
            if inner is None:
                item.obj = lockstep.wrap(test)  # type: ignore[attr-defined]
                continue
            if not getattr(inner, "_tp_logprob_lockstep", False):
                wrapped = lockstep.wrap(inner)
                wrapped._tp_logprob_lockstep = True  # type: ignore[attr-defined]
                test.hypothesis.inner_test = wrapped

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Every rank must have collected the same tests, in the same order."""
        mine = [item.nodeid for item in session.items]
        problem = collection_difference(self.rank, self.group.gather_object(mine))
        if problem is not None:
            raise pytest.UsageError(f"tp-logprob on a real process group: {problem}")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        """Every rank starts the test together; a property test shrinks with no time limit,
        for its own run only (any other test in the session keeps Hypothesis' limit)."""
        self.group.lockstep.start_test(f"{Path(str(item.path)).name}::{item.name}")
        if not self.is_property(item):
            return (yield)
        with suspend_shrink_time_limit():
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """An aborted group stops the session after this test (its report says why)."""
        report = yield
        if call.excinfo is not None and isinstance(call.excinfo.value, RealGroupAbort):
            item.session.shouldstop = f"real process group aborted in {item.nodeid}"
        return report

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.group.close()
