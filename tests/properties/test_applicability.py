"""What the suite reports: a property a backend does not claim is deselected and listed once
per backend, never skipped; the closing table counts a failing example.

The sessions run in a fresh process on the CPU torch backends (no interpreter), and
only what they need: collection, the pinned cases, one capability sweep.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tp_logprob.contract import DeterminismScope
from tp_logprob.kernels.builtin import TORCH_NATIVE, TORCH_NATIVE_FUSED, TRITON_EXACT_SUM
from tp_logprob.registry import KernelRegistry
from tp_logprob.suite.applicability import (
    CROSS_TP_BITWISE,
    HIDDEN_INPUT,
    LEAVES_INPUTS,
    LOGITS_INPUT,
    SEVERAL_LAYOUTS,
    applies_to,
    unclaimed,
)
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.summary import NotClaimed, SuiteStats

ROOT = Path(__file__).resolve().parents[2]


def _backend(capability: object) -> BackendUnderTest:
    return BackendUnderTest("spec", capability, KernelRegistry(), "cpu")  # type: ignore[arg-type]


def test_a_requirement_names_the_capability_field_not_claimed() -> None:
    native, fused = _backend(TORCH_NATIVE), _backend(TORCH_NATIVE_FUSED)
    assert LOGITS_INPUT(native, {}) is None
    assert LOGITS_INPUT(fused, {}) == "input_kind 'logits'"
    assert HIDDEN_INPUT(native, {}) == "input_kind 'hidden'"
    assert CROSS_TP_BITWISE(native, {}) == "determinism_scope 'cross_tp_bitwise'"
    assert CROSS_TP_BITWISE(_backend(TRITON_EXACT_SUM), {}) is None
    consuming = dataclasses.replace(TORCH_NATIVE, consumes_input=True)
    assert LEAVES_INPUTS(_backend(consuming), {}) == "consumes_input=True"


def test_one_layout_per_vocabulary_is_not_claimed_by_a_single_even_tp_degree() -> None:
    assert SEVERAL_LAYOUTS(_backend(TORCH_NATIVE), {}) is None  # every TP degree
    tp1 = dataclasses.replace(TORCH_NATIVE, tp_world_sizes=frozenset({1}))
    assert (
        SEVERAL_LAYOUTS(_backend(tp1), {}) == "tp_world_sizes [1] (one shard layout per vocabulary)"
    )
    even = dataclasses.replace(TORCH_NATIVE, tp_world_sizes=frozenset({2}), even_shards_only=True)
    assert SEVERAL_LAYOUTS(_backend(even), {}) is not None
    uneven = dataclasses.replace(TORCH_NATIVE, tp_world_sizes=frozenset({2}))
    assert SEVERAL_LAYOUTS(_backend(uneven), {}) is None  # uneven bounds at TP 2


def test_the_first_unmet_requirement_is_the_reason() -> None:
    @applies_to(LOGITS_INPUT, CROSS_TP_BITWISE)
    def test() -> None: ...

    assert unclaimed(test, _backend(TORCH_NATIVE_FUSED), {}) == "input_kind 'logits'"
    assert unclaimed(test, _backend(TORCH_NATIVE), {}) == "determinism_scope 'cross_tp_bitwise'"
    scopes = frozenset({DeterminismScope.CROSS_TP_BITWISE})
    assert (
        unclaimed(test, _backend(dataclasses.replace(TORCH_NATIVE, determinism_scopes=scopes)), {})
        is None
    )
    assert unclaimed(lambda: None, _backend(TORCH_NATIVE_FUSED), {}) is None  # nothing declared


def test_not_claimed_lists_each_backend_once_and_survives_json() -> None:
    record = NotClaimed()
    record.add("b", "input_kind 'logits'", "t.py::x[b]")
    record.add("b", "input_kind 'logits'", "t.py::y[b]")
    record.add("a", "input_kind 'hidden'", "t.py::z[a]")
    again = NotClaimed.from_json(record.to_json())
    assert again == record
    assert again.lines() == [
        "not claimed, so not collected (3 deselected):",
        "  a  input_kind 'hidden' (1)",
        "  b  input_kind 'logits' (2)",
    ]
    assert NotClaimed().lines() == []


def test_a_failing_example_raises_the_worst_error_even_past_what_passed() -> None:
    stats = SuiteStats()
    stats.error("b", "oracle agreement", 3.0, 0.5)
    stats.failure("b", "capability truthfulness", 2.1e10, 2.4e9)
    row = stats.table()[1]
    assert "2.4e+09 (capability truthfulness)" in row and "2.1e+10 (capability truthfulness)" in row
    stats.failure("c", "pinned case", math.nan, math.nan)  # NaN where a finite value was due
    assert "inf (pinned case)" in stats.table()[2]


def _suite(
    *args: str, tests: tuple[str, ...] = ("--pyargs", "tp_logprob.properties")
) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT)]))
    command = [sys.executable, "-m", "pytest", *tests, "-p", "no:cacheprovider"]
    command += ["--tp-logprob-profile=ci", "--tp-logprob-platform=cpu"]
    return subprocess.run(
        [*command, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_what_a_backend_does_not_claim_is_deselected_and_listed() -> None:
    done = _suite(
        "--tp-logprob-backend=torch_native",
        "--tp-logprob-backend=torch_native_fused",
        "--collect-only",
        "-q",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    assert not [line for line in collected if "test_fused.py" in line and "[torch_native]" in line]
    assert not [line for line in collected if "test_oracle.py" in line and "_fused]" in line]
    assert any("test_fused.py" in line and "[torch_native_fused]" in line for line in collected)
    found = re.search(r"^(\d+)/(\d+) tests collected \((\d+) deselected\)", done.stdout, re.M)
    assert found is not None, done.stdout
    kept, total, deselected = map(int, found.groups())
    assert (kept, kept + deselected) == (len(collected), total)
    listed = re.search(r"^not claimed, so not collected \((\d+) deselected\):$", done.stdout, re.M)
    assert listed is not None and int(listed.group(1)) == deselected
    assert re.search(r"^  torch_native +.*input_kind 'hidden' \(\d+\)", done.stdout, re.M)
    assert re.search(r"^  torch_native_fused +input_kind 'logits' \(\d+\)$", done.stdout, re.M)


@pytest.mark.slow
def test_the_summary_counts_the_deselected_under_xdist() -> None:
    """The xdist controller collects nothing: the workers' deselections reach its summary."""
    done = _suite(
        "--tp-logprob-backend=torch_native",
        "--tp-logprob-backend=torch_native_fused",
        "-n",
        "1",
        "-k",
        "test_pinned_case",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = done.stdout.strip().splitlines()[-1]
    found = re.search(r"(\d+) passed, (\d+) deselected", summary)
    assert found is not None, done.stdout
    assert found.group(1) == found.group(2), summary  # every pinned case, once per backend
    assert "skipped" not in summary
    assert "  torch_native_fused  input_kind 'logits'" in done.stdout


@pytest.mark.slow
def test_the_closing_table_counts_the_failing_example() -> None:
    """A backend that counts its padding columns fails the capability sweep by about 1e10
    ulp; that sweep measures nothing along the way, and the table must still show it."""
    done = _suite(
        "--tp-logprob-backend=tests.mutants.partial_bugs:padding_not_masked",
        "-n",
        "0",
        tests=(
            "src/tp_logprob/properties/test_capability.py::test_serves_every_claimed_contract_kind",
        ),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    failure = re.search(
        r"^  error +([0-9.e+]+) ulp .*; tolerance ([0-9.e+]+) ulp", done.stdout, re.M
    )
    assert failure is not None, done.stdout
    row = re.search(
        r"^mutant_padding_not_masked +0 passed, 1 failed, 0 skipped +\d+ +"
        r"(\S+) \((.+?)\) +(\S+) \((.+?)\)$",
        done.stdout,
        re.M,
    )
    assert row is not None, done.stdout
    used, ulps = float(row.group(1)), float(row.group(3))
    assert ulps == pytest.approx(float(failure.group(1)), rel=1e-3)
    assert used == pytest.approx(ulps / float(failure.group(2)), rel=1e-2)
    assert row.group(2) == row.group(4) == "capability truthfulness"


@pytest.mark.slow
def test_the_closing_table_counts_a_failure_with_no_tolerance() -> None:
    """A bitwise property has no tolerance to measure against: its failure still counts, by
    its ulp distance and as unbounded against the tolerance (0), never as 0 and -."""
    done = _suite(
        "--tp-logprob-backend=tests.mutants.partial_bugs:padding_not_masked",
        "-n",
        "0",
        "-k",
        "padding_is_ignored",
        tests=("src/tp_logprob/properties/test_metamorphic.py",),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    failure = re.search(r"^  error +([0-9.e+]+) ulp; bitwise equality required", done.stdout, re.M)
    assert failure is not None, done.stdout
    row = re.search(
        r"^mutant_padding_not_masked +0 passed, 1 failed, 0 skipped +\d+ +"
        r"(\S+) \((.+?)\) +(\S+) \((.+?)\)$",
        done.stdout,
        re.M,
    )
    assert row is not None, done.stdout
    assert row.group(1) == "inf" and row.group(2) == "padding independence"
    assert float(row.group(3)) >= float(failure.group(1)) > 0


NARROW_BACKEND = """
import dataclasses

from tp_logprob.kernels.builtin import TORCH_NATIVE
from tp_logprob.kernels.native import torch_native_logprob

CAPABILITY = dataclasses.replace(
    TORCH_NATIVE, backend_id="narrow", exports_entropy=False, supports_temperature=False
)
narrow = (torch_native_logprob, CAPABILITY)
"""


@pytest.mark.slow
def test_no_entropy_and_temperature_one_only_deselect_what_needs_them(tmp_path: Path) -> None:
    """A backend that exports no entropy and serves temperature 1.0 only: the properties that
    draw entropy or another temperature are deselected from its capability, not skipped
    when their draw finds no contract."""
    (tmp_path / "narrow.py").write_text(NARROW_BACKEND)
    done = _suite(
        f"--tp-logprob-backend={tmp_path / 'narrow.py'}:narrow",
        "-n",
        "0",
        tests=("src/tp_logprob/properties/test_rl_family.py",),
    )
    assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: every test deselected
    summary = done.stdout.strip().splitlines()[-1]
    assert "skipped" not in summary, done.stdout
    listed = re.search(r"^  narrow +(.+)$", done.stdout, re.M)
    assert listed is not None, done.stdout
    assert "export_entropy True (2)" in listed.group(1), listed.group(1)
    assert "temperature 2.0 (1)" in listed.group(1), listed.group(1)


def test_a_failure_that_measured_nothing_counts_as_unbounded() -> None:
    """A violation with no measured row (an output of the wrong structure), or a kernel that
    raised inside a property, still counts in the closing table: as unbounded."""
    from tp_logprob.judging.violation import PropertyViolation
    from tp_logprob.pytest_plugin import _count_failure
    from tp_logprob.suite.property import FAILURE_ATTRIBUTE, FailureRecord

    stats = SuiteStats()
    structure = PropertyViolation("output structure: not fp32 [N] tensors", "  problem  lse")
    _count_failure(stats, "b", None, structure, [structure])  # type: ignore[arg-type]
    assert "inf (output structure)" in stats.table()[1]
    raised = RuntimeError("CUDA error: an illegal memory access")
    record = FailureRecord("oracle", None, None, {}, raised)  # type: ignore[arg-type]
    setattr(raised, FAILURE_ATTRIBUTE, record)
    _count_failure(stats, "c", None, raised, [])  # type: ignore[arg-type]
    assert "inf (oracle)" in stats.table()[2]
