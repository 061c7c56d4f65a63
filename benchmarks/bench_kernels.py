"""Forward time of the logprob backends at TP=1, against a device-to-device copy.

On a GPU: bf16 logits, N in {1024, 8192, 32768} rows, V in {32000, 152064} columns.
Each candidate is timed with ``triton.testing.do_bench`` (median of its repeats):

- ``triton_online`` and ``triton_exact_sum``: the public op, input checks included;
  ``(kernels)`` rows time the same forward after the checks (what the op costs
  without ``check_op_inputs``, whose active-target range check syncs the host);
- ``torch_native``: the PyTorch backend;
- ``torch baseline``: ``torch.log_softmax(x.float(), -1).gather(...)``;
- ``liger cross_entropy`` (when Liger-Kernel is installed): its fused cross entropy
  with ``reduction="none"`` (the negated logprob; it also writes the gradient into
  its input, so it runs on its own copy of the logits);
- ``+entropy`` and ``T=0.7`` rows: the same op with ``export_entropy=True`` or
  ``temperature=0.7``, to measure what entropy and temperature cost.

Achieved bandwidth counts the logits' bytes read once (``N * V * 2``) over the time,
and is reported as a fraction of the copy bandwidth measured in the same run:
``y.copy_(x)`` moves ``2 * N * V * 2`` bytes (read + write) in its time. Shapes or
candidates that do not fit in free device memory are skipped with a note.

Each Triton row also shows measured / predicted time: the roofline of
``tools.gpu_readiness.traffic`` (bytes per row over the device's peak HBM
bandwidth when the device is an H100, H200 or MI300X, else over the copy
bandwidth measured here).

Goals (GPU): at N=8192, V=152064, triton_online >= 80% of copy bandwidth and >= 2x
faster than the torch baseline; triton_exact_sum within 2x of triton_online's time;
entropy adds at most 15% to triton_online's forward time.

On CPU it runs one tiny shape once through the Triton interpreter, to check that
the script works, and says that it measures nothing.

Run: python benchmarks/bench_kernels.py [--rows 8192] [--vocab 152064] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import triton.testing

import tp_logprob as tpl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools, from a checkout
from tools.gpu_readiness.traffic import PEAK_BANDWIDTH, Shape, predicted_seconds

from tp_logprob.kernels.native import torch_native_logprob
from tp_logprob.kernels.triton.exact_sum import (
    exact_sum_forward,
    triton_exact_sum_logprob,
)
from tp_logprob.kernels.triton.inputs import prepare
from tp_logprob.kernels.triton.online import online_forward, triton_online_logprob
from tp_logprob.kernels.validation import check_op_inputs

ROWS = (1024, 8192, 32768)
VOCABS = (32000, 152064)
GOAL_SHAPE = (8192, 152064)


def contract_for(
    rows: int, vocab: int, *, temperature: float = 1.0, entropy: bool = False
) -> tpl.LogprobContract:
    return tpl.LogprobContract(
        role=tpl.LogprobRole.INFER,
        dtype=tpl.LogprobDType.BF16,
        mask=tpl.MaskSpec(rows),
        sharding=tpl.ShardingSpec(0, 1, ((0, vocab),), vocab, vocab),
        reduction=tpl.ReductionSpec(tpl.DeterminismScope.FIXED_TOPOLOGY),
        temperature=temperature,
        export_entropy=entropy,
    )


def candidates(
    logits: torch.Tensor, targets: torch.Tensor, contract: tpl.LogprobContract
) -> dict[str, Callable[[], Any]]:
    active = check_op_inputs(logits, targets, contract)
    inputs = prepare(logits, targets, active, contract)
    rows, vocab = logits.shape
    hot = contract_for(rows, vocab, temperature=0.7)
    entropy = contract_for(rows, vocab, entropy=True)
    return {
        "triton_online": lambda: triton_online_logprob(logits, targets, contract),
        "triton_online +entropy": lambda: triton_online_logprob(logits, targets, entropy),
        "triton_online T=0.7": lambda: triton_online_logprob(logits, targets, hot),
        "triton_exact_sum +entropy": lambda: triton_exact_sum_logprob(logits, targets, entropy),
        "torch_native +entropy": lambda: torch_native_logprob(logits, targets, entropy),
        "triton_online (kernels)": lambda: online_forward(inputs, contract, None),
        "triton_exact_sum": lambda: triton_exact_sum_logprob(logits, targets, contract),
        "triton_exact_sum (kernels)": lambda: exact_sum_forward(inputs, contract, None),
        "torch_native": lambda: torch_native_logprob(logits, targets, contract),
        "torch baseline": lambda: torch.log_softmax(logits.float(), dim=-1).gather(
            1, targets.unsqueeze(1)
        ),
    }


def liger_candidate(logits: torch.Tensor, targets: torch.Tensor) -> Callable[[], Any] | None:
    """Liger-Kernel's cross entropy (``reduction="none"``) on its own copy, or None."""
    if importlib.util.find_spec("liger_kernel") is None:
        return None
    from liger_kernel.transformers.cross_entropy import LigerCrossEntropyLoss

    loss = LigerCrossEntropyLoss(reduction="none")
    own = logits.clone()  # Liger writes the gradient into its input
    return lambda: loss(own, targets)


