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

Run: python benchmarks/bench_main_job.py --against REV [--repeat 1] [--workers auto]
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


def _time_main_job(tree: Path, workers: str, database: Path) -> tuple[float, int, str]:
    """Seconds, exit status and pytest's summary line for one main-job run on ``tree``,
    with its example database in the new directory ``database``."""
    command = [
        sys.executable, "-m", "pytest", "--pyargs", "tp_logprob.properties",
        "-p", "no:cacheprovider", "-p", "no:tp_logprob", "-p", _plugin_module(tree),
        "-n", workers, "--tp-logprob-profile=ci", "-q",
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": str(tree / "src"),
        "TRITON_INTERPRET": "1",
        "TP_LOGPROB_HYPOTHESIS_DB": str(database),
    }
    start = time.perf_counter()
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return seconds, done.returncode, lines[-1] if lines else done.stderr.strip()[-200:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="the revision to compare with")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each tree")
    parser.add_argument("--workers", default="auto", help="pytest -n (the main job's: auto)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat={args.repeat}: must be at least 1")
    with tempfile.TemporaryDirectory(prefix="tp-logprob-main-job-") as scratch:
        other = Path(scratch) / "against"
        subprocess.run(
            ["git", "-C", str(HERE), "worktree", "add", "--detach", str(other), args.against],
            check=True,
            capture_output=True,
        )
        try:
            times: dict[str, list[float]] = {args.against: [], "this checkout": []}
            for run in range(args.repeat):
                for label, tree in ((args.against, other), ("this checkout", HERE)):
                    database = Path(scratch) / f"database-{len(times[label])}-{tree.name}"
                    seconds, status, summary = _time_main_job(tree, args.workers, database)
                    times[label].append(seconds)
                    print(f"run {run + 1} {label}: {seconds:.1f} s, exit {status}: {summary}")
        finally:
            subprocess.run(
                ["git", "-C", str(HERE), "worktree", "remove", "--force", str(other)],
                check=False,
            )
    before = statistics.median(times[args.against])
    after = statistics.median(times["this checkout"])
    print(
        f"median: {args.against} {before:.1f} s, this checkout {after:.1f} s, "
        f"ratio {after / before:.3f} ({100 * (after / before - 1):+.1f}%)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
