"""The conformance runner: reading the suite's records, explaining failures, writing the report."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tools.conformance import collect
from tools.conformance import processed_section as processed
from tools.conformance import records as _records
from tools.conformance import runner as conformance
from tools.conformance.catalog import PEERS, PROCESSED_PEERS, UNAVAILABLE
from tools.conformance.processed_section import PropertyResult

VIOLATION = (
    "padding independence: padding columns changed the output\n"
    "  backend   liger_ce.assume_padding\n"
    "  artifact  python -m tp_logprob replay {artifact}\n"
)
TRACEBACK = (
    "tp_logprob_backend = BackendUnderTest(...)\n"
    "src/tp_logprob/peers/trl.py:120: in trl_logprob\n"
    "E       RuntimeError: index -100 is out of bounds for dimension 1 with size 1\n"
)


def test_headline_is_the_violation_or_the_exception() -> None:
    assert _records.headline(VIOLATION).startswith("padding independence: padding")
    assert _records.headline(TRACEBACK).startswith("RuntimeError: index -100 is out")


def test_records_are_grouped_by_backend(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    rows = [
        ("test_a[liger_ce]", "passed", ""),
        ("test_b[liger_ce]", "skipped", ""),
        ("test_a[liger_ce.assume_padding]", "failed", VIOLATION.format(artifact="x.json")),
    ]
    path.write_text(
        "".join(
            json.dumps(
                {"nodeid": f"src/tp_logprob/properties/t.py::{node}", "outcome": o, "text": t}
            )
            + "\n"
            for node, o, t in rows
        )
    )
    outcomes = _records.outcomes(path)
    assert (outcomes["liger_ce"].passed, outcomes["liger_ce"].skipped) == (1, 1)
    (failure,) = outcomes["liger_ce.assume_padding"].failures
    assert (failure.test, failure.artifact) == ("test_a", "x.json")


def _fake_run(
    failing: dict[str, str], artifact: Path | None, headline: str = "oracle agreement: out"
) -> Any:
    def run(peer: Any, args: Any, scratch: Path) -> tuple[dict[str, Any], float]:
        outcomes = {}
        for cell in peer.cells.values():
            if cell.attr is None:
                continue
            backend = conformance._backend_id(peer, cell.attr)
            outcome = _records.Outcome(passed=5)
            if backend in failing:
                where = None if artifact is None else str(artifact)
                outcome.failures.append(_records.Failure(failing[backend], headline, where))
            outcomes[backend] = outcome
        return outcomes, 1.0

    return run


@pytest.mark.parametrize(
    ("failing", "status"),
    [
        ({"liger_ce.assume_padding": "test_padding_is_ignored"}, 0),
        ({"liger_ce": "test_matches_exact_oracle"}, 1),  # the honest backend: unexplained
    ],
    ids=["explained", "unexplained"],
)
def test_report_explains_each_failure_or_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: dict[str, str], status: int
) -> None:
    artifact = tmp_path / "found" / "abc.json"
    artifact.parent.mkdir()
    artifact.write_text("{}")
    artifact.with_suffix(".npz").write_bytes(b"arrays")
    monkeypatch.setattr(conformance, "_run_peer", _fake_run(failing, artifact))
    monkeypatch.chdir(tmp_path)
    output = tmp_path / "docs" / "conformance.md"
    assert conformance.main(["--output", str(output), "--peer", PEERS[0].name]) == status
    report = output.read_text()
    backend = next(iter(failing))
    assert f"`{backend}`" in report
    kept = tmp_path / "docs" / "conformance"
    assert sorted(path.name for path in kept.iterdir()) == ["abc.json", "abc.npz"]
    assert ("UNEXPLAINED" in report) == (status == 1)
    assert "replay docs/conformance/abc.json --backend tp_logprob.peers.liger:" in report


@pytest.mark.parametrize(
    ("backend", "status"),
    [("cce_linear_cross_entropy.assume_inactive_tokens", 0), ("cce_linear_cross_entropy", 1)],
    ids=["explained", "unexplained"],
)
def test_a_crash_is_explained_only_by_its_cells_crash_explanation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str, status: int
) -> None:
    """A test the library killed the process in is explained by the cell's ``crash``, never
    by the explanation of its ordinary failures."""
    headline = f"{_records.CRASHED} the test process died of signal 6 (SIGABRT) in this test"
    failing = {backend: "test_fused_matches_exact_oracle"}
    monkeypatch.setattr(conformance, "_run_peer", _fake_run(failing, None, headline))
    monkeypatch.setattr(conformance, "_run_real_group", lambda *_: ({}, 0.0))
    monkeypatch.chdir(tmp_path)
    output = tmp_path / "conformance.md"
    assert (
        conformance.main(["--output", str(output), "--peer", "cce_linear_cross_entropy"]) == status
    )
    report = output.read_text()
    assert "died of signal 6 (SIGABRT)" in report
    assert ("repro_cce_out_of_range_target_aborts.py" in report) == (status == 0)


def test_sessions_run_side_by_side_and_rows_keep_the_catalogues_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``--jobs 2`` two peers' sessions overlap; the later one ending first changes
    nothing in the report."""
    first, second = PEERS[0], PEERS[1]
    running: list[str] = []
    overlapped = threading.Event()
    fake = _fake_run({}, None)

    def run(peer: Any, args: Any, scratch: Path) -> tuple[dict[str, Any], float]:
        running.append(peer.name)
        if len(running) == 2:
            overlapped.set()
        assert overlapped.wait(10), "the sessions ran one after the other"
        if peer.name == first.name:
            time.sleep(0.2)  # the first peer in the catalogue ends last
        return fake(peer, args, scratch)  # type: ignore[no-any-return]

    monkeypatch.setattr(conformance, "_run_peer", run)
    monkeypatch.setattr(conformance, "_run_real_group", lambda *_: ({}, 0.0))
    monkeypatch.chdir(tmp_path)
    output = tmp_path / "conformance.md"
    arguments = ["--output", str(output), "--jobs", "2", "--peer", first.name]
    assert conformance.main([*arguments, "--peer", second.name]) == 0
    report = output.read_text()
    assert report.index(f"| `{first.name}` |") < report.index(f"| `{second.name}` |")
    assert "2 sessions at a time (`--jobs`)" in report