def peak_bandwidth() -> tuple[str, float] | None:
    """``(name, bytes/s)`` of this device's peak HBM bandwidth when it is a known one."""
    device = torch.cuda.get_device_name().replace(" ", "")
    for name, bandwidth in PEAK_BANDWIDTH.items():
        if name in device:
            return name, bandwidth
    return None


def predicted_ms(name: str, rows: int, vocab: int, bandwidth: float) -> float | None:
    """Roofline ms of a Triton candidate (``triton_online``, ``... (kernels)``), else None."""
    backend = name.split(" ")[0]
    if not backend.startswith("triton_"):
        return None
    return predicted_seconds(backend, Shape(rows=rows, vocab=vocab, itemsize=2), bandwidth) * 1e3


def time_copy(logits: torch.Tensor) -> float:
    """Median ms of a device-to-device copy of ``logits`` (the bandwidth yardstick)."""
    target = torch.empty_like(logits)
    return float(triton.testing.do_bench(lambda: target.copy_(logits), return_mode="median"))


def bench_shape(rows: int, vocab: int) -> dict[str, Any] | None:
    """Copy bandwidth and median ms per candidate for one shape, or None if it does not fit."""
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
    peak = peak_bandwidth()
    roofline = peak[1] if peak else copy_bandwidth
    copy_name = "copy (read + write)"
    print(f"{rows:>6} {vocab:>7}  {copy_name:<27} {copy_ms:8.3f} {copy_bandwidth / 1e9:7.0f}")
    runs = candidates(logits, targets, contract_for(rows, vocab))
    if 3.3 * nbytes < free:
        liger = liger_candidate(logits, targets)
        if liger is not None:
            runs["liger cross_entropy"] = liger
    times: dict[str, float] = {}
    for name, run in runs.items():
        try:
            times[name] = triton.testing.do_bench(run, return_mode="median")
        except torch.cuda.OutOfMemoryError:
            print(f"{rows:>6} {vocab:>7}  {name:<27} skipped: out of device memory")
            torch.cuda.empty_cache()
    baseline = times.get("torch baseline", float("nan"))
    results: dict[str, dict[str, float | None]] = {}
    for name, ms in times.items():
        bandwidth = nbytes / (ms * 1e-3)
        predicted = predicted_ms(name, rows, vocab, roofline)
        ratio = "" if predicted is None else f"{ms / predicted:9.2f}"
        print(
            f"{rows:>6} {vocab:>7}  {name:<27} {ms:8.3f} {bandwidth / 1e9:7.0f} "
            f"{bandwidth / copy_bandwidth:8.1%} {baseline / ms:7.2f}x{ratio}"
        )
        results[name] = {
            "ms": ms,
            "gbps": bandwidth / 1e9,
            "of_copy": bandwidth / copy_bandwidth,
            "speedup_vs_torch_baseline": baseline / ms,
            "predicted_ms": predicted,
            "measured_over_predicted": None if predicted is None else ms / predicted,
        }
    return {
        "rows": rows,
        "vocab": vocab,
        "copy_ms": copy_ms,
        "copy_gbps": copy_bandwidth / 1e9,
        "roofline": peak[0] if peak else "measured copy bandwidth",
        "candidates": results,
    }


