"""Run the property suite against every peer adapter and its variants; write the report.

``python -m tools.conformance`` (what ``nox -s conformance`` runs)
starts one pytest session per peer with all of that peer's variants, and one
``torchrun`` session per peer whose honest backend runs on a real process group
(the real-group column: gloo, :data:`~tools.conformance.catalog.REAL_GROUP_RANKS`
ranks, the library's own communication), records every property's outcome
through :mod:`tools.conformance.collect`, and writes ``docs/conformance.md``: a
matrix of peer x contract feature, then each failing cell's first failing
property, its cause, and a command that replays it. The first failing example of
each failing cell is copied next to the report (``docs/conformance/<backend>.json``)
so the replay works from a clean checkout.

A last section covers processed logprobs (a sampling support): each processed
peer runs the processed properties (one pytest session per peer), and its
subsection shows each property's outcome, the findings that explain each failing
one, the first failing examples (copied next to the report as well), and each
finding with the outcome of its reproducer, run here (``docs/repro_*.py`` exits 1
while the library differs from the exact rules); then the libraries that cannot
run on CPU and why (:mod:`tools.conformance.processed_section`).

The sessions run side by side, one per CPU core (``--jobs``): each is one pytest
process (``-n 0``), so on two cores two of them halve the run's wall time; the
report lists them in the catalogue's order whatever order they end in.

``--peer`` runs some of the peers. Where the report already exists, the
processed peers not run keep their subsections, and the matrix part stays as it
stands when no matrix peer is chosen (with one, the matrix is rewritten with the
chosen matrix peers only); the examples next to the report are those it still
refers to. So ``--peer vllm_sampler`` regenerates that peer's subsection alone.

A peer whose library kills the pytest process (a signal such as SIGABRT from its
compiled code, not an exception) does not end the run: the test it died in is
recorded as failed with the signal named, and the session resumes without the tests
already recorded, so the rest of that peer's cells still run.

Exit status 1 when a failure has no explanation in :mod:`tools.conformance.catalog`
(a new bug, in a peer, an adapter or the suite) or a reproducer crashes, 2 when a
pytest session could not run at all.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from tools.conformance import processed_section as processed
from tools.conformance.catalog import (
    COLUMNS,
    PEERS,
    PROCESSED_PEERS,
    REAL_GROUP,
    REAL_GROUP_RANKS,
    Cell,
    Explanation,
    Finding,
    Peer,
    ProcessedPeer,
)
from tools.conformance.collect import recording_env, running_file
from tools.conformance.processed_section import PropertyResult, Reproduction
from tools.conformance.records import (
    CRASHED,
    Outcome,
    outcomes,
    read_records,
    recorded_nodeids,
)
from tools.conformance.releases import BESIDE_THE_MATRIX, served_and_tested

__all__ = ["main"]


def _backend_id(peer: Peer | ProcessedPeer, attr: str) -> str:
    module = importlib.import_module(f"tp_logprob.peers.{peer.module}")
    return str(getattr(module, attr)[1].backend_id)


def _run_peer(
    peer: Peer, args: argparse.Namespace, scratch: Path
) -> tuple[dict[str, Outcome], float]:
    specs = [
        peer.spec(cell.attr)
        for key, cell in peer.cells.items()
        if cell.attr and key != REAL_GROUP and (not args.column or key in args.column)
    ]
    if not specs:
        return {}, 0.0
    record, elapsed = _pytest(peer.name, "tp_logprob.properties", specs, args, scratch)
    return outcomes(record), elapsed


def _pytest(
    name: str, suite: str, specs: Sequence[str], args: argparse.Namespace, scratch: Path
) -> tuple[Path, float]:
    """Run ``suite`` on the backends ``specs``: the record file and the seconds it took."""
    record = scratch / f"{name}.jsonl"
    command = [
        sys.executable, "-m", "pytest", "--pyargs", suite,
        "-p", "no:cacheprovider", "-p", "tools.conformance.collect", "-q", "--no-header",
        f"--tp-logprob-profile={args.profile}",
        f"--tp-logprob-artifacts={scratch / name}",
        "-n", str(args.workers),
        *(f"--tp-logprob-backend={spec}" for spec in specs),
    ]  # fmt: skip
    env = recording_env(record)
    if "TRITON_INTERPRET" not in env and not _has_gpu():
        env["TRITON_INTERPRET"] = "1"  # Liger's Triton kernel on CPU tensors
    print(f"conformance: {name}: {shlex.join(command[2:])}", flush=True)
    started, logs = time.monotonic(), []
    while True:
        done = recorded_nodeids(record)
        finished = subprocess.run(
            [*command, *(f"--deselect={nodeid}" for nodeid in done)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        logs.append(finished.stdout)
        if finished.returncode in (0, 1) or not _record_crash(record, finished.returncode):
            break
    elapsed = time.monotonic() - started
    (scratch / f"{name}.log").write_text("\n".join(logs), encoding="utf-8")
    if finished.returncode not in (0, 1):
        tail = "\n".join(finished.stdout.splitlines()[-30:])
        raise SystemExit(f"conformance: pytest for {name} exited {finished.returncode}:\n{tail}")
    print(f"conformance: {name}: {elapsed:.0f} s", flush=True)
    return record, elapsed


def _record_crash(record: Path, returncode: int) -> bool:
    """Record the test a signal killed pytest in as failed, so that the session resumes
    without it (and without the tests it finished); False when no signal killed it or
    no test was running (then nothing can resume)."""
    running = running_file(record)
    if returncode >= 0 or not running.exists():
        return False
    nodeid = running.read_text(encoding="utf-8")
    running.unlink()
    died = signal.Signals(-returncode).name
    text = (
        f"{CRASHED} the test process died of signal {-returncode} ({died}) in this test; "
        "the session resumed without it"
    )
    line = {"nodeid": nodeid, "outcome": "failed", "text": text, "duration": 0.0}
    with record.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")
    print(f"conformance: {nodeid}: {died}; resuming without it", flush=True)
    return True


def _processed_command(peer: ProcessedPeer, args: argparse.Namespace) -> str:
    """The command a reader runs to see the peer's processed results."""
    return (
        f"pytest --pyargs {processed.PROCESSED_MODULE} --tp-logprob-backend={peer.spec()} "
        f"--tp-logprob-profile={args.profile}"
    )


