"""Suite power: run the property suite on every planted-bug backend and on the controls.

For each backend in ``tests.mutants`` (MUTANTS, then CONTROLS) it runs, in a fresh
process and with an empty Hypothesis example database::

    python -m pytest --pyargs tp_logprob.properties --tp-logprob-backend=SPEC \\
        --tp-logprob-profile=ci --tp-logprob-platform=cpu --hypothesis-seed=SEED \\
        -x -q -p no:cacheprovider

(an example stored by an earlier run would be replayed first and make a kill look
instant). A mutant is *killed* when a property fails on it (pytest exit status 1
with a failed test); it *survives* when the suite passes. The controls (torch_native,
torch_native rebuilt from the mutants' parts, examples/my_kernel.py, torch_native_fused
and its rebuild) must pass. Every run is the whole suite: a fused (hidden-input) mutant
skips the logits-path properties as any hidden-only backend does, and the other way round.
Time to kill is the wall time of that pytest process: start-up and imports, the
properties that passed before, and the failing one with its shrinking (``-x``
stops there). ``--all-properties`` drops ``-x`` to list every property that
fails, which shows how redundant the suite's coverage of each bug is.

``TRITON_INTERPRET`` is removed from the runs' environment, so on CPU the only
built-in backend is torch_native: cross-backend agreement compares each mutant
with it, and no time goes to the Triton interpreter.

It prints one line per run, then a markdown report that it also writes to
docs/suite-power.md. Exit status 0 only if every mutant is killed under every
seed and every control passes.

Run: python benchmarks/suite_power.py [--jobs 2] [--seed N ...] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.mutants, from a checkout

from tests.mutants import CONTROLS, MUTANTS  # noqa: E402

from tp_logprob.properties.profiles import CI_SEED  # noqa: E402

DEFAULT_OUTPUT = ROOT / "docs" / "suite-power.md"
PROPERTIES = ROOT / "src" / "tp_logprob" / "properties"


def suite_digest() -> str:
    """sha256 (first 12 digits) of the property suite's source: which suite was measured."""
    hasher = hashlib.sha256()
    for path in sorted(PROPERTIES.glob("*.py")):
        hasher.update(path.name.encode() + b"\0" + path.read_bytes())
    return hasher.hexdigest()[:12]


@dataclass(frozen=True)
class Target:
    """One backend to run the suite on; ``bug`` is None for a control."""

    name: str
    spec: str
    bug: str | None


@dataclass(frozen=True)
class Failure:
    """One failed (or errored) property of a run, from pytest's JUnit XML."""

    test: str  # the test function, without the backend parameter
    headline: str  # the first line of its failure message
    seconds: float  # the test's own time, shrinking included
    is_failure: bool  # False for an error in setup or teardown


@dataclass(frozen=True)
class Run:
    """One suite run on one target with one seed."""

    target: Target
    seed: int
    status: str  # killed / survived for mutants, passed / FAILED for controls, or error
    failures: tuple[Failure, ...]
    wall_s: float
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.status == ("passed" if self.target.bug is None else "killed")


def suite_args(spec: str, seed: int, args: argparse.Namespace) -> list[str]:
    """The pytest arguments of one run (without the JUnit output)."""
    return [
        "--pyargs",
        "tp_logprob.properties",
        f"--tp-logprob-backend={spec}",
        f"--tp-logprob-profile={args.profile}",
        f"--tp-logprob-platform={args.platform}",
        f"--hypothesis-seed={seed}",
        *([] if args.all_properties else ["-x"]),
        "-q",
        "-p",
        "no:cacheprovider",
    ]


