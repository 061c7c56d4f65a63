"""Property-suite throughput: examples per second for each property and backend.

Runs ``pytest --pyargs tp_logprob.properties`` in this process (``-n 0``) and
times every property's call phase, counting the Hypothesis examples it ran.
With ``--xdist`` it then times the whole suite twice more in fresh processes,
``-n 0`` and ``-n auto``, and prints the speed-up.

The example database is a fresh temporary directory, so no run replays another's
failures; ``TRITON_INTERPRET=1`` is set unless the environment sets it (the
Triton backends run on CPU through the interpreter).

Run: python benchmarks/bench_suite.py [--profile ci] [--backend ID ...] [--xdist]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Generator
from pathlib import Path

import pytest


class _Timer:
    """pytest plugin: seconds and examples of each property test's call phase."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, int, float]] = []

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        from tp_logprob.pytest_plugin import BACKEND_FIXTURE, suite_stats

        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get(BACKEND_FIXTURE) if callspec is not None else None
        stats = suite_stats(item.config)
        before = stats.of(backend.backend_id).examples if backend else 0
        start = time.perf_counter()
        try:
            return (yield)
        finally:
            seconds = time.perf_counter() - start
            if backend:
                examples = stats.of(backend.backend_id).examples - before
                name = getattr(item, "originalname", item.name)
                self.rows.append((name, backend.backend_id, examples, seconds))


def _pytest_args(profile: str, backends: list[str]) -> list[str]:
    return [
        "--pyargs",
        "tp_logprob.properties",
        f"--tp-logprob-profile={profile}",
        "-p",
        "no:cacheprovider",
        "-q",
        *(f"--tp-logprob-backend={backend}" for backend in backends),
    ]


def _per_property(profile: str, backends: list[str]) -> int:
    timer = _Timer()
    start = time.perf_counter()
    status = pytest.main([*_pytest_args(profile, backends), "-n", "0"], plugins=[timer])
    total = time.perf_counter() - start
    print(f"\n{'property':42} {'backend':18} {'examples':>8} {'seconds':>8} {'examples/s':>10}")
    for name, backend, examples, seconds in sorted(timer.rows, key=lambda row: -row[3]):
        rate = examples / seconds if seconds else float("nan")
        print(f"{name:42} {backend:18} {examples:8d} {seconds:8.2f} {rate:10.1f}")
    examples = sum(row[2] for row in timer.rows)
    print(f"{'total (-n 0, in process)':61} {examples:8d} {total:8.2f} {examples / total:10.1f}")
    return int(status)


def _wall_time(profile: str, backends: list[str], workers: str) -> float:
    command = [sys.executable, "-m", "pytest", *_pytest_args(profile, backends), "-n", workers]
    start = time.perf_counter()
    subprocess.run(command, check=False, capture_output=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="ci", choices=("dev", "ci", "thorough"))
    parser.add_argument("--backend", action="append", default=[], help="as --tp-logprob-backend")
    parser.add_argument("--xdist", action="store_true", help="also time -n 0 against -n auto")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRITON_INTERPRET", "1")
    with tempfile.TemporaryDirectory() as database:
        os.environ["TP_LOGPROB_HYPOTHESIS_DB"] = str(Path(database) / "db")
        status = _per_property(args.profile, args.backend)
        if args.xdist:
            serial = _wall_time(args.profile, args.backend, "0")
            parallel = _wall_time(args.profile, args.backend, "auto")
            print(
                f"\nwall time, fresh processes: -n 0 {serial:.1f} s, -n auto "
                f"({os.cpu_count()} CPUs) {parallel:.1f} s, speed-up {serial / parallel:.2f}x"
            )
    return status


if __name__ == "__main__":
    sys.exit(main())