def _run_processed(
    peer: ProcessedPeer, args: argparse.Namespace, scratch: Path
) -> tuple[list[PropertyResult], float]:
    """The processed properties on the peer; each first failing example kept for the report."""
    tests = processed.processed_tests()
    reason = processed.not_runnable(peer)
    if reason is not None:
        return [PropertyResult(test, "not run", reason) for test in tests], 0.0
    record, elapsed = _pytest(peer.name, processed.PROCESSED_MODULE, [peer.spec()], args, scratch)
    backend = _backend_id(peer, peer.attr)
    results = processed.results_from(read_records(record), backend, tests)
    kept = []
    for result in results:
        if result.artifact is not None:
            case = _case_line(result.artifact)
            lines = [line for line in result.lines if not case or not line.startswith("contract")]
            lines = [f"case: {case}"] * bool(case) + lines
            artifact = str(_keep_artifact(result.artifact, args))
            result = replace(result, lines=tuple(lines), artifact=artifact)
        kept.append(result)
    return kept, elapsed


def _case_line(artifact: str) -> str | None:
    """The failing example in one line (contract, then what its logits hold), if it loads."""
    from tp_logprob.replay.artifacts import ArtifactError, load_artifact
    from tp_logprob.replay.catalogue import suite_properties

    try:
        return load_artifact(artifact, suite_properties()).case.describe()
    except ArtifactError:
        return None


def _keep_artifact(artifact: str, args: argparse.Namespace) -> Path:
    """Copy an artifact (its JSON and, beside it, its arrays) next to the report."""
    source, root = Path(artifact), Path(args.root)
    kept = Path(args.artifacts_out) / source.name
    for companion in source.parent.glob(f"{source.stem}.*"):
        shutil.copyfile(companion, args.artifacts_out / companion.name)
    return kept.relative_to(root) if kept.is_relative_to(root) else kept


