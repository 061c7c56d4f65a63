"""Real torch.distributed (gloo on loopback) against run_tp: the same bits, and timeouts not hangs.

One gloo group of 2 and one of 4 processes each start once (a few seconds) and
run every case; the test then compares what each rank got with run_tp.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from tp_logprob.emulate import run_tp
from tp_logprob.kernels.native import torch_native_logprob

pytestmark = pytest.mark.distributed

WORKER = Path(__file__).parent / "helpers" / "distributed_worker.py"
CASES = 20
HANG_TIMEOUT = 2.0
WORLDS = (2, 4)


def _worker_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("distributed_worker", WORKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _start_world(world: int, out: Path) -> list[dict[str, Any]]:
    """Run one gloo group of ``world`` worker processes to completion; their reports."""
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    port = str(_free_port())
    args = [str(CASES), str(out), str(HANG_TIMEOUT)]
    processes = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), str(world), port, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in range(world)
    ]
    for rank, process in enumerate(processes):
        try:
            output, _ = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            pytest.fail(f"gloo world {world}: rank {rank} did not finish in 120 s")
        assert process.returncode == 0, f"world {world} rank {rank}:\n{output.decode()}"
    return [torch.load(out / f"rank{rank}.pt") for rank in range(world)]


# One test per world size, so pytest-xdist never starts the same group on two workers.
@pytest.mark.parametrize("world", WORLDS)
def test_gloo_group(world: int, tmp_path: Path) -> None:
    reports = _start_world(world, tmp_path)
    check_ranks_match_run_tp_bitwise(world, reports)
    check_preflight_names_the_rank_with_another_backend(world, reports)
    check_missing_peer_times_out_within_the_timeout(world, reports)


def check_ranks_match_run_tp_bitwise(world: int, reports: list[dict[str, Any]]) -> None:
    build_case = _worker_module().build_case
    for seed in range(CASES):
        contract, logits, targets = build_case(seed, world)
        emulated = run_tp(torch_native_logprob, logits, targets, contract)
        for rank, report in enumerate(reports):
            selected, lse = report["results"][seed]
            expected = emulated[rank]
            where = f"case {seed} ({contract.describe()}) rank {rank}"
            assert selected.dtype == expected.selected_logp.dtype, where
            assert _same_bits(selected, expected.selected_logp), f"{where}: selected_logp"
            assert (lse is None) == (expected.lse is None), where
            assert lse is None or _same_bits(lse, expected.lse), f"{where}: lse"


def check_preflight_names_the_rank_with_another_backend(
    world: int, reports: list[dict[str, Any]]
) -> None:
    others = [rank for rank in range(world) if rank != 1]
    for rank, report in enumerate(reports):
        message = report["preflight"]
        assert f"seen by rank {rank} of {world}" in message
        assert f"'torch_native' on ranks {others}; 'triton_online' on ranks [1]" in message


def check_missing_peer_times_out_within_the_timeout(
    world: int, reports: list[dict[str, Any]]
) -> None:
    for rank, report in enumerate(reports[:-1]):
        hang = report["hang"]
        assert hang["error"] == "CollectiveTimeoutError", f"rank {rank}: {hang}"
        assert f"rank {rank} of {world}" in hang["message"]
        assert HANG_TIMEOUT * 0.9 <= hang["elapsed"] <= HANG_TIMEOUT + 2.0, hang


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    ints = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return a.shape == b.shape and torch.equal(a.view(ints), b.view(ints))
