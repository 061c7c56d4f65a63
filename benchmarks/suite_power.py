"""Suite power: run the property suite on every planted-bug backend and on the controls.

For each backend in ``tests.mutants`` (MUTANTS, then CONTROLS) it runs, in a fresh
process and with an empty Hypothesis example database::

    python -m pytest --pyargs tp_logprob.properties --tp-logprob-backend=SPEC \\
        --tp-logprob-profile=ci --tp-logprob-platform=cpu --hypothesis-seed=SEED \\
        -x -q -p no:cacheprovider

(an example stored by an earlier run would be replayed first and make a kill look
instant). A mutant is *killed* when a property fails on it (pytest exit status 1
with a failed test); it *survives* when the suite passes. The controls (torch_native,
torch_native rebuilt from the mutants' parts, the kernel template, torch_native_fused
and its rebuild, torch_native with sampling supports) must pass. Every run is the whole
suite: a fused (hidden-input) mutant is not collected for the logits-path properties, as
any hidden-only backend is not (it does not claim them), and the other way round.
Time to kill is the wall time of that pytest process: start-up and imports, the
properties that passed before, and the failing one with its shrinking (``-x``
stops there). ``--all-properties`` drops ``-x`` to list every property that
fails, which shows how redundant the suite's coverage of each bug is.

A mutant that declares ``reach`` (the reach properties it needs: long batches, row
positions, the fused wide sweep, the fused memory check's repeated rows) is run a
second time with those properties deselected (``--deselect`` on their node ids, every
parametrization): it must *survive* that run, which shows that only they kill it. A kill
there means the declaration is wrong.

``TRITON_INTERPRET`` is removed from the runs' environment, so on CPU the only
built-in backend is torch_native: cross-backend agreement compares each mutant
with it, and no time goes to the Triton interpreter.

It prints one line per run, then a markdown report that it also writes to
docs/suite-power.md. Exit status 0 only if every mutant is killed under every
seed, every control passes, and every reach mutant survives without its reach properties.

Run: python benchmarks/suite_power.py [--jobs 2] [--seed N ...] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import platform
import re
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

from tp_logprob.suite.profiles import CI_SEED  # noqa: E402

DEFAULT_OUTPUT = ROOT / "docs" / "suite-power.md"
PROPERTIES = ROOT / "src" / "tp_logprob" / "properties"
SUITE_SOURCES = ("properties", "suite", "judging", "real_group")
"""The packages of the property suite: the properties, the engine, the judging, the real group."""


def suite_digest() -> str:
    """sha256 (first 12 digits) of the property suite's source: which suite was measured."""
    hasher = hashlib.sha256()
    package = PROPERTIES.parent
    for path in sorted(p for name in SUITE_SOURCES for p in (package / name).glob("*.py")):
        hasher.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return hasher.hexdigest()[:12]


@dataclass(frozen=True)
class Target:
    """One backend to run the suite on; ``bug`` is None for a control, ``reach`` the only
    properties that can kill a mutant (``Mutant.reach``)."""

    name: str
    spec: str
    bug: str | None
    reach: tuple[str, ...] = ()


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
    without_reach: bool = False  # the target's reach properties deselected

    @property
    def expected(self) -> str:
        if self.target.bug is None:
            return "passed"
        return "survived" if self.without_reach else "killed"

    @property
    def ok(self) -> bool:
        return self.status == self.expected


def property_module(name: str) -> Path:
    """The suite module that defines the property ``name``."""
    pattern = re.compile(rf"^def {re.escape(name)}\(", re.MULTILINE)
    modules = sorted(PROPERTIES.glob("test_*.py"))
    found = [path for path in modules if pattern.search(path.read_text())]
    if len(found) != 1:
        raise ValueError(
            f"property {name!r}: defined in {len(found)} modules of {PROPERTIES} "
            f"({[path.name for path in found]}), expected one"
        )
    return found[0]


def reach_deselects(reach: Sequence[str]) -> list[str]:
    """``--deselect`` prefixes of every parametrization of the ``reach`` properties:
    ``src/tp_logprob/properties/test_x.py::test_name[`` (the ``[`` keeps out a property
    whose name merely starts with this one)."""
    return [f"{property_module(name).relative_to(ROOT).as_posix()}::{name}[" for name in reach]


def suite_args(
    spec: str, seed: int, args: argparse.Namespace, deselect: Sequence[str] = ()
) -> list[str]:
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
        *(f"--deselect={prefix}" for prefix in deselect),
    ]