def _run_real_group(
    peer: Peer, args: argparse.Namespace, scratch: Path
) -> tuple[dict[str, Outcome], float]:
    """The peer's real-group cell under torchrun (gloo); nothing when it has none."""
    cell = peer.cells.get(REAL_GROUP)
    if cell is None or cell.attr is None or (args.column and REAL_GROUP not in args.column):
        return {}, 0.0
    name = f"{peer.name}-real-group"
    record = scratch / f"{name}.jsonl"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={args.real_group_ranks}",
        "-m", "pytest", "--pyargs", "tp_logprob.properties",
        "-p", "no:cacheprovider", "-p", "tools.conformance.collect", "-q", "--no-header",
        f"--tp-logprob-profile={args.profile}",
        f"--tp-logprob-artifacts={scratch / name}",
        f"--tp-logprob-rank-logs={scratch / name / 'ranks'}",
        f"--tp-logprob-backend={peer.spec(cell.attr)}",
    ]  # fmt: skip
    env = recording_env(record, OMP_NUM_THREADS="1")
    if "TRITON_INTERPRET" not in env and not _has_gpu():
        env["TRITON_INTERPRET"] = "1"  # Liger's Triton kernels on CPU tensors
    print(f"conformance: {name}: {shlex.join(command[2:])}", flush=True)
    started = time.monotonic()
    finished = subprocess.run(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    elapsed = time.monotonic() - started
    (scratch / f"{name}.log").write_text(finished.stdout, encoding="utf-8")
    found = outcomes(record)
    if finished.returncode != 0 and not found:  # torchrun's status says no more than that
        tail = "\n".join(finished.stdout.splitlines()[-30:])
        raise SystemExit(f"conformance: {name} exited {finished.returncode}:\n{tail}")
    print(f"conformance: {name}: {elapsed:.0f} s", flush=True)
    return found, elapsed


def _has_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@dataclass
class Row:
    """One rendered matrix row and its detail entries."""

    cells: list[str]
    details: list[str]
    unexplained: int = 0
    stale: list[str] = field(default_factory=list)


def _render_row(
    peer: Peer,
    outcomes: dict[str, Outcome],
    args: argparse.Namespace,
    real: dict[str, Outcome] | None = None,
) -> Row:
    """The peer's row; ``real`` holds the outcomes of its real-group session."""
    row = Row([f"`{peer.name}`"], [])
    for key, _ in COLUMNS:
        cell = peer.cells.get(key, Cell(note="-"))
        if args.column and key not in args.column:
            row.cells.append("not run (--column)")
            continue
        if cell.attr is None:
            row.cells.append(cell.note)
            continue
        backend = _backend_id(peer, cell.attr)
        outcome = ((real or {}) if key == REAL_GROUP else outcomes).get(backend)
        if outcome is None:
            row.cells.append("not run")
            row.unexplained += 1
            continue
        if not outcome.failures:
            row.cells.append(f"**pass** ({outcome.passed} passed)")
            if cell.expects_failure:
                row.stale.append(backend)
            continue
        causes = [
            cell.explain(failure.test, crashed=failure.headline.startswith(CRASHED))
            for failure in outcome.failures
        ]
        row.unexplained += sum(cause is None for cause in causes)
        kinds = sorted({cause.kind if cause else "UNEXPLAINED" for cause in causes})
        number = len(args.footnotes) + 1
        args.footnotes.append(backend)
        row.cells.append(f"**fail** [{number}](#f{number}): {', '.join(kinds)}")
        where = f"{backend}, real group" if key == REAL_GROUP else backend
        row.details.append(_detail(number, peer, cell.attr, where, outcome, causes, args))
    return row


def _describe(cause: Explanation | None) -> str:
    if cause is None:
        return "**UNEXPLAINED**: add an explanation to tools/conformance/catalog.py"
    text = f"{cause.kind}: {cause.cause}"
    if cause.reproducer:
        link = cause.reproducer.removeprefix("docs/")
        text += f" (minimal reproducer: [`{cause.reproducer}`]({link}))"
    return text


def _detail(
    number: int,
    peer: Peer,
    attr: str,
    backend: str,
    outcome: Outcome,
    causes: list[Explanation | None],
    args: argparse.Namespace,
) -> str:
    first = outcome.failures[0]
    counts = f"{outcome.passed} passed, {len(outcome.failures)} failed, {outcome.skipped} skipped"
    lines = [f'<a id="f{number}"></a>**{number}. `{backend}`** ({counts})', ""]
    lines.append(f"- first failing property: `{first.test}`: {first.headline}")
    lines.append(f"- cause: {_describe(causes[0])}")
    same = [f.test for f, c in zip(outcome.failures[1:], causes[1:], strict=True) if c == causes[0]]
    if same:
        lines.append(f"- also failing, same cause: {', '.join(f'`{name}`' for name in same)}")
    for failure, cause in zip(outcome.failures[1:], causes[1:], strict=True):
        if cause != causes[0]:
            lines.append(
                f"- also failing: `{failure.test}`: {failure.headline}; {_describe(cause)}"
            )
    if first.artifact is not None:
        relative = _keep_artifact(first.artifact, args)
        # The Triton kernels' adapters run on CPU only under the interpreter.
        env = "TRITON_INTERPRET=1 " if peer.module.startswith(_INTERPRETED) else ""
        spec = peer.spec(attr)
        lines.append(f"- replay: `{env}python -m tp_logprob replay {relative} --backend {spec}`")
    return "\n".join(lines)


_INTERPRETED = ("liger", "trl_kernel")
"""Module prefixes of the adapters whose replay on CPU needs ``TRITON_INTERPRET=1``."""


def _markdown(
    rows: list[tuple[Peer, Row]],
    timings: dict[str, float],
    args: argparse.Namespace,
) -> str:
    """The matrix part of the report: the matrix, its failures, the peers and timings."""
    header = "| adapter | " + " | ".join(title for _, title in COLUMNS) + " |"
    rule = "| --- " * (len(COLUMNS) + 1) + "|"
    table = [header, rule] + ["| " + " | ".join(row.cells) + " |" for _, row in rows]
    versions = [
        f"| `{peer.name}` | {peer.library} | {peer.distribution} "
        f"{processed.installed(peer.distribution)} | {served_and_tested(peer.module)} "
        f"| `tp_logprob.peers.{peer.module}` |"
        for peer, _ in rows
    ]
    total = sum(timings.values())
    details = [detail for _, row in rows for detail in row.details]
    return "\n".join(
        [
            "# Conformance of the kernels RL teams run",
            "",
            "Generated by `nox -s conformance` (`python -m tools.conformance`); do not "
            "edit by hand. Each adapter in `tp_logprob.peers` wraps a library's real code; each "
            "column runs the property suite against the adapter's honest capability, or against "
            "the same op claiming one more contract feature, as a user might assume it has, on "
            "the suite's emulated group (every rank a thread of one process). The last column "
            f"runs the honest capability on a real gloo process group of {args.real_group_ranks} "
            "ranks under `torchrun`, in lockstep, where each library does its own "
            "communication (Megatron's all-reduces, DTensor's collectives). A "
            "cell is `pass`, `fail` (with the reason below), or why nothing runs there "
            "(`claimed`: the honest capability already includes it; `n/a`: it cannot apply).",
            "",
            *table,
            "",
            "Kinds of failure: *peer limitation* (the library does not do this, by design), "
            "*peer bug* (it claims to and does not; a minimal reproducer is linked), "
            "*adapter choice* (this project's glue).",
            "",
            "## Failures",
            "",
            "\n\n".join(details) if details else "None.",
            "",
            "## Peers",
            "",
            "| adapter | library | installed | releases served; tests run on | module |",
            "| --- | --- | --- | --- | --- |",
            *versions,
            "",
            "Each adapter serves the releases of its library its module declares (`SERVED`), "
            "spelling each release's call, and refuses any other before the call "
            "(`UnservedReleaseError`, naming the installed version and the range). "
            "`nox -s peer_releases` runs the adapter's own tests on the releases listed after "
            "the semicolon (`tools/conformance/releases.py`), one at a time. Beside the "
            "matrix (the history benchmark's adapters): "
            + "; ".join(
                f"`tp_logprob.peers.{module}` {served_and_tested(module)}"
                for module in BESIDE_THE_MATRIX
            )
            + ".",
            "",
            f"Profile `{args.profile}` (fixed seed), `-n {args.workers}`; suite time "
            + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in timings.items())
            + f"; {total:.0f} s in all on this run's machine, {args.jobs} sessions at a time "
            + f"(`--jobs`): {args.wall_seconds:.0f} s from the first session's start to the "
            + "last one's end, the processed peers' sessions included.",
            "",
        ]
    ).replace("\n\n\n", "\n\n")