def test_column_selection_runs_only_those_backends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands: list[list[str]] = []

    class Finished:
        returncode, stdout = 0, ""

    def run(command: list[str], **_: Any) -> Finished:
        commands.append(command)
        return Finished()

    monkeypatch.setattr(conformance.subprocess, "run", run)
    monkeypatch.chdir(tmp_path)
    output = tmp_path / "conformance.md"
    status = conformance.main(
        ["--output", str(output), "--peer", "megatron_vp_ce", "--column", "honest"]
    )
    (command,) = commands
    backends = [arg for arg in command if arg.startswith("--tp-logprob-backend=")]
    assert backends == ["--tp-logprob-backend=tp_logprob.peers.megatron:honest"]
    assert status == 1  # no record of the honest run: reported, not silently passed
    assert "not run (--column)" in output.read_text()


@pytest.mark.parametrize(
    ("outcome", "status"),
    [("differs", 0), ("agrees", 0), ("error (exit 1): ModuleNotFoundError: vllm", 1)],
    ids=["differs", "stale", "broken"],
)
def test_processed_section_reports_each_finding_and_its_reproducer(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    outcome: str,
    status: int,
) -> None:
    peer = PROCESSED_PEERS[0]  # the vLLM sampler

    def reproduce(peer: Any, finding: Any, root: Path) -> processed.Reproduction:
        return processed.Reproduction(finding, outcome)

    monkeypatch.setattr(conformance, "_reproduce", reproduce)
    monkeypatch.setattr(conformance, "_run_processed", _fake_processed({}))
    monkeypatch.chdir(tmp_path)
    output = tmp_path / "docs" / "conformance.md"
    output.parent.mkdir()
    assert conformance.main(["--output", str(output), "--peer", peer.name]) == status
    report = output.read_text()
    section = report[report.index("## Processed logprobs") :]
    assert f"### `{peer.name}`" in section and "Support modes: sampling_params;" in section
    for finding in peer.findings:
        assert f"**{finding.rule}**" in section
        assert f"[`{finding.explanation.reproducer}`]" in section
    assert section.count(f": {outcome}; fails ") == len(peer.findings)
    for library in UNAVAILABLE:
        assert f"(`{library.distribution}`): {library.reason}." in section
    stale = "no longer differs" in capsys.readouterr().out
    assert stale == (outcome == "agrees")


