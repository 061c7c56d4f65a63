"""The checks the suite makes before it runs on a real process group, without starting one."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tp_logprob.real_group.group import Launch, RealGroupError, launched_by_torchrun
from tp_logprob.real_group.plugin import (
    RealGroupPlugin,
    check_scheduling,
    collection_difference,
)

TORCHRUN = {"TORCHELASTIC_RUN_ID": "x", "RANK": "1", "WORLD_SIZE": "3", "LOCAL_RANK": "1"}


def test_torchrun_is_recognised_by_every_variable_it_sets() -> None:
    assert launched_by_torchrun(TORCHRUN)
    for missing in TORCHRUN:
        assert not launched_by_torchrun({k: v for k, v in TORCHRUN.items() if k != missing})


def test_the_launch_is_read_from_the_environment() -> None:
    assert Launch.from_environ(TORCHRUN) == Launch(rank=1, world_size=3, local_rank=1)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"RANK": "one"}, "RANK='one': expected a non-negative integer"),
        ({"WORLD_SIZE": "-2"}, "WORLD_SIZE='-2': expected a non-negative integer"),
        ({"LOCAL_RANK": None}, "LOCAL_RANK=None: expected a non-negative integer"),
        ({"RANK": "3"}, "RANK=3, WORLD_SIZE=3: the rank must be below the world size"),
        ({"WORLD_SIZE": "0", "RANK": "0"}, "WORLD_SIZE=0: the rank must be below"),
    ],
)
def test_a_bad_launch_names_the_variable(changes: dict[str, Any], message: str) -> None:
    environ = {**TORCHRUN, **changes}
    environ = {key: value for key, value in environ.items() if value is not None}
    with pytest.raises(RealGroupError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Launch.from_environ(environ)


def test_every_rank_with_the_same_tests_is_no_difference() -> None:
    assert collection_difference(0, [["a", "b"], ["a", "b"]]) is None


def test_another_order_or_count_names_the_rank_and_the_first_difference() -> None:
    reordered = collection_difference(0, [["a", "b", "c"], ["a", "c", "b"]])
    assert reordered is not None
    assert "rank 1 collected other tests than rank 0 (3 against 3)" in reordered
    assert "first difference at position 1: 'c' against 'b'" in reordered
    shorter = collection_difference(1, [["a"], ["a", "b"]])
    assert shorter is not None
    assert "position 1: '(the end)' against 'b'" in shorter


class _Config:
    """Just what check_scheduling reads from a pytest config."""

    def __init__(self, options: dict[str, Any], plugins: set[str]) -> None:
        self.options, self.plugins = options, plugins
        self.pluginmanager = self

    def getoption(self, name: str, default: Any = None) -> Any:
        return self.options.get(name, default)

    def has_plugin(self, name: str) -> bool:
        return name in self.plugins


def test_plain_scheduling_is_accepted() -> None:
    check_scheduling(_Config({"numprocesses": None, "dist": "no"}, {"tp_logprob"}))
    check_scheduling(_Config({"numprocesses": 0}, set()))


@pytest.mark.parametrize(
    ("options", "plugins", "message"),
    [
        ({"numprocesses": 2, "dist": "load"}, set(), r"-n 2 \(--dist=load\): pytest-xdist"),
        ({"numprocesses": "auto"}, set(), r"-n auto"),
        ({}, {"randomly"}, r"pytest-randomly is active.*pass -p no:randomly"),
        ({}, {"random_order"}, r"pytest-random-order is active"),
    ],
)
def test_per_process_scheduling_is_refused(
    options: dict[str, Any], plugins: set[str], message: str
) -> None:
    with pytest.raises(pytest.UsageError, match=message):
        check_scheduling(_Config(options, plugins))


class _Lockstep:
    def __init__(self) -> None:
        self.started: list[str] = []

    def start_test(self, nodeid: str) -> None:
        self.started.append(nodeid)


@pytest.mark.parametrize("is_property", [True, False], ids=["property", "other test"])
def test_only_a_property_test_shrinks_without_a_time_limit_and_only_while_it_runs(
    is_property: bool,
) -> None:
    from hypothesis.internal.conjecture import engine

    lockstep = _Lockstep()
    plugin = SimpleNamespace(
        group=SimpleNamespace(lockstep=lockstep), is_property=lambda item: is_property
    )
    item = SimpleNamespace(path=Path("tests/test_x.py"), name="test_y")
    before = engine.MAX_SHRINKING_SECONDS
    call = RealGroupPlugin.pytest_runtest_call(plugin, item)  # type: ignore[arg-type]
    next(call)
    during = engine.MAX_SHRINKING_SECONDS
    with pytest.raises(StopIteration):
        call.send(None)
    assert lockstep.started == ["test_x.py::test_y"]
    after = engine.MAX_SHRINKING_SECONDS
    assert (during, after) == (math.inf if is_property else before, before)
