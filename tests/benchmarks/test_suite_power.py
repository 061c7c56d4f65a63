"""benchmarks/suite_power.py without running the suite: the reach declarations, the runs it
plans, how it reads a finished run, and the report it writes from made-up runs."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.benchmarks import load_benchmark
from tests.mutants import MUTANTS, REACH_PROPERTIES

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    return load_benchmark("suite_power")


sp = _load()

LONG = sp.Target("long", "tests.mutants.x:long", "a bug past row 64", ("test_long_batches",))
PLAIN = sp.Target("plain", "tests.mutants.x:plain", "a bug anyone sees")
CONTROL = sp.Target("control", "torch_native", None)


def _args(**overrides: object) -> argparse.Namespace:
    fields: dict[str, object] = {
        "all_properties": False,
        "argv": [],
        "seed": [7],
        "jobs": 2,
        "profile": "ci",
        "platform": "cpu",
    }
    return argparse.Namespace(**{**fields, **overrides})


def _done(returncode: int) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(["pytest"], returncode, "", "")


def _failure(test: str, headline: str = "out of tolerance") -> object:
    return sp.Failure(test, headline, 0.5, True)


def test_every_reach_declaration_names_reach_properties_of_the_suite() -> None:
    declared = [mutant for mutant in MUTANTS if mutant.reach]
    assert declared, "no mutant declares reach"
    for mutant in declared:
        assert set(mutant.reach) <= set(REACH_PROPERTIES), mutant
        assert len(set(mutant.reach)) == len(mutant.reach), mutant
    for name in REACH_PROPERTIES:
        assert sp.property_module(name).name.startswith("test_")


def test_deselects_every_parametrization_of_a_property_and_no_other() -> None:
    (prefix,) = sp.reach_deselects(["test_long_batches"])
    assert prefix == "src/tp_logprob/properties/test_long_batches.py::test_long_batches["
    module = "src/tp_logprob/properties/test_long_batches.py"
    assert f"{module}::test_long_batches[mutant_long]".startswith(prefix)
    assert not f"{module}::test_fused_long_batches[mutant_long]".startswith(prefix)
    (row_positions,) = sp.reach_deselects(["test_row_positions"])
    assert row_positions.startswith("src/tp_logprob/properties/test_determinism.py::")
    assert f"--deselect={prefix}" in sp.suite_args("SPEC", 7, _args(), [prefix])


def test_an_unknown_reach_property_stops_the_plan() -> None:
    wrong = sp.Target("wrong", "tests.mutants.x:wrong", "a bug", ("test_no_such_property",))
    with pytest.raises(ValueError, match="'test_no_such_property': defined in 0 modules"):
        sp.plan([PLAIN, wrong], [7])


def test_plan_runs_a_reach_mutant_again_without_its_reach() -> None:
    runs = sp.plan([LONG, PLAIN, CONTROL], [7, 8])
    assert runs == [
        (LONG, 7, False),
        (LONG, 8, False),
        (LONG, 7, True),
        (LONG, 8, True),
        (PLAIN, 7, False),
        (PLAIN, 8, False),
        (CONTROL, 7, False),
        (CONTROL, 8, False),
    ]


def test_reads_pytest_junit_xml(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase name="test_a[mutant_long]" time="0.1"/>'
        '<testcase name="test_b[mutant_long-tp1]" time="2.5">'
        '<failure message="long batch: 65 rows, a row out of tolerance&#10;more">x</failure>'
        "</testcase>"
        '<testcase name="test_c[mutant_long]" time="0"><skipped message="hidden only"/></testcase>'
        "</testsuite></testsuites>"
    )
    ran, failures = sp._junit(junit)
    assert ran == {"test_a", "test_b", "test_c"}
    assert failures == (
        sp.Failure("test_b", "long batch: 65 rows, a row out of tolerance", 2.5, True),
    )
    assert sp._junit(tmp_path / "missing.xml") == (frozenset(), ())


def test_without_its_reach_a_mutant_must_survive() -> None:
    ran = frozenset({"test_oracle"})
    survived = sp.classify(LONG, 7, _done(0), ran, (), 30.0, without_reach=True)
    assert (survived.status, survived.ok) == ("survived", True)
    failed = (_failure("test_oracle"),)
    killed = sp.classify(LONG, 7, _done(1), ran, failed, 30.0, without_reach=True)
    assert (killed.status, killed.ok) == ("killed", False)
    main = sp.classify(LONG, 7, _done(1), ran, failed, 30.0)
    assert (main.status, main.ok) == ("killed", True)


def test_a_reach_property_that_ran_makes_the_run_an_error() -> None:
    ran = frozenset({"test_oracle", "test_long_batches"})
    run = sp.classify(LONG, 7, _done(0), ran, (), 30.0, without_reach=True)
    assert (run.status, run.ok) == ("error", False)
    assert run.note == "not deselected (they ran): test_long_batches"


def _report(runs: list[object], targets: list[object]) -> tuple[str, bool]:
    by_name = {t.name: [r for r in runs if r.target is t] for t in targets}
    text: str
    ok: bool
    text, ok = sp.report(by_name, targets, _args(), 60.0)
    return text, ok


def _reach_table(text: str) -> list[str]:
    section = text.split("## Reach: mutants only the reach properties kill")[1]
    return [line for line in section.split("## ")[0].splitlines() if line.startswith("| ")]


def test_report_shows_what_kills_a_reach_mutant_and_that_it_survives_without() -> None:
    runs = [
        sp.Run(LONG, 7, "killed", (_failure("test_long_batches"),), 20.0),
        sp.Run(LONG, 7, "survived", (), 55.0, without_reach=True),
        sp.Run(PLAIN, 7, "killed", (_failure("test_oracle"),), 10.0),
        sp.Run(CONTROL, 7, "passed", (), 50.0),
    ]
    text, ok = _report(runs, [LONG, PLAIN, CONTROL])
    assert ok
    assert _reach_table(text) == [
        "| mutant | reach properties | killed by (with them) | without them | wall s (without) |",
        "| long | `test_long_batches` | `test_long_batches` | survived | 55.0 |",
    ]
    assert "| long | a bug past row 64 | killed | `test_long_batches` |" in text
    assert "- reach mutants that survive without their reach properties: 1 of 1" in text
    assert "- not as expected: none" in text


def test_report_fails_when_a_mutant_dies_without_its_reach() -> None:
    runs = [
        sp.Run(LONG, 7, "killed", (_failure("test_long_batches"),), 20.0),
        sp.Run(LONG, 7, "killed", (_failure("test_oracle", "oracle agreement"),), 9.0, "", True),
        sp.Run(CONTROL, 7, "passed", (), 50.0),
    ]
    text, ok = _report(runs, [LONG, CONTROL])
    assert not ok
    row = _reach_table(text)[1]
    assert row == (
        "| long | `test_long_batches` | `test_long_batches` | "
        "killed: `test_oracle` oracle agreement | 9.0 |"
    )
    assert "- reach mutants that survive without their reach properties: 0 of 1" in text
    assert "- not as expected: long (without its reach properties)" in text


def test_report_has_no_reach_section_without_reach_mutants() -> None:
    runs = [sp.Run(PLAIN, 7, "killed", (_failure("test_oracle"),), 10.0)]
    text, ok = _report(runs, [PLAIN])
    assert ok
    assert "## Reach" not in text
    assert "reach mutants" not in text


@pytest.mark.slow
def test_pytest_collects_none_of_a_mutants_reach_properties_and_the_rest(tmp_path: Path) -> None:
    """The deselect prefixes against pytest's own node ids."""
    mutant = next(m for m in MUTANTS if len(m.reach) > 1)
    args = sp.suite_args(mutant.spec, 7, _args(), sp.reach_deselects(mutant.reach))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "--collect-only"],
        cwd=ROOT,
        env=sp._environment(tmp_path / "hypothesis"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    collected = {
        line.split("::")[1].split("[")[0] for line in done.stdout.splitlines() if "::" in line
    }
    assert not collected & set(mutant.reach)
    assert "test_matches_exact_oracle" in collected
    assert "test_fused_matches_exact_oracle" not in collected  # a logits backend's: not claimed
    not_claimed = re.search(
        r"^not claimed, so not collected \((\d+) deselected\)", done.stdout, re.M
    )
    assert not_claimed is not None, done.stdout
    assert f"{len(mutant.reach) + int(not_claimed.group(1))} deselected" in done.stdout