def test_a_reproducer_is_run_and_read_by_its_exit_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    peer = PROCESSED_PEERS[0]  # the vLLM sampler
    finding = peer.findings[0]
    monkeypatch.setattr(processed, "not_runnable", lambda peer: None)  # as if installed
    script = tmp_path / str(finding.explanation.reproducer)
    script.parent.mkdir(parents=True)
    outcomes = []
    for body in ("raise SystemExit(1)", "print('same')", "import no_such_module"):
        script.write_text(body)
        run = conformance._reproduce(peer, finding, tmp_path)
        outcomes.append((run.outcome.split(" ")[0], run.failed))
    assert outcomes == [("differs", False), ("agrees", False), ("error", True)]


def test_the_real_group_column_runs_the_honest_backend_under_torchrun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands: list[list[str]] = []

    class Finished:
        returncode, stdout = 1, ""

    def run(command: list[str], env: dict[str, str], **_: Any) -> Finished:
        commands.append(command)
        record = {"nodeid": "t.py::test_a[megatron_vp_ce]", "outcome": "passed", "text": ""}
        Path(env[collect.RECORD_ENV]).write_text(json.dumps(record) + "\n")
        return Finished()

    monkeypatch.setattr(conformance.subprocess, "run", run)
    monkeypatch.chdir(tmp_path)
    output = tmp_path / "conformance.md"
    arguments = ["--output", str(output), "--peer", "megatron_vp_ce", "--column", "real_group"]
    assert conformance.main([*arguments, "--real-group-ranks", "2"]) == 0
    (command,) = commands
    assert command[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert "--tp-logprob-backend=tp_logprob.peers.megatron:honest" in command
    report = output.read_text()
    assert "| `megatron_vp_ce` | not run (--column) |" in report
    assert report.count("**pass** (1 passed)") == 1
    assert "real gloo process group of 2 ranks under `torchrun`" in report


def test_the_collector_records_outcomes_and_the_reasons_of_skips(tmp_path: Path) -> None:
    (tmp_path / "test_some.py").write_text(
        "import pytest\n\n"
        "@pytest.fixture\n"
        "def unserved():\n"
        "    pytest.skip('no such layout')\n\n"
        "def test_passes():\n"
        "    pass\n\n"
        "def test_skips():\n"
        "    pytest.skip('serves no replayed mask')\n\n"
        "def test_skips_in_setup(unserved):\n"
        "    pass\n\n"
        "def test_fails():\n"
        "    assert 1 == 2\n"
    )
    record = tmp_path / "records.jsonl"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += ["-p", "tools.conformance.collect", "test_some.py"]
    # this test's own worker would write nothing
    env = {
        k: v for k, v in collect.recording_env(record).items() if not k.startswith("PYTEST_XDIST")
    }
    subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, check=False)
    records = [json.loads(line) for line in record.read_text().splitlines()]
    found = {r["nodeid"].split("::")[1]: (r["outcome"], r["text"]) for r in records}
    assert found["test_passes"] == ("passed", "")
    assert found["test_skips"] == ("skipped", "serves no replayed mask")
    assert found["test_skips_in_setup"] == ("skipped", "no such layout")
    assert found["test_fails"][0] == "failed" and "assert 1 == 2" in found["test_fails"][1]
    assert len(records) == 4