def _environment(database: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env["TP_LOGPROB_HYPOTHESIS_DB"] = str(database)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _failures(junit: Path) -> tuple[Failure, ...]:
    if not junit.is_file():
        return ()
    found = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        for kind in ("failure", "error"):
            element = case.find(kind)
            if element is None:
                continue
            message = (element.get("message") or element.text or "").strip()
            headline = message.splitlines()[0] if message else kind
            test = case.get("name", "?").split("[")[0]
            found.append(Failure(test, headline, float(case.get("time", 0.0)), kind == "failure"))
    return tuple(found)


def run_one(target: Target, seed: int, args: argparse.Namespace) -> Run:
    """Run the suite on ``target`` in a fresh process; classify the outcome."""
    with tempfile.TemporaryDirectory(prefix="suite-power-") as scratch:
        junit = Path(scratch) / "junit.xml"
        command = [sys.executable, "-m", "pytest", *suite_args(target.spec, seed, args)]
        started = time.perf_counter()
        try:
            done = subprocess.run(
                [*command, f"--junitxml={junit}"],
                cwd=ROOT,
                env=_environment(Path(scratch) / "hypothesis"),
                capture_output=True,
                text=True,
                timeout=args.timeout,
            )
        except subprocess.TimeoutExpired:
            wall = time.perf_counter() - started
            return Run(target, seed, "error", (), wall, f"timed out after {args.timeout:g} s")
        wall = time.perf_counter() - started
        failures = _failures(junit)
    mutant = target.bug is not None
    if done.returncode == 0:
        return Run(target, seed, "survived" if mutant else "passed", failures, wall)
    if done.returncode == 1 and failures and all(f.is_failure for f in failures):
        return Run(target, seed, "killed" if mutant else "FAILED", failures, wall)
    output = (done.stdout + done.stderr).strip().splitlines()
    note = f"pytest exit status {done.returncode}: {output[-1] if output else 'no output'}"
    return Run(target, seed, "error", failures, wall, note)


def _targets(only: Sequence[str] | None) -> list[Target]:
    targets = [Target(m.name, m.spec, m.bug) for m in MUTANTS]
    targets += [Target(name, spec, None) for name, spec in CONTROLS]
    if only:
        unknown = set(only) - {target.name for target in targets}
        if unknown:
            raise SystemExit(f"--only: unknown names {sorted(unknown)}")
        targets = [target for target in targets if target.name in only]
    return targets


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _row(target: Target, runs: list[Run], all_properties: bool) -> list[str]:
    first = runs[0]
    ok = sum(run.ok for run in runs)
    verdict = (
        first.status if len(runs) == 1 else f"{first.status}, {ok}/{len(runs)} seeds as expected"
    )
    walls = [run.wall_s for run in runs]
    wall = f"{statistics.median(walls):.1f}" + (f" (max {max(walls):.1f})" if len(runs) > 1 else "")
    killer = first.failures[0] if first.failures else None
    cells = [
        target.name,
        verdict,
        f"`{killer.test}`" if killer else "",
        _cell(killer.headline if killer else first.note),
        wall,
        f"{killer.seconds:.2f}" if killer else "",
    ]
    if all_properties:
        cells.append(", ".join(f"`{f.test}`" for f in first.failures))
    return cells


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def report(
    runs: dict[str, list[Run]], targets: list[Target], args: argparse.Namespace, total_s: float
) -> tuple[str, bool]:
    """The markdown report, and whether every mutant died and every control passed."""
    controls = [t for t in targets if t.bug is None]
    mutants = [t for t in targets if t.bug is not None]
    header = ["verdict", "first failing property", "its failure", "wall s", "test s"]
    if args.all_properties:
        header.append("every failing property")
    kill_times = [run.wall_s for t in mutants for run in runs[t.name] if run.status == "killed"]
    unexpected = [t.name for t in targets if not all(run.ok for run in runs[t.name])]
    invocation = shlex.join(["python", "benchmarks/suite_power.py", *args.argv])
    example = shlex.join(["python", "-m", "pytest", *suite_args("SPEC", args.seed[0], args)])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Suite power: planted bugs the property suite must catch",
        "",
        f"Generated by `{invocation}` on {when} ({platform.platform()}, {os.cpu_count()} CPUs,",
        f"load average {load:.1f} when it finished), on the property suite whose sources",
        f"(`src/tp_logprob/properties/*.py`) hash to `{suite_digest()}`.",
        "",
        "Each mutant is torch_native (`fused_*`: torch_native_fused) with one realistic",
        "bug (`tests/mutants/`, the line marked `# BUG:`), registered with its base",
        "backend's capability (or, where the lie is the bug, a false claim). Each run is",
        "the whole suite in a fresh process with an empty",
        "Hypothesis database and `TRITON_INTERPRET` unset:",
        "",
        f"    {example}",
        "",
        "`wall s` is the time to kill: the whole pytest process (about 3-4 s of start-up",
        "and imports included, and every property that passed before the failing one);",
        "`test s` is the failing property's own time, shrinking included (the ci",
        f"profile skips Hypothesis' explain phase). {args.jobs} run(s) in parallel on "
        f"{os.cpu_count()} cores that",
        "other jobs also used, so times are under load and vary by a factor of ~2.",
        "",
        "## Mutants (must be killed)",
        "",
        *_table(
            ["mutant", "bug", *header],
            [
                [row[0], _cell(t.bug or ""), *row[1:]]
                for t in mutants
                for row in [_row(t, runs[t.name], args.all_properties)]
            ],
        ),
        "",
        "## Controls (must pass)",
        "",
        *_table(
            ["backend", *header],
            [_row(t, runs[t.name], args.all_properties) for t in controls],
        ),
        "",
        "## Summary",
        "",
        f"- mutants killed: {sum(all(r.status == 'killed' for r in runs[t.name]) for t in mutants)}"
        f" of {len(mutants)}; controls passed: "
        f"{sum(all(r.status == 'passed' for r in runs[t.name]) for t in controls)} of "
        f"{len(controls)}; seeds {', '.join(map(str, args.seed))}",
    ]
    if kill_times:
        lines.append(
            f"- time to kill: median {statistics.median(kill_times):.1f} s, "
            f"max {max(kill_times):.1f} s"
        )
    lines.append(f"- whole run: {total_s:.0f} s wall, {args.jobs} run(s) in parallel")
    lines.append("- not as expected: " + (", ".join(unexpected) if unexpected else "none"))
    return "\n".join(lines) + "\n", not unexpected


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="suite runs in parallel (default 2)")
    parser.add_argument(
        "--seed", type=int, action="append", help=f"Hypothesis seed, repeatable (default {CI_SEED})"
    )
    parser.add_argument("--profile", default="ci", choices=("dev", "ci", "thorough"))
    parser.add_argument("--platform", default="cpu", choices=("cpu", "cuda", "rocm"))
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these backends only")
    parser.add_argument(
        "--all-properties", action="store_true", help="no -x: list every property that fails"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per suite run")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="markdown report")
    parser.add_argument("--no-write", action="store_true", help="print the report only")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.seed = args.seed or [CI_SEED]
    targets = _targets(args.only)
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [
            pool.submit(run_one, target, seed, args) for target in targets for seed in args.seed
        ]
        finished = []
        for future in futures:
            run = future.result()
            finished.append(run)
            first = run.failures[0] if run.failures else None
            what = f"{first.test}: {first.headline}" if first else run.note
            print(f"{run.target.name:<28} {run.status:<8} {run.wall_s:6.1f} s  {what[:100]}")
    total = time.perf_counter() - started
    runs = {target.name: [run for run in finished if run.target is target] for target in targets}
    text, ok = report(runs, targets, args, total)
    print()
    print(text)
    if not args.no_write:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
        print(f"wrote {args.output}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
