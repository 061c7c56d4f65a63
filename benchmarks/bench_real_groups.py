"""The property suite on real process groups against the emulated group: time per property.

Runs the suite for one backend three ways in one go, each in fresh processes with
the same profile: on the emulated group (plain ``pytest``, one process), then on
real gloo groups of each ``--ranks`` size (``torchrun --standalone``). Reads each
test's call time from rank 0's ``--durations`` report and prints one markdown table
(property, seconds per run, ratio to the emulated run) and the totals, wall time
included (torchrun starts a Python with torch per rank).

Run: python benchmarks/bench_real_groups.py [--backend torch_native] [--profile ci] [--ranks 2 3]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CALL = re.compile(r"^([\d.]+)s call\s+\S*::(test_\w+)\[[^\]]+\]", re.MULTILINE)
_SUMMARY = re.compile(r"^=*\s*(\d+ passed.*?) in [\d.]+s", re.MULTILINE)


def _run(command: list[str], directory: Path) -> tuple[dict[str, float], str, float]:
    """Per-test call seconds, the summary line and the wall time of one session."""
    env = {key: value for key, value in os.environ.items() if key != "TP_LOGPROB_PROFILE"}
    env["OMP_NUM_THREADS"] = "1"
    started = time.monotonic()
    done = subprocess.run(command, cwd=directory, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{output[-3000:]}")
    seconds: dict[str, float] = {}
    for value, test in _CALL.findall(output):
        seconds[test] = seconds.get(test, 0.0) + float(value)
    summary = _SUMMARY.search(output)
    return seconds, summary.group(1) if summary else "?", wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="torch_native")
    parser.add_argument("--profile", default="ci", choices=("dev", "ci", "thorough"))
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 3])
    args = parser.parse_args()
    suite = [
        "-m", "pytest", "--pyargs", "tp_logprob.properties", "-p", "no:cacheprovider",
        "-p", "no:xdist", "-q", "--durations=0", "--durations-min=0",
        f"--tp-logprob-backend={args.backend}", f"--tp-logprob-profile={args.profile}",
    ]  # fmt: skip
    runs: dict[str, tuple[dict[str, float], str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="tp-logprob-bench-real-") as scratch:
        directory = Path(scratch)
        runs["emulated"] = _run([sys.executable, *suite], directory)
        for ranks in args.ranks:
            launcher = [
                sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={ranks}",
            ]  # fmt: skip
            runs[f"real, {ranks} ranks"] = _run([*launcher, *suite], directory)
    names = list(runs)
    baseline = runs["emulated"][0]
    tests = sorted(baseline, key=lambda test: -baseline[test])
    header = ["property test", *(f"{name} (s)" for name in names)]
    header += [f"{name} / emulated" for name in names[1:]]
    print("| " + " | ".join(header) + " |")
    print("| --- " + "| ---: " * (len(header) - 1) + "|")
    for test in tests:
        cells = [f"{runs[name][0].get(test, 0.0):.2f}" for name in names]
        ratios = [
            f"{runs[name][0].get(test, 0.0) / baseline[test]:.1f}x"
            if baseline[test] >= 0.05
            else "-"
            for name in names[1:]
        ]
        print(f"| `{test}` | " + " | ".join(cells + ratios) + " |")
    totals = [sum(runs[name][0].values()) for name in names]
    ratios = [f"{total / totals[0]:.1f}x" for total in totals[1:]]
    print(
        "| all properties (call time) | "
        + " | ".join([*(f"{t:.1f}" for t in totals), *ratios])
        + " |"
    )
    walls = [runs[name][2] for name in names]
    ratios = [f"{wall / walls[0]:.1f}x" for wall in walls[1:]]
    print(
        "| wall time, start to exit | " + " | ".join([*(f"{w:.1f}" for w in walls), *ratios]) + " |"
    )
    print()
    for name in names:
        print(f"{name}: {runs[name][1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