def test_a_test_that_kills_pytest_is_recorded_and_the_session_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library that aborts the process (a signal, not an exception) fails the test it died
    in, with the signal named, and the tests after it still run; the finished ones once."""
    (tmp_path / "crashing_suite.py").write_text(
        "import os\n"
        "import pytest\n\n"
        "@pytest.mark.parametrize('backend', ['peer'])\n"
        "def test_before(backend):\n"
        "    pass\n\n"
        "@pytest.mark.parametrize('backend', ['peer'])\n"
        "def test_aborts(backend):\n"
        "    os.abort()\n\n"
        "@pytest.mark.parametrize('backend', ['peer'])\n"
        "def test_after(backend):\n"
        "    assert 1 == 2\n"
    )
    for name in [name for name in __import__("os").environ if name.startswith("PYTEST_XDIST")]:
        monkeypatch.delenv(name)  # this test's own worker would write nothing
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    args = conformance.argparse.Namespace(profile="ci", workers="0")
    record, _ = conformance._pytest("crashing", "crashing_suite", [], args, tmp_path)
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(row["nodeid"].split("::")[1], row["outcome"]) for row in rows] == [
        ("test_before[peer]", "passed"),
        ("test_aborts[peer]", "failed"),
        ("test_after[peer]", "failed"),
    ]
    outcome = _records.outcomes(record)["peer"]
    assert outcome.passed == 1
    assert [failure.test for failure in outcome.failures] == ["test_aborts", "test_after"]
    assert outcome.failures[0].headline.startswith(
        "Crashed: the test process died of signal 6 (SIGABRT)"
    )
    assert not collect.running_file(record).exists()


def test_the_collector_records_what_a_backend_does_not_claim(tmp_path: Path) -> None:
    """A property deselected because the backend lacks what it needs is ``not claimed``, with
    the capability field: neither ``not run`` nor unexplained in the processed section."""
    (tmp_path / "tp1.py").write_text(
        "import dataclasses\n"
        "from tp_logprob.kernels.builtin import TORCH_NATIVE\n"
        "from tp_logprob.kernels.native import torch_native_logprob\n"
        "capability = dataclasses.replace(\n"
        "    TORCH_NATIVE, backend_id='tp1_native', tp_world_sizes=frozenset({1})\n"
        ")\n"
        "tp1_native = (torch_native_logprob, capability)\n"
    )
    record = tmp_path / "records.jsonl"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0"]
    command += ["-p", "tools.conformance.collect", "--pyargs", processed.PROCESSED_MODULE]
    command += [f"--tp-logprob-backend={tmp_path / 'tp1.py'}:tp1_native"]
    command += ["--tp-logprob-profile=ci", "-k", "every_sampling_rule or rules_off"]
    env = {
        k: v for k, v in collect.recording_env(record).items() if not k.startswith("PYTEST_XDIST")
    }
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]
    records = _records.read_records(record)
    outcomes = {(r.test, r.outcome, r.text) for r in records}
    every_rule, layouts = "test_every_sampling_rule_across_ranks", "test_processed_tp_consistency"
    assert outcomes == {
        (RULES_OFF, "passed", ""),
        (every_rule, "not claimed", "tp_world_sizes [1] (no TP degree above 1)"),
        (layouts, "not claimed", "tp_world_sizes [1] (one shard layout per vocabulary)"),
    }
    assert sum(r.test == every_rule for r in records) == 7  # one per rule set
    assert _records.outcomes(record)["tp1_native"].passed == 1
    assert not _records.outcomes(record)["tp1_native"].failures
    results = processed.results_from(records, "tp1_native", processed.processed_tests())
    by_test = {result.test: result for result in results}
    assert by_test[every_rule].outcome == by_test[layouts].outcome == "not claimed"
    (peer, *_) = PROCESSED_PEERS
    assert not {every_rule, layouts} & set(processed.unexplained(peer, results))


ORACLE = "test_processed_matches_exact_oracle_on_its_support"
RULES_OFF = "test_rules_off_is_the_raw_logprob"
GRADIENTS = "test_processed_gradients"
RUN_TO_RUN = "test_processed_run_to_run_and_batch_invariance"
ORACLE_VIOLATION = (
    "processed oracle: support: support_size is not the size of the support\n"
    "  backend   vllm_sampler\n"
    "  contract  infer fp32 N=1 (active 1) tp=0/1 run_to_run support: top_p=0.5\n"
    "  shapes    logits [1, 3] fp32, targets [1]\n"
    "  observed  support_size 1\n"
    "  expected  2 (|S| of the support the backend used)\n"
    "  replay    pytest 'test_processed.py::x' --hypothesis-seed=1\n"
    "  artifact  python -m tp_logprob replay /tmp/run/abc.json\n"
)


def test_processed_records_are_read_per_property_in_the_modules_order(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    rows = [
        (f"{RUN_TO_RUN}[torch_native]", "failed", "another backend's"),
        (f"{RULES_OFF}[vllm_sampler]", "skipped", "serves no raw logprob"),
        (f"{ORACLE}[vllm_sampler]", "failed", ORACLE_VIOLATION),
        ("test_processed_gradients[vllm_sampler]", "passed", ""),
    ]
    path.write_text(
        "".join(
            json.dumps({"nodeid": f"test_processed.py::{node}", "outcome": o, "text": t}) + "\n"
            for node, o, t in rows
        )
    )
    tests = processed.processed_tests()
    results = processed.results_from(_records.read_records(path), "vllm_sampler", tests)
    assert [result.test for result in results] == tests and tests[0] == ORACLE
    found = {result.test: result for result in results}
    assert found[ORACLE] == PropertyResult(
        ORACLE,
        "failed",
        "processed oracle: support: support_size is not the size of the support",
        (
            "contract: infer fp32 N=1 (active 1) tp=0/1 run_to_run support: top_p=0.5",
            "observed: support_size 1",
            "expected: 2 (|S| of the support the backend used)",
        ),
        "/tmp/run/abc.json",
    )
    assert found[RULES_OFF] == PropertyResult(RULES_OFF, "skipped", "serves no raw logprob")
    assert found["test_processed_gradients"].outcome == "passed"
    assert found[RUN_TO_RUN].outcome == "not run"  # its only record is another backend's


def _processed_results(failing: dict[str, str]) -> list[PropertyResult]:
    """Every processed test passes, but those of ``failing`` (test -> headline)."""
    return [
        PropertyResult(test, "failed", failing[test], ("observed: 1",), "docs/conformance/a.json")
        if test in failing
        else PropertyResult(test, "passed")
        for test in processed.processed_tests()
    ]


def _fake_processed(failing: dict[str, str]) -> Any:
    def run(peer: Any, args: Any, scratch: Path) -> tuple[list[PropertyResult], float]:
        return _processed_results(failing), 2.0

    return run


def test_a_peer_subsection_shows_each_property_and_links_each_failure() -> None:
    peer = PROCESSED_PEERS[0]  # the vLLM sampler
    results = _processed_results({ORACLE: "processed oracle: out", GRADIENTS: "ValueError: T"})
    results[2] = PropertyResult(results[2].test, "skipped", "one | layout")
    runs = [processed.Reproduction(finding, "differs") for finding in peer.findings]
    text = processed.peer_subsection(peer, results, runs, "pytest x", 3.0)
    assert text == processed.peer_subsection(peer, results, runs, "pytest x", 3.0)
    assert text.startswith(f"### `{peer.name}`\n")
    assert "`pytest x`: 4 passed, 2 failed, 1 skipped in 3 s." in text
    explaining = peer.findings_for(ORACLE)
    assert explaining
    for finding in explaining:
        anchor = f"vllm_sampler-finding-{peer.findings.index(finding) + 1}"
        assert f"[{finding.rule}](#{anchor})" in text
        assert f'<a id="{anchor}"></a>**{finding.rule}**' in text
    assert f"| `{ORACLE}` | **fail** | " in text
    assert f"| `{GRADIENTS}` | **fail** | **UNEXPLAINED**: no finding lists this test" in text
    assert f"| `{results[2].test}` | skipped: one \\| layout |  |" in text
    assert f"- `{GRADIENTS}`: ValueError: T\n  - observed: 1\n" in text
    replay = "python -m tp_logprob replay docs/conformance/a.json --backend " + peer.spec()
    assert text.count(f"  - replay: `{replay}`") == 2
    assert processed.unexplained(peer, results) == [GRADIENTS]


OLD_REPORT = """# Conformance of the kernels RL teams run