def _environment(database: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env["TP_LOGPROB_HYPOTHESIS_DB"] = str(database)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _junit(junit: Path) -> tuple[frozenset[str], tuple[Failure, ...]]:
    """The properties that ran (or were skipped), and the failed ones."""
    if not junit.is_file():
        return frozenset(), ()
    ran: set[str] = set()
    found: list[Failure] = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        ran.add(case.get("name", "?").split("[")[0])
        for kind in ("failure", "error"):
            element = case.find(kind)
            if element is None:
                continue
            message = (element.get("message") or element.text or "").strip()
            headline = message.splitlines()[0] if message else kind
            test = case.get("name", "?").split("[")[0]
            found.append(Failure(test, headline, float(case.get("time", 0.0)), kind == "failure"))
    return frozenset(ran), tuple(found)


def run_one(
    target: Target, seed: int, args: argparse.Namespace, *, without_reach: bool = False
) -> Run:
    """Run the suite on ``target`` in a fresh process (``without_reach``: its reach
    properties deselected); classify the outcome."""
    deselect = reach_deselects(target.reach) if without_reach else []
    with tempfile.TemporaryDirectory(prefix="suite-power-") as scratch:
        junit = Path(scratch) / "junit.xml"
        command = [sys.executable, "-m", "pytest", *suite_args(target.spec, seed, args, deselect)]
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
            note = f"timed out after {args.timeout:g} s"
            return Run(target, seed, "error", (), wall, note, without_reach)
        wall = time.perf_counter() - started
        ran, failures = _junit(junit)
    return classify(target, seed, done, ran, failures, wall, without_reach=without_reach)


def classify(
    target: Target,
    seed: int,
    done: subprocess.CompletedProcess[str],
    ran: frozenset[str],
    failures: tuple[Failure, ...],
    wall_s: float,
    *,
    without_reach: bool = False,
) -> Run:
    """The outcome of one finished pytest process, from its exit status and JUnit XML."""
    kept = sorted(ran & set(target.reach)) if without_reach else []
    if kept:  # a survival would prove nothing
        note = f"not deselected (they ran): {', '.join(kept)}"
        return Run(target, seed, "error", failures, wall_s, note, without_reach)
    mutant = target.bug is not None
    if done.returncode == 0:
        status = "survived" if mutant else "passed"
        return Run(target, seed, status, failures, wall_s, without_reach=without_reach)
    if done.returncode == 1 and failures and all(f.is_failure for f in failures):
        status = "killed" if mutant else "FAILED"
        return Run(target, seed, status, failures, wall_s, without_reach=without_reach)
    output = (done.stdout + done.stderr).strip().splitlines()
    note = f"pytest exit status {done.returncode}: {output[-1] if output else 'no output'}"
    return Run(target, seed, "error", failures, wall_s, note, without_reach)


def plan(targets: Sequence[Target], seeds: Sequence[int]) -> list[tuple[Target, int, bool]]:
    """Every run as ``(target, seed, without_reach)``: each target under each seed, and a
    target that declares ``reach`` once more without it. Checks the declarations first."""
    for target in targets:
        reach_deselects(target.reach)  # an unknown property name fails here, before any run
    return [
        (target, seed, without)
        for target in targets
        for without in ((False, True) if target.reach else (False,))
        for seed in seeds
    ]


def _targets(only: Sequence[str] | None) -> list[Target]:
    targets = [Target(m.name, m.spec, m.bug, m.reach) for m in MUTANTS]
    targets += [Target(name, spec, None) for name, spec in CONTROLS]
    if only:
        unknown = set(only) - {target.name for target in targets}
        if unknown:
            raise SystemExit(f"--only: unknown names {sorted(unknown)}")
        targets = [target for target in targets if target.name in only]
    return targets


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _verdict(runs: Sequence[Run]) -> str:
    first, ok = runs[0], sum(run.ok for run in runs)
    return first.status if len(runs) == 1 else f"{first.status}, {ok}/{len(runs)} seeds as expected"


def _row(target: Target, runs: list[Run], all_properties: bool) -> list[str]:
    first = runs[0]
    verdict = _verdict(runs)
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


def _killers(runs: Sequence[Run], all_properties: bool) -> str:
    """The properties that failed: each run's first (``all_properties``: every one)."""
    names = [f.test for run in runs for f in (run.failures if all_properties else run.failures[:1])]
    return ", ".join(f"`{name}`" for name in dict.fromkeys(names))


def _reach_row(target: Target, runs: Sequence[Run], all_properties: bool) -> list[str]:
    """mutant, its reach properties, what killed it with them, its verdict without them."""
    main = [run for run in runs if not run.without_reach]
    without = [run for run in runs if run.without_reach]
    verdict = _verdict(without)
    unexpected = next((run for run in without if not run.ok), None)
    if unexpected is not None:
        verdict += ": " + _cell(
            f"{_killers([unexpected], False)} {unexpected.failures[0].headline}"
            if unexpected.failures and unexpected.status == "killed"
            else unexpected.note
        )
    return [
        target.name,
        ", ".join(f"`{name}`" for name in target.reach),
        _killers(main, all_properties),
        verdict,
        f"{statistics.median(run.wall_s for run in without):.1f}",
    ]


def _reach_section(
    runs: dict[str, list[Run]], mutants: Sequence[Target], all_properties: bool
) -> list[str]:
    reach = [t for t in mutants if t.reach]
    if not reach:
        return []
    return [
        "## Reach: mutants only the reach properties kill",
        "",
        "These bugs sit where the older properties never look: past a batch's first 64",
        "rows, past a shard's first 128-column tile, or in a row's position in its batch.",
        "Each such mutant names the properties that reach it (`reach=` in",
        "`tests/mutants/__init__.py`) and runs once more with exactly those deselected",
        "(`--deselect` on their node ids); it must survive that run, which shows that",
        "nothing else in the suite kills it. A kill there would mean the declaration is wrong.",
        "",
        *_table(
            [
                "mutant",
                "reach properties",
                "killed by (with them)",
                "without them",
                "wall s (without)",
            ],
            [_reach_row(t, runs[t.name], all_properties) for t in reach],
        ),
        "",
    ]


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
    main = {name: [run for run in done if not run.without_reach] for name, done in runs.items()}
    kill_times = [run.wall_s for t in mutants for run in main[t.name] if run.status == "killed"]
    unexpected = [
        t.name + (" (without its reach properties)" if run.without_reach else "")
        for t in targets
        for run in runs[t.name]
        if not run.ok
    ]
    unexpected = list(dict.fromkeys(unexpected))
    invocation = shlex.join(["python", "benchmarks/suite_power.py", *args.argv])
    example = shlex.join(["python", "-m", "pytest", *suite_args("SPEC", args.seed[0], args)])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Suite power: planted bugs the property suite must catch",
        "",
        f"Generated by `{invocation}` on {when} ({platform.platform()}, {os.cpu_count()} CPUs,",
        f"load average {load:.1f} when it finished), on the property suite whose sources",
        f"(`src/tp_logprob/{{properties,suite,judging,real_group}}/*.py`) hash to "
        f"`{suite_digest()}`.",
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
                for row in [_row(t, main[t.name], args.all_properties)]
            ],
        ),
        "",
        *_reach_section(runs, mutants, args.all_properties),
        "## Controls (must pass)",
        "",
        *_table(
            ["backend", *header],
            [_row(t, main[t.name], args.all_properties) for t in controls],
        ),
        "",
        "## Summary",
        "",
        f"- mutants killed: {sum(all(r.status == 'killed' for r in main[t.name]) for t in mutants)}"
        f" of {len(mutants)}; controls passed: "
        f"{sum(all(r.status == 'passed' for r in main[t.name]) for t in controls)} of "
        f"{len(controls)}; seeds {', '.join(map(str, args.seed))}",
    ]
    reach = [t for t in mutants if t.reach]
    if reach:
        survivors = sum(
            all(r.status == "survived" for r in runs[t.name] if r.without_reach) for t in reach
        )
        lines.append(
            f"- reach mutants that survive without their reach properties: "
            f"{survivors} of {len(reach)}"
        )
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
    try:
        runs_planned = plan(targets, args.seed)
    except ValueError as error:
        raise SystemExit(f"reach: {error}") from None
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [
            pool.submit(run_one, target, seed, args, without_reach=without)
            for target, seed, without in runs_planned
        ]
        finished = []
        for future in futures:
            run = future.result()
            finished.append(run)
            first = run.failures[0] if run.failures else None
            what = f"{first.test}: {first.headline}" if first else run.note
            name = run.target.name + (" (without reach)" if run.without_reach else "")
            print(f"{name:<28} {run.status:<8} {run.wall_s:6.1f} s  {what[:100]}")
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