def bench_gpu(rows_list: tuple[int, ...], vocabs: tuple[int, ...]) -> dict[str, Any]:
    peak = peak_bandwidth()
    roofline = f"{peak[0]} peak {peak[1] / 1e12:.2f} TB/s" if peak else "measured copy bandwidth"
    print(f"device: {torch.cuda.get_device_name()}; bf16 logits, TP=1, do_bench median")
    print(f"meas/pred: measured ms over the roofline's (traffic.py bytes at {roofline})")
    print(
        f"{'N':>6} {'V':>7}  {'candidate':<27} {'ms':>8} {'GB/s':>7} {'of copy':>8} "
        f"{'vs torch':>8} {'meas/pred':>9}"
    )
    shapes = []
    for vocab in vocabs:
        for rows in rows_list:
            measured = bench_shape(rows, vocab)
            torch.cuda.empty_cache()
            if measured is not None:
                shapes.append(measured)
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "measured": True,
        "roofline": roofline,
        "shapes": shapes,
        "goals": None,
    }
    goal = next((m for m in shapes if (m["rows"], m["vocab"]) == GOAL_SHAPE), None)
    if goal is None:
        return report
    times = {name: item["ms"] for name, item in goal["candidates"].items()}
    online = times.get("triton_online", float("nan"))
    fraction = GOAL_SHAPE[0] * GOAL_SHAPE[1] * 2 / (online * 1e-3) / (goal["copy_gbps"] * 1e9)
    speedup = times.get("torch baseline", float("nan")) / online
    slowdown = times.get("triton_exact_sum", float("nan")) / online
    entropy_cost = times.get("triton_online +entropy", float("nan")) / online - 1.0
    print(f"\ngoals at N={GOAL_SHAPE[0]}, V={GOAL_SHAPE[1]}:")
    print(f"  triton_online {fraction:.1%} of copy bandwidth (goal >= 80%)")
    print(f"  triton_online {speedup:.2f}x the torch baseline (goal >= 2x)")
    print(f"  triton_exact_sum {slowdown:.2f}x triton_online's time (goal <= 2x)")
    print(f"  entropy adds {entropy_cost:.1%} to triton_online (goal <= 15%)")
    report["goals"] = {
        "online_fraction_of_copy": {"value": fraction, "goal": ">= 0.8", "met": fraction >= 0.8},
        "online_speedup_vs_torch": {"value": speedup, "goal": ">= 2", "met": speedup >= 2},
        "exact_sum_over_online": {"value": slowdown, "goal": "<= 2", "met": slowdown <= 2},
        "entropy_cost_online": {
            "value": entropy_cost,
            "goal": "<= 0.15",
            "met": entropy_cost <= 0.15,
        },
    }
    return report


def check_cpu() -> dict[str, Any]:
    print("no GPU: running one tiny shape through the Triton interpreter.")
    print("THIS MEASURES NOTHING: interpreter timings say nothing about GPU kernels.")
    rows, vocab = 4, 64
    logits = (torch.randn(rows, vocab) * 4).to(torch.bfloat16)
    targets = torch.randint(0, vocab, (rows,))
    contract = contract_for(rows, vocab)
    ran = {}
    for name, run in candidates(logits, targets, contract).items():
        start = time.perf_counter()
        result = run()
        elapsed = time.perf_counter() - start
        selected = result[0] if isinstance(result, tuple) else result
        first = float(selected.reshape(-1)[0])
        ran[name] = {"first_value": first}
        print(f"  {name:<27} ran once in {elapsed * 1e3:7.1f} ms; first value {first:+.4f}")
    return {"device": "cpu (Triton interpreter)", "measured": False, "ran": ran}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    parser.add_argument("--vocab", type=int, nargs="+", default=list(VOCABS))
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args()
    if torch.cuda.is_available():
        report = bench_gpu(tuple(args.rows), tuple(args.vocab))
    else:
        report = check_cpu()
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)
            out.write("\n")


if __name__ == "__main__":
    main()