def _reproduce(peer: ProcessedPeer, finding: Finding, root: Path) -> Reproduction:
    script = finding.explanation.reproducer
    if script is None:
        return Reproduction(finding, "error: no reproducer")
    reason = processed.not_runnable(peer)
    if reason is not None:
        return Reproduction(finding, f"not run: {reason}")
    finished = subprocess.run(
        [sys.executable, script], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    if finished.returncode in (0, 1) and "Traceback" not in finished.stdout:
        return Reproduction(finding, "agrees" if finished.returncode == 0 else "differs")
    last = finished.stdout.strip().splitlines()[-1:] or [""]
    return Reproduction(finding, f"error (exit {finished.returncode}): {last[0][:160]}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the conformance matrix and write the report; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m tools.conformance")
    parser.add_argument("--output", default="docs/conformance.md", type=Path)
    parser.add_argument("--peer", action="append", default=[], help="only these peers")
    parser.add_argument("--profile", default="ci", choices=("dev", "ci", "thorough"))
    parser.add_argument("--workers", default="0", help="pytest-xdist workers per session")
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="pytest sessions run at once (default: one per CPU core)",
    )
    parser.add_argument(
        "--real-group-ranks",
        type=int,
        default=REAL_GROUP_RANKS,
        help=f"ranks of the real-group column's gloo group (default {REAL_GROUP_RANKS})",
    )
    keys = [key for key, _ in COLUMNS]
    parser.add_argument(
        "--column", action="append", default=[], choices=keys, help="only these columns"
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs={args.jobs}: expected at least 1")
    if args.real_group_ranks < 1:
        parser.error(f"--real-group-ranks={args.real_group_ranks}: expected at least 1")
    known = [peer.name for peer in (*PEERS, *PROCESSED_PEERS)]
    unknown = set(args.peer) - set(known)
    if unknown:
        parser.error(f"--peer: unknown {sorted(unknown)}; known: {known}")
    chosen = [peer for peer in PEERS if not args.peer or peer.name in args.peer]
    chosen_processed = [p for p in PROCESSED_PEERS if not args.peer or p.name in args.peer]
    unserved = {p.name: processed.unserved(p) for p in chosen_processed}
    for name, reason in unserved.items():
        if reason is not None:  # another adapter of its library serves what is installed
            print(f"conformance: {name}: not run ({reason}); its subsection is kept")
    chosen_processed = [p for p in chosen_processed if unserved[p.name] is None]
    args.root = Path.cwd().resolve()
    args.artifacts_out = args.output.resolve().parent / "conformance"
    args.artifacts_out.mkdir(parents=True, exist_ok=True)
    args.footnotes = []
    existing = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
    kept_matrix, _, kept_processed = existing.partition(f"\n{processed.HEADING}\n")
    rows: list[tuple[Peer, Row]] = []
    timings: dict[str, float] = {}
    results: dict[str, list[PropertyResult]] = {}
    subsections: dict[str, str] = {}
    with (
        tempfile.TemporaryDirectory(prefix="tp-logprob-conformance-") as scratch_dir,
        concurrent.futures.ThreadPoolExecutor(args.jobs) as pool,
    ):
        scratch, started = Path(scratch_dir), time.monotonic()
        # Each session is a process of its own: ``--jobs`` of them run at once, and the
        # report is put together in the catalogue's order once they are done.
        runs = [
            (
                peer,
                pool.submit(_run_peer, peer, args, scratch),
                pool.submit(_run_real_group, peer, args, scratch),
            )
            for peer in chosen
        ]
        processed_runs = [
            (
                sampler,
                pool.submit(_run_processed, sampler, args, scratch),
                [
                    pool.submit(_reproduce, sampler, finding, args.root)
                    for finding in sampler.findings
                ],
            )
            for sampler in chosen_processed
        ]
        for peer, emulated, real_group in runs:
            found, seconds = emulated.result()
            real, real_seconds = real_group.result()
            if seconds:
                timings[peer.name] = seconds
            if real_seconds:
                timings[f"{peer.name} (real group)"] = real_seconds
            rows.append((peer, _render_row(peer, found, args, real)))
        reproductions: dict[str, list[Reproduction]] = {}
        for sampler, session, reproducing in processed_runs:
            results[sampler.name], seconds = session.result()
            reproductions[sampler.name] = [run.result() for run in reproducing]
            subsections[sampler.name] = processed.peer_subsection(
                sampler,
                results[sampler.name],
                reproductions[sampler.name],
                _processed_command(sampler, args),
                seconds,
            )
    args.wall_seconds = time.monotonic() - started
    keep_matrix = not chosen and kept_matrix.strip()
    matrix = kept_matrix.rstrip("\n") + "\n" if keep_matrix else _markdown(rows, timings, args)
    section = processed.section(processed.merge(kept_processed, subsections))
    report = f"{matrix.rstrip()}\n\n{section}"
    args.output.write_text(report, encoding="utf-8")
    for artifact in args.artifacts_out.glob("*.*"):  # examples of the runs it no longer shows
        if artifact.stem not in report:
            artifact.unlink()
    print(f"conformance: wrote {args.output}")
    unexplained = sum(row.unexplained for _, row in rows)
    for _, row in rows:
        for backend in row.stale:
            print(f"conformance: {backend} passed although a failure is explained for it")
    for sampler in chosen_processed:
        for test in processed.unexplained(sampler, results[sampler.name]):
            print(f"conformance: {sampler.name}: {test} failed and no finding lists it")
            unexplained += 1
    broken = 0
    for reproduced in reproductions.values():
        for reproduction in reproduced:
            script = reproduction.finding.explanation.reproducer
            if reproduction.outcome == "agrees":
                print(f"conformance: {script} no longer differs from the exact rules")
            if reproduction.failed:
                print(f"conformance: {script}: {reproduction.outcome}", file=sys.stderr)
                broken += 1
    if unexplained:
        print(f"conformance: {unexplained} failures have no explanation", file=sys.stderr)
    return 1 if unexplained or broken else 0
