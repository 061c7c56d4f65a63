"""Peak memory and time of the fused LM head against the logits path it replaces (TP=1).

Candidates, on one shard holding the whole (padded) vocabulary, in the contract dtype:

- ``torch_native_fused``: hidden states and weight in, logprobs out, in row chunks;
- ``triton_fused``: the same op in Triton, when ``tp_logprob.kernels.triton.fused``
  imports and a GPU is present (on CPU it would run interpreted: skipped, with a note);
- ``logits path``: ``logits = hidden @ W.T`` materialized in the contract dtype, then
  ``torch_native_logprob``;
- ``matmul``: the bare ``hidden @ W.T`` (train: with ``.sum().backward()``), the work
  the fused op replaces; a time yardstick only.

Role ``infer`` times the forward; role ``train`` the forward and the backward of
``selected_logp.float().sum()`` into ``hidden`` and ``W`` (both paths allocate the
same two gradients).

Memory: each candidate runs once under ``track_allocations``
(``tp_logprob/suite/allocations.py``): ``peak`` is the most bytes of aten op
outputs alive at once during the call, inputs excluded; it does not see
temporaries inside a kernel (BLAS workspaces, Triton scratch) nor allocator
caching. On CUDA the table adds ``torch.cuda.max_memory_allocated()`` after
``reset_peak_memory_stats``, less what was allocated before the call.
Time: median of ``--reps`` runs after one warm-up, the candidates interleaved
within each rep (a slow phase of a shared machine hits every candidate alike).

Targets: fused peak <= 1/8 of the logits path's; fused time <= logits path time
+ matmul time (the fused op may spend at most the matmul it saves again).

Default (CPU): N=2048, H=64, V=4099 padded to 4224, bf16, 5 reps. ``--gpu-shapes``:
N in {4096, 32768}, H=4096, V=152064, bf16. A shape whose logits path cannot fit
in free device memory is skipped with a note; ``--budget-s`` skips shapes whose
duration, extrapolated from the previous shape of the role, would overrun it.

Measured tables, with their machine and command: docs/fused-memory.md.

Run: python benchmarks/bench_fused.py [--gpu-shapes] [--rows 2048] [--hidden 64]
     [--vocab 4099] [--roles infer train] [--reps 5] [--budget-s S] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import tp_logprob as tpl
from tp_logprob.kernels.dtypes import TORCH_DTYPES
from tp_logprob.kernels.native import torch_native_logprob
from tp_logprob.kernels.native_fused import torch_native_fused_logprob
from tp_logprob.suite.allocations import track_allocations

GPU_ROWS, GPU_HIDDEN, GPU_VOCAB = (4096, 32768), 4096, 152064
DTYPES = ("bf16", "fp16", "fp32")
MEMORY_TARGET = 1 / 8
FUSED = ("torch_native_fused", "triton_fused")
MiB = 2**20


def triton_fused() -> tuple[Callable[..., Any] | None, str]:
    """The Triton fused op and "", or None and why it is left out."""
    if not torch.cuda.is_available():
        return None, "triton_fused: GPU only (interpreted on CPU it would measure nothing)"
    try:
        module = importlib.import_module("tp_logprob.kernels.triton.fused")
    except Exception as error:  # an absent or half-written backend must not stop the bench
        return None, f"triton_fused: not importable ({type(error).__name__}: {error})"
    return module.triton_fused_logprob, ""


def contracts(
    rows: int, hidden: int, vocab: int, padded: int, dtype: str, role: str
) -> tuple[tpl.LogprobContract, tpl.LogprobContract]:
    """(hidden-state contract, logits contract) for one TP=1 shard of ``padded`` columns."""
    common: dict[str, Any] = {
        "role": role,
        "dtype": dtype,
        "mask": tpl.MaskSpec(rows),
        "sharding": tpl.ShardingSpec(0, 1, ((0, padded),), vocab, padded),
        "reduction": tpl.ReductionSpec("fixed_topology"),
    }
    fused = tpl.LogprobContract(**common, input_kind="hidden", hidden_size=hidden)
    return fused, tpl.LogprobContract(**common)


def candidates(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    contract: tpl.LogprobContract,
    plain: tpl.LogprobContract,
    triton_op: Callable[..., Any] | None,
) -> dict[str, Callable[[], Any]]:
    """One zero-argument call per candidate; train calls run the backward too."""
    train = contract.role is tpl.LogprobRole.TRAIN

    def finish(selected: torch.Tensor) -> Any:
        if not train:
            return selected
        selected.float().sum().backward()
        hidden.grad = weight.grad = None
        return None

    def fused(op: Callable[..., Any]) -> Callable[[], Any]:
        return lambda: finish(op(hidden, targets, contract, weight=weight).selected_logp)

    def logits_path() -> Any:
        logits = hidden @ weight.T
        return finish(torch_native_logprob(logits, targets, plain).selected_logp)

    def matmul() -> Any:
        logits = hidden @ weight.T
        if not train:
            return logits
        logits.sum().backward()
        hidden.grad = weight.grad = None
        return None

    runs = {"torch_native_fused": fused(torch_native_fused_logprob)}
    if triton_op is not None:
        runs["triton_fused"] = fused(triton_op)
    runs["logits path"] = logits_path
    runs["matmul"] = matmul
    return runs


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def measure_memory(run: Callable[[], Any]) -> dict[str, Any]:
    """One call under the tracker (and CUDA's peak statistic): peak bytes, largest tensor."""
    cuda = torch.cuda.is_available()
    if cuda:
        synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    with track_allocations() as seen:
        result = run()
        synchronize()
    del result
    largest = seen.largest
    return {
        "peak_bytes": seen.peak_live_bytes,
        "cuda_peak_bytes": torch.cuda.max_memory_allocated() - before if cuda else None,
        "largest": None
        if largest is None
        else {"shape": list(largest.shape), "dtype": str(largest.dtype), "bytes": largest.nbytes},
    }


def time_interleaved(runs: dict[str, Callable[[], Any]], reps: int) -> dict[str, list[float]]:
    """ms of every call, per candidate: ``reps`` rounds, each running every candidate once."""
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(reps):
        for name, run in runs.items():
            synchronize()
            start = time.perf_counter()
            run()
            synchronize()
            samples[name].append((time.perf_counter() - start) * 1e3)
    return samples


def logits_path_lower_bound(rows: int, padded: int, itemsize: int, role: str) -> int:
    """Bytes the logits path needs at least: its logits and their fp32 copy (train: + grads)."""
    per_element = itemsize + 4 if role == "infer" else 2 * (itemsize + 4)
    return rows * padded * per_element


def bench_shape(
    rows: int,
    hidden_size: int,
    vocab: int,
    padded: int,
    dtype: str,
    role: str,
    reps: int,
    triton_op: Callable[..., Any] | None,
) -> dict[str, Any]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch_dtype = TORCH_DTYPES[dtype]
    shape = {"rows": rows, "hidden": hidden_size, "vocab": vocab, "padded": padded, "role": role}
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        need = logits_path_lower_bound(rows, padded, torch_dtype.itemsize, role)
        if 1.1 * need > free:
            gib = f"{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
            return {**shape, "skipped": f"skipped: the logits path needs over {gib}"}
    gen = torch.Generator(device).manual_seed(0)
    hidden = torch.randn(rows, hidden_size, generator=gen, device=device).to(torch_dtype)
    weight = (torch.randn(padded, hidden_size, generator=gen, device=device) * 0.05).to(torch_dtype)
    targets = torch.randint(0, vocab, (rows,), generator=gen, device=device)
    if role == "train":
        hidden.requires_grad_(True)
        weight.requires_grad_(True)
    contract, plain = contracts(rows, hidden_size, vocab, padded, dtype, role)
    runs = candidates(hidden, weight, targets, contract, plain, triton_op)
    memory: dict[str, Any] = {}
    notes: list[str] = []
    for name, run in list(runs.items()):
        try:
            run()  # warm-up
            memory[name] = measure_memory(run)
        except torch.cuda.OutOfMemoryError:
            notes.append(f"{name}: skipped, out of device memory")
            del runs[name]
            hidden.grad = weight.grad = None
            torch.cuda.empty_cache()
    samples = time_interleaved(runs, reps)
    times = {name: statistics.median(values) for name, values in samples.items()}
    return {
        **shape,
        "candidates": {
            name: {
                **memory[name],
                "ms": times[name],
                "min_ms": min(samples[name]),
                "max_ms": max(samples[name]),
            }
            for name in runs
        },
        "notes": notes,
        "targets": targets_of(runs.keys(), memory, times),
    }


def targets_of(
    names: Any, memory: dict[str, Any], times: dict[str, float]
) -> dict[str, dict[str, Any]]:
    """Per fused candidate: peak over the logits path's, and time against logits path + matmul."""
    if "logits path" not in times or "matmul" not in times:
        return {}
    out = {}
    allowed = times["logits path"] + times["matmul"]
    for name in (n for n in names if n in FUSED):
        ratio = memory[name]["peak_bytes"] / memory["logits path"]["peak_bytes"]
        out[name] = {
            "peak_ratio": ratio,
            "peak_met": ratio <= MEMORY_TARGET,
            "ms": times[name],
            "allowed_ms": allowed,
            "time_met": times[name] <= allowed,
        }
    return out


def print_table(results: list[dict[str, Any]], cuda: bool) -> None:
    cuda_head = " CUDA peak MiB |" if cuda else ""
    print(
        f"| N | H | V (padded) | role | candidate | peak MiB |{cuda_head} of logits path "
        "| largest tensor | median ms (min-max) |"
    )
    print("|---:|---:|---:|---|---|---:|" + ("---:|" if cuda else "") + "---:|---|---:|")
    for shape in results:
        lead = (
            f"| {shape['rows']} | {shape['hidden']} | {shape['vocab']} ({shape['padded']}) "
            f"| {shape['role']} |"
        )
        if "skipped" in shape:
            print(f"{lead} {shape['skipped']} |")
            continue
        reference = shape["candidates"].get("logits path", {}).get("peak_bytes")
        for name, item in shape["candidates"].items():
            cuda_cell = f" {item['cuda_peak_bytes'] / MiB:.1f} |" if cuda else ""
            ratio = "" if not reference else f"{item['peak_bytes'] / reference:.3f}"
            big = item["largest"]
            big_text = "" if big is None else f"{big['dtype'][6:]} {big['shape']}"
            print(
                f"{lead} {name} | {item['peak_bytes'] / MiB:.1f} |{cuda_cell} {ratio} "
                f"| {big_text} | {item['ms']:.1f} ({item['min_ms']:.1f}-{item['max_ms']:.1f}) |"
            )
    print()
    for shape in results:
        for name, goal in shape.get("targets", {}).items():
            print(
                f"- N={shape['rows']} {shape['role']} {name}: peak {goal['peak_ratio']:.3f} of the "
                f"logits path (target <= {MEMORY_TARGET:.3f}): "
                f"{'met' if goal['peak_met'] else 'NOT MET'}; {goal['ms']:.2f} ms vs logits path "
                f"+ matmul {goal['allowed_ms']:.2f} ms: {'met' if goal['time_met'] else 'NOT MET'}"
            )
        for note in shape.get("notes", []):
            print(f"- N={shape['rows']} {shape['role']}: {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu-shapes", action="store_true", help="N 4096 32768, H 4096, V 152064")
    parser.add_argument("--rows", type=int, nargs="+", default=[2048])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=4099)
    parser.add_argument("--pad-to", type=int, default=128, help="pad V to a multiple of this")
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    parser.add_argument(
        "--roles", nargs="+", choices=["infer", "train"], default=["infer", "train"]
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--budget-s", type=float, help="skip shapes that would overrun this")
    parser.add_argument("--json", help="also write the results to this JSON file (per shape)")
    args = parser.parse_args()
    rows_list = list(GPU_ROWS) if args.gpu_shapes else args.rows
    hidden_size = GPU_HIDDEN if args.gpu_shapes else args.hidden
    vocab = GPU_VOCAB if args.gpu_shapes else args.vocab
    padded = -(-vocab // args.pad_to) * args.pad_to
    cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if cuda else f"cpu ({torch.get_num_threads()} threads)"
    triton_op, triton_note = triton_fused()
    print(f"device: {device}; {args.dtype}, TP=1, median of {args.reps} interleaved reps")
    if triton_note:
        print(triton_note)
    report: dict[str, Any] = {"device": device, "dtype": args.dtype, "reps": args.reps}
    report["shapes"] = results = []
    started = time.perf_counter()
    seconds_per_row: dict[str, float] = {}
    for rows in sorted(rows_list):
        for role in args.roles:
            estimate = seconds_per_row.get(role, 0.0) * rows
            spent = time.perf_counter() - started
            left = None if args.budget_s is None else args.budget_s - spent
            if left is not None and (left <= 0 or estimate > left):
                over = f"estimated {estimate:.0f} s, {max(left, 0):.0f} s of --budget-s left"
                if role not in seconds_per_row:
                    over = f"--budget-s {args.budget_s:.0f} spent"
                shape = {"rows": rows, "hidden": hidden_size, "vocab": vocab, "padded": padded}
                results.append({**shape, "role": role, "skipped": f"skipped: {over}"})
            else:
                shape_start = time.perf_counter()
                measured = bench_shape(
                    rows, hidden_size, vocab, padded, args.dtype, role, args.reps, triton_op
                )
                results.append(measured)
                seconds_per_row[role] = (time.perf_counter() - shape_start) / rows
                if cuda:
                    torch.cuda.empty_cache()
            if args.json:  # after every shape: a timeout still leaves what was measured
                with open(args.json, "w") as out:
                    json.dump(report, out, indent=1)
                    out.write("\n")
    print_table(results, cuda)


if __name__ == "__main__":
    main()
