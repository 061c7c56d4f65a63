"""The historical benchmark: its corpus, the Liger adapter's per-release calls, the verdicts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tp_logprob.peers._history_corpus import CORPUS, HistoricalBug, releases
from tp_logprob.peers.history import verdict
from tp_logprob.peers.liger import liger_arguments

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("release", "count", "weight"),
    [((0, 4, 1), 6, False), ((0, 5, 2), 6, False), ((0, 5, 3), 7, True), ((0, 6, 4), 8, True),
     ((0, 8, 0), 9, True), ((0, 8, 5), 9, True)],
)  # fmt: skip
def test_liger_arguments_follow_each_releases_forward(
    release: tuple[int, ...], count: int, weight: bool
) -> None:
    arguments = liger_arguments(release, -100)
    assert len(arguments) == count
    assert (arguments[0] is None) is weight
    assert arguments[weight : weight + 4] == (-100, 0.0, 0.0, "none")


def test_liger_arguments_refuse_releases_before_reduction() -> None:
    with pytest.raises(RuntimeError, match=r"liger-kernel 0\.4\.0"):
        liger_arguments((0, 4, 0), -100)


def test_every_runnable_entry_has_a_reproducer_and_its_releases() -> None:
    for bug in CORPUS:
        if bug.unavailable is None:
            assert bug.reproducer is not None and (ROOT / bug.reproducer).is_file(), bug.key
            for version in bug.versions:
                assert f"{bug.distribution}=={version}" in releases()
    assert len(releases()) == len(set(releases()))


_BUG = HistoricalBug("k", "Lib", "lib", "s", "r", "1.0", "1.1", "m:honest", "yes", "repro.py")
_OPEN = HistoricalBug("o", "Lib", "lib", "s", "r", "1.1", None, "m:honest", "yes", "repro.py")


def _results(failing: dict[str, list[str]], codes: dict[str, int], kept: Any = None) -> Any:
    def run(tests: list[str]) -> dict[str, Any]:
        seconds = {"test_a": 1.0, "test_b": 2.0, "test_c": 0.5}  # test_c fails first
        properties = {
            name: {"outcome": "failed" if name in tests else "passed", "headline": "h",
                   "seconds": at, "example": "x"}
            for name, at in seconds.items()
        }  # fmt: skip
        return {"seconds": 1.0, "properties": properties}

    return {
        f"lib=={version}": {
            "adapters": {
                "m:honest": {"fresh": run(tests), "kept": run((kept or failing)[version])}
            },
            "reproducers": {"repro.py": codes[version]},
        }
        for version, tests in failing.items()
    }


def test_found_is_the_first_property_failing_on_the_buggy_release_only() -> None:
    results = _results({"1.0": ["test_a", "test_b"], "1.1": ["test_a"]}, {"1.0": 1, "1.1": 0})
    seen = verdict(_BUG, results)
    assert (seen["verdict"], seen["property"], seen["reproducer_flips"]) == (
        "found",
        "test_b",
        True,
    )
    assert seen["same_with_kept_database"] is True


def test_the_property_that_found_it_is_the_first_to_fail() -> None:
    results = _results({"1.0": ["test_b", "test_c"], "1.1": []}, {"1.0": 1, "1.1": 0})
    seen = verdict(_BUG, results)
    assert (seen["property"], seen["also"]) == ("test_c", ["test_b"])


def test_a_failure_the_fixed_release_shares_is_not_found() -> None:
    results = _results({"1.0": ["test_a"], "1.1": ["test_a"]}, {"1.0": 1, "1.1": 0})
    assert verdict(_BUG, results)["verdict"] == "not found"


def test_a_kept_database_that_changes_the_verdict_is_reported() -> None:
    fresh = {"1.0": ["test_b"], "1.1": []}
    results = _results(fresh, {"1.0": 1, "1.1": 0}, kept={"1.0": [], "1.1": []})
    assert verdict(_BUG, results)["same_with_kept_database"] is False


def test_an_open_bug_is_found_only_with_its_reproducer_failing() -> None:
    assert verdict(_OPEN, _results({"1.1": ["test_c"]}, {"1.1": 1}))["verdict"] == (
        "found, not yet fixed"
    )
    assert verdict(_OPEN, _results({"1.1": ["test_c"]}, {"1.1": 0}))["verdict"] == "not found"


def test_an_unavailable_entry_says_why() -> None:
    bug = HistoricalBug("u", "L", "l", "s", "r", "1", "2", "-", "no", unavailable="why")
    assert verdict(bug, {}) == {"verdict": "not runnable here", "reason": "why"}


def test_a_release_without_results_is_not_run_and_fails_the_report(tmp_path: Path) -> None:
    from tp_logprob.peers.history import report

    assert verdict(_BUG, {})["verdict"] == "not run"
    assert report([], tmp_path / "history.md") == 1
    assert "not run: no results for liger-kernel==" in (tmp_path / "history.md").read_text()


def test_a_smoke_report_judges_only_its_entries(tmp_path: Path) -> None:
    import json

    from tp_logprob.peers.history import report

    paths = []
    for version, tests, code in (("0.5.8", ["test_a"], 1), ("0.5.9", [], 0)):
        properties = {
            name: {"outcome": "failed" if name in tests else "passed", "headline": "h",
                   "seconds": 1.0, "example": None}
            for name in ("test_a", "test_b")
        }  # fmt: skip
        run = {"seconds": 1.0, "properties": properties}
        result = {
            "release": f"liger-kernel=={version}",
            "adapters": {"tp_logprob.peers.liger:honest": {"fresh": run, "kept": run}},
            "reproducers": {"docs/history/repro_liger_ce_none_grad_output.py": code},
        }
        paths.append(tmp_path / f"{version}.json")
        paths[-1].write_text(json.dumps(result))
    markdown = tmp_path / "history.md"
    assert report(paths, markdown, ["liger_ce_none_grad_output"]) == 0
    assert report(paths, markdown) == 1  # the other Liger entries were not run


@pytest.mark.parametrize("version", ["0.15.0", "0.15.2", "0.16.0", "0.16.1"])
def test_trl_grpo_adapter_serves_the_four_argument_method(version: str) -> None:
    from tp_logprob.peers.trl_grpo import check_release

    check_release(version)


@pytest.mark.parametrize("version", ["0.14.0", "0.17.0", "1.16.0", "main"])
def test_trl_grpo_adapter_refuses_other_releases_by_version(version: str) -> None:
    from tp_logprob.peers.trl_grpo import check_release

    with pytest.raises(RuntimeError, match=r"serves 0\.15 and 0\.16"):
        check_release(version)


def test_requirements_follow_the_entries_of_a_release() -> None:
    from tp_logprob.peers._history_corpus import requirements

    assert "transformers==4.49.0" in requirements("trl==0.15.2")
    assert requirements("liger-kernel==0.5.8") == ()
