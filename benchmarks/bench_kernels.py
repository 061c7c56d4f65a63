"""Forward time of the logprob backends at TP=1, against a device-to-device copy.

On a GPU: bf16 logits, N in {1024, 8192, 32768} rows, V in {32000, 152064} columns.
Each candidate is timed with ``triton.testing.do_bench`` (median of its repeats):

- ``triton_online`` and ``triton_exact_sum``: the public op, input checks included;
  ``(kernels)`` rows time the same forward after the checks (what the op costs
  without ``check_op_inputs``, whose active-target range check syncs the host);
- ``torch_native``: the PyTorch backend;
- ``torch baseline``: ``torch.log_softmax(x.float(), -1).gather(...)``.

Achieved bandwidth counts the logits' bytes read once (``N * V * 2``) over the time,
and is reported as a fraction of the copy bandwidth measured in the same run:
``y.copy_(x)`` moves ``2 * N * V * 2`` bytes (read + write) in its time. Shapes or
candidates that do not fit in free device memory are skipped with a note.

Goals (GPU): at N=8192, V=152064, triton_online >= 80% of copy bandwidth and >= 2x
faster than the torch baseline; triton_exact_sum within 2x of triton_online's time.

On CPU it runs one tiny shape once through the Triton interpreter, to check that
the script works, and says that it measures nothing.

Run: python benchmarks/bench_kernels.py [--rows 8192] [--vocab 152064]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import triton.testing

import tp_logprob as tpl
from tp_logprob.kernels.checks import check_op_inputs
from tp_logprob.kernels.native import torch_native_logprob
from tp_logprob.kernels.triton.exact_sum import (
    exact_sum_forward,
    triton_exact_sum_logprob,
)
from tp_logprob.kernels.triton.inputs import prepare
from tp_logprob.kernels.triton.online import online_forward, triton_online_logprob

ROWS = (1024, 8192, 32768)
VOCABS = (32000, 152064)
GOAL_SHAPE = (8192, 152064)


def contract_for(rows: int, vocab: int) -> tpl.LogprobContract:
    return tpl.LogprobContract(
        role=tpl.LogprobRole.INFER,
        dtype=tpl.LogprobDType.BF16,
        mask=tpl.MaskSpec(rows),
        sharding=tpl.ShardingSpec(0, 1, ((0, vocab),), vocab, vocab),
        reduction=tpl.ReductionSpec(tpl.DeterminismScope.FIXED_TOPOLOGY),
    )


def candidates(
    logits: torch.Tensor, targets: torch.Tensor, contract: tpl.LogprobContract
) -> dict[str, Callable[[], Any]]:
    active = check_op_inputs(logits, targets, contract)
    inputs = prepare(logits, targets, active, contract)
    return {
        "triton_online": lambda: triton_online_logprob(logits, targets, contract),
        "triton_online (kernels)": lambda: online_forward(inputs, contract, None),
        "triton_exact_sum": lambda: triton_exact_sum_logprob(logits, targets, contract),
        "triton_exact_sum (kernels)": lambda: exact_sum_forward(inputs, contract, None),
        "torch_native": lambda: torch_native_logprob(logits, targets, contract),
        "torch baseline": lambda: torch.log_softmax(logits.float(), dim=-1).gather(
            1, targets.unsqueeze(1)
        ),
    }


def time_copy(logits: torch.Tensor) -> float:
    """Median ms of a device-to-device copy of ``logits`` (the bandwidth yardstick)."""
    target = torch.empty_like(logits)
    return float(triton.testing.do_bench(lambda: target.copy_(logits), return_mode="median"))


def bench_shape(rows: int, vocab: int) -> tuple[float, dict[str, float]] | None:
    """``(copy bandwidth, median ms per candidate)`` for one shape, or None if it does not fit."""
    device = torch.device("cuda")
    nbytes = rows * vocab * 2
    free, _ = torch.cuda.mem_get_info(device)
    if 2.2 * nbytes > free:
        print(f"{rows:>6} {vocab:>7}  skipped: logits + copy need {2 * nbytes / 2**30:.1f} GiB")
        return None
    logits = torch.randn(rows, vocab, device=device, dtype=torch.bfloat16).mul_(4)
    targets = torch.randint(0, vocab, (rows,), device=device)
    copy_ms = time_copy(logits)
    copy_bandwidth = 2 * nbytes / (copy_ms * 1e-3)
    copy_name = "copy (read + write)"
    print(f"{rows:>6} {vocab:>7}  {copy_name:<27} {copy_ms:8.3f} {copy_bandwidth / 1e9:7.0f}")
    times: dict[str, float] = {}
    for name, run in candidates(logits, targets, contract_for(rows, vocab)).items():
        try:
            times[name] = triton.testing.do_bench(run, return_mode="median")
        except torch.cuda.OutOfMemoryError:
            print(f"{rows:>6} {vocab:>7}  {name:<27} skipped: out of device memory")
            torch.cuda.empty_cache()
    baseline = times.get("torch baseline", float("nan"))
    for name, ms in times.items():
        bandwidth = nbytes / (ms * 1e-3)
        print(
            f"{rows:>6} {vocab:>7}  {name:<27} {ms:8.3f} {bandwidth / 1e9:7.0f} "
            f"{bandwidth / copy_bandwidth:8.1%} {baseline / ms:7.2f}x"
        )
    return copy_bandwidth, times


def bench_gpu(rows_list: tuple[int, ...], vocabs: tuple[int, ...]) -> None:
    print(f"device: {torch.cuda.get_device_name()}; bf16 logits, TP=1, do_bench median")
    print(
        f"{'N':>6} {'V':>7}  {'candidate':<27} {'ms':>8} {'GB/s':>7} {'of copy':>8} {'vs torch':>8}"
    )
    goal = None
    for vocab in vocabs:
        for rows in rows_list:
            measured = bench_shape(rows, vocab)
            torch.cuda.empty_cache()
            if measured is not None and (rows, vocab) == GOAL_SHAPE:
                goal = measured
    if goal is None:
        return
    copy_bandwidth, times = goal
    online = times.get("triton_online", float("nan"))
    fraction = GOAL_SHAPE[0] * GOAL_SHAPE[1] * 2 / (online * 1e-3) / copy_bandwidth
    print(f"\ngoals at N={GOAL_SHAPE[0]}, V={GOAL_SHAPE[1]}:")
    print(f"  triton_online {fraction:.1%} of copy bandwidth (goal >= 80%)")
    speedup = times.get("torch baseline", float("nan")) / online
    print(f"  triton_online {speedup:.2f}x the torch baseline (goal >= 2x)")
    slowdown = times.get("triton_exact_sum", float("nan")) / online
    print(f"  triton_exact_sum {slowdown:.2f}x triton_online's time (goal <= 2x)")


def check_cpu() -> None:
    print("no GPU: running one tiny shape through the Triton interpreter.")
    print("THIS MEASURES NOTHING: interpreter timings say nothing about GPU kernels.")
    rows, vocab = 4, 64
    logits = (torch.randn(rows, vocab) * 4).to(torch.bfloat16)
    targets = torch.randint(0, vocab, (rows,))
    contract = contract_for(rows, vocab)
    for name, run in candidates(logits, targets, contract).items():
        start = time.perf_counter()
        result = run()
        elapsed = time.perf_counter() - start
        selected = result[0] if isinstance(result, tuple) else result
        print(
            f"  {name:<27} ran once in {elapsed * 1e3:7.1f} ms; first value "
            f"{float(selected.reshape(-1)[0]):+.4f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    parser.add_argument("--vocab", type=int, nargs="+", default=list(VOCABS))
    args = parser.parse_args()
    if torch.cuda.is_available():
        bench_gpu(tuple(args.rows), tuple(args.vocab))
    else:
        check_cpu()


if __name__ == "__main__":
    main()