The matrix, untouched: `python -m tp_logprob replay docs/conformance/kept.json`.

## Processed logprobs

Old words.

### `vllm_sampler`

The old subsection.

### Libraries whose sampler code cannot be installed or imported here

- old
"""


@pytest.mark.parametrize(
    ("failing", "status"),
    [({ORACLE: "processed oracle: out"}, 0), ({GRADIENTS: "VLLMValidationError: T"}, 1)],
    ids=["explained", "unexplained"],
)
def test_one_processed_peer_replaces_its_subsection_and_keeps_the_matrix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: dict[str, str], status: int
) -> None:
    peer = PROCESSED_PEERS[0]  # the vLLM sampler

    def no_matrix(*_: Any) -> None:
        raise AssertionError("a matrix peer ran")

    def reproduce(peer: Any, finding: Any, root: Path) -> processed.Reproduction:
        return processed.Reproduction(finding, "differs")

    monkeypatch.setattr(conformance, "_run_peer", no_matrix)
    monkeypatch.setattr(conformance, "_reproduce", reproduce)
    monkeypatch.setattr(conformance, "_run_processed", _fake_processed(failing))
    monkeypatch.chdir(tmp_path)
    output = tmp_path / "docs" / "conformance.md"
    examples = output.parent / "conformance"
    examples.mkdir(parents=True)
    for name in ("kept.json", "kept.npz", "a.json", "gone.json"):
        (examples / name).write_text("{}")
    output.write_text(OLD_REPORT)
    assert conformance.main(["--output", str(output), "--peer", peer.name]) == status
    report = output.read_text()
    assert report.startswith(OLD_REPORT[: OLD_REPORT.index("## Processed")])
    assert "The old subsection." not in report and "Old words." not in report
    assert report.count(f"### `{peer.name}`") == 1
    assert ("UNEXPLAINED" in report) == (status == 1)
    assert sorted(path.name for path in examples.iterdir()) == ["a.json", "kept.json", "kept.npz"]


def test_merge_keeps_the_subsections_of_peers_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    peer = PROCESSED_PEERS[0]  # the vLLM sampler
    other = dataclasses.replace(peer, name="other_sampler")
    monkeypatch.setattr(processed, "PROCESSED_PEERS", (other, peer))
    existing = OLD_REPORT.replace(
        "### `vllm_sampler`", "### `vllm_sampler`\n\nv\n\n### `other_sampler`"
    )
    existing = existing[existing.index("## Processed") :]
    fresh = {peer.name: f"### `{peer.name}`\n\nnew"}
    kept_other = "### `other_sampler`\n\nThe old subsection."
    assert processed.merge(existing, fresh) == [kept_other, fresh[peer.name]]
    assert processed.merge("", fresh) == [fresh[peer.name]]
    assert processed.merge(existing, {}) == [kept_other, "### `vllm_sampler`\n\nv"]


@pytest.mark.parametrize(
    ("peer", "version", "reason"),
    [
        (
            "vllm_sampler_034",
            "0.33.0",
            r"vllm 0\.33\.0 is installed; the adapter serves vllm>=0\.34",
        ),
        ("vllm_sampler", "0.34.0", r"vllm 0\.34\.0 is installed; the adapter serves vllm>=0\.11"),
        ("vllm_sampler", "not installed", "vllm is not installed"),
    ],
)
def test_a_processed_peer_whose_release_is_not_served_is_not_run(
    monkeypatch: pytest.MonkeyPatch, peer: str, version: str, reason: str
) -> None:
    """Two adapters of one library serve different releases: one environment runs one."""
    (chosen,) = [candidate for candidate in PROCESSED_PEERS if candidate.name == peer]
    monkeypatch.setattr(processed, "installed", lambda distribution: version)
    assert re.fullmatch(f"{reason}.*", processed.not_runnable(chosen) or "")
    results, _ = conformance._run_processed(chosen, None, Path())  # type: ignore[arg-type]
    assert {result.outcome for result in results} == {"not run"}
    assert conformance._reproduce(chosen, chosen.findings[0], Path()).outcome.startswith("not run")


def test_a_processed_peer_on_a_served_release_is_runnable(monkeypatch: pytest.MonkeyPatch) -> None:
    (chosen,) = [candidate for candidate in PROCESSED_PEERS if candidate.name == "vllm_sampler_034"]
    monkeypatch.setattr(processed, "installed", lambda distribution: "0.34.0")
    assert processed.not_runnable(chosen) is None


def test_a_run_keeps_the_subsection_of_a_peer_whose_release_is_not_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With vllm 0.33 installed, ``--peer vllm_sampler_034`` runs nothing and keeps what a
    0.34 environment wrote."""
    monkeypatch.setattr(processed, "installed", lambda distribution: "0.33.0")
    monkeypatch.setattr(conformance, "_run_processed", _fake_processed({}))
    output = tmp_path / "conformance.md"
    kept = "### `vllm_sampler_034`\n\nwritten on vllm 0.34.0"
    output.write_text(f"# matrix\n\n{processed.HEADING}\n\n{kept}\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert conformance.main(["--output", str(output), "--peer", "vllm_sampler_034"]) == 0
    assert kept in output.read_text(encoding="utf-8")
    assert "vllm_sampler_034: not run (vllm 0.33.0 is installed" in capsys.readouterr().out
