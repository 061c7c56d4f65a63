"""The property suite under torchrun from a test: one session, and what its ranks left.

A session reads rank 0's terminal, the other ranks' output (``rank<r>.out``) and
every rank's log (``rank<r>.log``, one ``EXAMPLE`` line per example). Examples come
from a small Hypothesis profile of the session's own (``real_group_tests``), so a
session of the whole suite stays short.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BACKENDS = Path(__file__).resolve().parent / "real_group_backends.py"
PROFILE_MODULE = "real_group_tests_profile"
PROFILE = """
from hypothesis import settings

settings.register_profile("real_group_tests", max_examples=3)
"""


def spec(name: str) -> str:
    """The ``--tp-logprob-backend`` value of a backend in tests/helpers/real_group_backends.py."""
    return f"{BACKENDS}:{name}"


@dataclass
class Session:
    """What one torchrun session left: rank 0's terminal and every rank's files."""

    returncode: int
    output: str
    directory: Path
    seconds: float

    def log(self, rank: int) -> str:
        return (self.directory / "ranks" / f"rank{rank}.log").read_text()

    def out(self, rank: int) -> str:
        return (self.directory / "ranks" / f"rank{rank}.out").read_text()

    def examples(self, rank: int) -> list[str]:
        return [line for line in self.log(rank).splitlines() if line.startswith("EXAMPLE ")]


def environment(directory: Path) -> dict[str, str]:
    """This environment, without a profile choice, with ``directory`` importable."""
    env = {key: value for key, value in os.environ.items() if key != "TP_LOGPROB_PROFILE"}
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(directory), env.get("PYTHONPATH")]))
    return env


def suite_args(directory: Path, *args: str) -> list[str]:
    """``-m pytest`` arguments running the suite from ``directory`` under the small profile."""
    (directory / f"{PROFILE_MODULE}.py").write_text(PROFILE)
    return [
        "-m", "pytest", "--pyargs", "tp_logprob.properties", "-q", "-rs",
        "-p", "no:cacheprovider", "-p", PROFILE_MODULE, "--hypothesis-profile=real_group_tests",
        f"--tp-logprob-artifacts={directory / 'failures'}",
        f"--tp-logprob-rank-logs={directory / 'ranks'}",
        *args,
    ]  # fmt: skip


def torchrun(world: int, directory: Path, *args: str, timeout: float = 400) -> Session:
    """The suite on a gloo group of ``world`` ranks (torchrun --standalone)."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={world}", *suite_args(directory, *args),
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(
        command,
        cwd=directory,
        env=environment(directory),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = done.stdout + done.stderr
    return Session(done.returncode, output, directory, time.monotonic() - started)
