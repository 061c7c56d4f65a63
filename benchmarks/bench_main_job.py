"""The main job's wall time here against another revision, side by side in one run.

Runs the pytest command of ``nox -s properties`` (``--pyargs tp_logprob.properties
-n auto --tp-logprob-profile=ci``) on this checkout and on a ``git worktree`` of
``--against``, alternating, ``--repeat`` times each, and prints every run's wall
time and exit status, the medians and their ratio. Each tree runs its own source
(``PYTHONPATH=<tree>/src``) and its own pytest plugin, the one its pyproject
registers; every run gets a fresh example database (``TP_LOGPROB_HYPOTHESIS_DB``),
so no run replays another's failures and the checkout's own database is untouched.
Both use this interpreter's packages, and the Triton backends run through the
interpreter (``TRITON_INTERPRET=1``).

Before any timed run each tree's suite is collected once (``--collect-only``), so
every tree starts with its bytecode and pytest's rewritten test modules cached: a
fresh worktree would otherwise pay that on its first run and this checkout not.
``--against`` may be given more than once (every revision against this checkout);
``--parallel`` starts one run of every tree at the same time, so that on a machine
other jobs share, each tree meets the same load; but the faster tree finishes first and
the slower one then runs alone, so a large speed-up reads smaller than it is there
(alternated runs, the default, time each tree alone). ``--log-dir`` keeps each run's
whole output (add ``--durations=30`` after ``--`` to see where the time goes).

Run: python benchmarks/bench_main_job.py --against REV [--against REV2] [--repeat 1]
[--workers auto] [--parallel] [--log-dir DIR] [-- EXTRA PYTEST ARGS]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def _plugin_module(tree: Path) -> str:
    """The module ``tree``'s pyproject registers as its pytest plugin."""
    text = (tree / "pyproject.toml").read_text()
    found = re.search(r'^\[project\.entry-points\.pytest11\]\s*tp_logprob = "([\w.]+)"', text, re.M)
    if found is None:
        raise SystemExit(f"{tree}/pyproject.toml registers no tp_logprob pytest plugin")
    return found.group(1)


def _command(tree: Path, workers: str, extra: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "pytest", "--pyargs", "tp_logprob.properties",
        "-p", "no:cacheprovider", "-p", "no:tp_logprob", "-p", _plugin_module(tree),
        "-n", workers, "--tp-logprob-profile=ci", "-q", *extra,
    ]  # fmt: skip


def _environment(tree: Path, database: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(tree / "src"),
        "TRITON_INTERPRET": "1",
        "TP_LOGPROB_HYPOTHESIS_DB": str(database),
    }


def _warm(tree: Path, database: Path) -> None:
    """Collect ``tree``'s suite once, untimed: its bytecode and rewritten modules cached."""
    command = _command(tree, "0", ["--collect-only"])
    subprocess.run(command, cwd=tree, env=_environment(tree, database), capture_output=True)


def _start(tree: Path, workers: str, database: Path, extra: list[str]) -> subprocess.Popen[str]:
    """One main-job run on ``tree``, its example database in the new directory ``database``."""
    return subprocess.Popen(
        _command(tree, workers, extra),
        cwd=tree,
        env=_environment(tree, database),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(run: subprocess.Popen[str], log: Path | None) -> tuple[int, str]:
    """Exit status and pytest's summary line of a started run; its output in ``log``."""
    stdout, stderr = run.communicate()
    if log is not None:
        log.write_text(stdout + stderr)
    lines = [line for line in stdout.splitlines() if line.strip()]
    return run.returncode, lines[-1] if lines else stderr.strip()[-200:]


def _time_main_job(
    tree: Path, workers: str, database: Path, extra: list[str], log: Path | None
) -> tuple[float, int, str]:
    """Seconds, exit status and pytest's summary line for one main-job run on ``tree``."""
    start = time.perf_counter()
    status, summary = _finish(_start(tree, workers, database, extra), log)
    return time.perf_counter() - start, status, summary


def _time_together(
    trees: dict[str, Path], workers: str, scratch: Path, extra: list[str], logs: Path | None
) -> dict[str, tuple[float, int, str]]:
    """One run of every tree, all started at once; each one's seconds, status and summary."""
    start = time.perf_counter()
    runs = {
        label: _start(tree, workers, scratch / f"database-{index}-{time.time_ns()}", extra)
        for index, (label, tree) in enumerate(trees.items())
    }
    outcomes: dict[str, tuple[float, int, str]] = {}
    pending = dict(runs)
    while pending:
        for label, run in list(pending.items()):
            if run.poll() is None:
                continue
            seconds = time.perf_counter() - start
            log = None if logs is None else logs / f"{_slug(label)}-{time.time_ns()}.log"
            status, summary = _finish(run, log)
            outcomes[label] = (seconds, status, summary)
            del pending[label]
        time.sleep(0.2)
    return outcomes


def _slug(label: str) -> str:
    return re.sub(r"[^\w.-]+", "-", label)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--against", required=True, action="append", help="a revision to compare with"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of each tree")
    parser.add_argument("--workers", default="auto", help="pytest -n (the main job's: auto)")
    parser.add_argument("--parallel", action="store_true", help="run the trees at the same time")
    parser.add_argument("--log-dir", type=Path, help="keep each run's output here")
    parser.add_argument("extra", nargs="*", help="more pytest arguments, after --")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat={args.repeat}: must be at least 1")
    if len(set(args.against)) != len(args.against):
        parser.error(f"--against={args.against}: a revision is named twice")
    if args.log_dir is not None:
        args.log_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tp-logprob-main-job-") as name:
        scratch = Path(name)
        trees: dict[str, Path] = {}
        try:
            for index, revision in enumerate(args.against):
                other = scratch / f"against-{index}"
                subprocess.run(
                    ["git", "-C", str(HERE), "worktree", "add", "--detach", str(other), revision],
                    check=True,
                    capture_output=True,
                )
                trees[revision] = other
            trees["this checkout"] = HERE
            times = _time_trees(trees, args, scratch)
        finally:
            for tree in trees.values():
                if tree != HERE:
                    subprocess.run(
                        ["git", "-C", str(HERE), "worktree", "remove", "--force", str(tree)],
                        check=False,
                    )
    after = statistics.median(times["this checkout"])
    for revision in args.against:
        before = statistics.median(times[revision])
        print(
            f"median: {revision} {before:.1f} s, this checkout {after:.1f} s, "
            f"ratio {after / before:.3f} ({100 * (after / before - 1):+.1f}%)"
        )
    return 0


def _time_trees(
    trees: dict[str, Path], args: argparse.Namespace, scratch: Path
) -> dict[str, list[float]]:
    """Every tree's run times, ``args.repeat`` runs each, alternating or all at once."""
    for index, tree in enumerate(trees.values()):
        _warm(tree, scratch / f"database-warm-{index}")
    times: dict[str, list[float]] = {label: [] for label in trees}
    for run in range(args.repeat):
        if args.parallel:
            outcomes = _time_together(trees, args.workers, scratch, args.extra, args.log_dir)
        else:
            outcomes = {}
            for index, (label, tree) in enumerate(trees.items()):
                database = scratch / f"database-{run}-{index}"
                log = None if args.log_dir is None else args.log_dir / f"{_slug(label)}-{run}.log"
                outcomes[label] = _time_main_job(tree, args.workers, database, args.extra, log)
        for label, (seconds, status, summary) in outcomes.items():
            times[label].append(seconds)
            print(f"run {run + 1} {label}: {seconds:.1f} s, exit {status}: {summary}", flush=True)
    return times


if __name__ == "__main__":
    raise SystemExit(main())
