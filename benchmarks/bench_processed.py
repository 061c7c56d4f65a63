"""What a sampling support costs over the raw logprob, per backend (TP=1).

One shape per backend (fp32 on CPU, bf16 on a GPU), one op call per candidate, each timed
``--repeats`` times in one loop that runs the candidates in a new random order each
round (so drift and allocator state hit every candidate alike);
the table gives each candidate's median ms and its ratio to the raw op's median:

- ``raw``: the op without a support;
- ``all rules off``: ``top_p=1`` (the support machinery with nothing to select:
  the row statistics' all-gather, then the raw partial);
- ``min_p``, ``top_k``, ``top_p`` and ``vLLM-like`` (``min_p=0.05, top_k=50,
  top_p=0.9``): the support recomputed by the vocab-parallel threshold
  (``kernels/support_threshold.py``: candidates, and the radix select for the rows
  whose top-p nucleus outgrows them);
- ``replayed``: the ``vLLM-like`` support given as kept ids (CSR), the engine's
  returned mask; built into a device mask (torch) or packed bits (Triton) per call.

Backends (``--backends``): ``torch_native``, ``triton_online``, ``triton_exact_sum`` on
``[rows, vocab]`` logits; ``torch_native_fused``, ``triton_fused`` and
``triton_fused_exact_sum`` on ``[rows, hidden]`` hidden states and a ``[vocab, hidden]``
weight (``--hidden``). The Triton backends time their real kernels on a GPU only: on
CPU they run in the Triton interpreter, which measures nothing about speed (the
script says so and runs them only when asked with ``--interpreted``).

``--role train`` times forward and backward (``selected_logp.sum().backward()``).
The logits are ``4 * randn`` (the fused backends scale hidden states and weight so
their logits are too): min-p 0.05 keeps about 14 tokens, top-p 0.9 a median of
about 200 and at most about 500 of 32000 (so some rows take the radix select).

``--gpu-shapes`` (a GPU session, ``benchmarks/gpu_check.sh``): every backend, the logits
ones at 8192 x 152064 (bf16) and the fused ones at 1024 rows x 4096 hidden x 152064
(torch_native_fused forms each row's logits by its own matrix-vector product, seconds
a pass at this size), infer and train. ``--json PATH`` writes every table.

Run: python benchmarks/bench_processed.py [--backends torch_native ...] [--rows 256]
     [--vocab 32000] [--hidden 64] [--repeats 7] [--role infer|train] [--gpu-shapes]
     [--device cpu|cuda] [--threads N] [--interpreted] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import tp_logprob as tpl
from tp_logprob.kernels.native import torch_native_logprob
from tp_logprob.kernels.rowwise import float64_matmul

VLLM_LIKE = {"min_p": 0.05, "top_k": 50, "top_p": 0.9}
OPS = {
    "torch_native": ("tp_logprob.kernels.native", "torch_native_logprob"),
    "triton_online": ("tp_logprob.kernels.triton.online", "triton_online_logprob"),
    "triton_exact_sum": ("tp_logprob.kernels.triton.exact_sum", "triton_exact_sum_logprob"),
    "torch_native_fused": ("tp_logprob.kernels.native_fused", "torch_native_fused_logprob"),
    "triton_fused": ("tp_logprob.kernels.triton.fused", "triton_fused_logprob"),
    "triton_fused_exact_sum": (
        "tp_logprob.kernels.triton.fused_exact_sum",
        "triton_fused_exact_sum_logprob",
    ),
}
FUSED = ("torch_native_fused", "triton_fused", "triton_fused_exact_sum")
GPU_LOGITS = (8192, 152064)
GPU_FUSED = (1024, 4096, 152064)


@dataclass(frozen=True)
class Shape:
    rows: int
    vocab: int
    hidden: int
    role: str


def contract_for(
    shape: Shape, dtype: str, backend: str, support: tpl.SupportSpec | None
) -> tpl.LogprobContract:
    fused = backend in FUSED
    return tpl.LogprobContract(
        role=shape.role,
        dtype=dtype,
        mask=tpl.MaskSpec(shape.rows),
        sharding=tpl.ShardingSpec(0, 1, ((0, shape.vocab),), shape.vocab, shape.vocab),
        reduction=tpl.ReductionSpec("fixed_topology"),
        support=support,
        input_kind="hidden" if fused else "logits",
        hidden_size=shape.hidden if fused else None,
    )


def inputs_for(
    shape: Shape, dtype: torch.dtype, device: torch.device, fused: bool
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The op's tensors, and the fp32 logits they stand for (to build the replayed mask)."""
    gen = torch.Generator(device=device).manual_seed(0)
    if not fused:
        logits = torch.randn(shape.rows, shape.vocab, generator=gen, device=device) * 4
        logits = logits.to(dtype)
        return {"logits": logits}, logits.float()
    scale = (4 / shape.hidden**0.5) ** 0.5  # logits of about 4 randn
    hidden = torch.randn(shape.rows, shape.hidden, generator=gen, device=device) * scale
    weight = torch.randn(shape.vocab, shape.hidden, generator=gen, device=device) * scale
    hidden, weight = hidden.to(dtype), weight.to(dtype)
    return {"hidden": hidden, "weight": weight}, float64_matmul(hidden, weight.T)


def candidates(
    backend: str, shape: Shape, dtype: str, device: torch.device
) -> dict[str, Callable[[], Any]]:
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    fused = backend in FUSED
    tensors, logits = inputs_for(shape, torch_dtype, device, fused)
    supports: dict[str, tpl.SupportSpec | None] = {
        "raw": None,
        "all rules off": tpl.SupportSpec(top_p=1.0),
        "min_p=0.05": tpl.SupportSpec(min_p=0.05),
        "top_k=50": tpl.SupportSpec(top_k=50),
        "top_p=0.9": tpl.SupportSpec(top_p=0.9),
        "vLLM-like": tpl.SupportSpec(**VLLM_LIKE),  # type: ignore[arg-type]
    }
    targets = torch.argmax(logits, dim=1)  # the maximum is always kept
    probe = contract_for(
        Shape(shape.rows, shape.vocab, 0, "infer"), "fp32", "torch_native", supports["vLLM-like"]
    )
    with torch.no_grad():
        tau = torch_native_logprob(logits, targets, probe).support_threshold
    keep = logits >= tau.unsqueeze(1)
    keep[torch.arange(shape.rows, device=device), targets] = True
    supports["replayed"] = tpl.SupportSpec.from_mask(keep.cpu().numpy())
    module, name = OPS[backend]
    op = getattr(importlib.import_module(module), name)

    def run(contract: tpl.LogprobContract) -> Callable[[], Any]:
        def call(grad: bool) -> Any:
            if fused:
                hidden = tensors["hidden"].detach().requires_grad_(grad)
                weight = tensors["weight"].detach().requires_grad_(grad)
                return op(hidden, targets, contract, weight=weight)
            leaf = tensors["logits"].detach().requires_grad_(grad)
            return op(leaf, targets, contract)

        if shape.role == "infer":
            return lambda: call(False)
        return lambda: call(True).selected_logp.float().sum().backward()

    return {
        name: run(contract_for(shape, dtype, backend, support))
        for name, support in supports.items()
    }


def measure(
    backend: str, shape: Shape, dtype: str, device: torch.device, repeats: int
) -> dict[str, Any]:
    runs = candidates(backend, shape, dtype, device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():  # warm up
        run()
    order = list(runs)
    shuffle = random.Random(0).shuffle
    for _ in range(repeats):
        shuffle(order)  # no candidate always runs first, or after the same one
        for name in order:
            run = runs[name]
            sync()
            start = time.perf_counter()
            run()
            sync()
            times[name].append((time.perf_counter() - start) * 1e3)
    raw = statistics.median(times["raw"])
    return {
        "backend": backend,
        "rows": shape.rows,
        "vocab": shape.vocab,
        "hidden": shape.hidden if backend in FUSED else None,
        "role": shape.role,
        "dtype": dtype,
        "repeats": repeats,
        "candidates": {
            name: {"ms": statistics.median(samples), "of_raw": statistics.median(samples) / raw}
            for name, samples in times.items()
        },
    }


def print_table(table: dict[str, Any], device: torch.device) -> None:
    hidden = f" x {table['hidden']} hidden" if table["hidden"] else ""
    print(
        f"{table['backend']} {table['role']}, {table['rows']} x {table['vocab']}{hidden} "
        f"{table['dtype']} on {device} ({torch.get_num_threads()} threads), "
        f"median of {table['repeats']}"
    )
    for name, item in table["candidates"].items():
        print(f"  {name:<14} {item['ms']:9.2f} ms  {item['of_raw']:6.2f}x raw")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", nargs="+", choices=list(OPS), default=["torch_native"])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--hidden", type=int, default=64, help="the fused backends' H")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--role", choices=["infer", "train"], default="infer")
    parser.add_argument("--gpu-shapes", action="store_true", help="every backend, GPU shapes")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    parser.add_argument(
        "--interpreted", action="store_true", help="run Triton backends on CPU (no timing value)"
    )
    parser.add_argument("--json", help="write every table as JSON")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = "fp32" if device.type == "cpu" else "bf16"
    plans: list[tuple[str, Shape]] = []
    if args.gpu_shapes:
        rows, vocab = GPU_LOGITS
        fused_rows, hidden, fused_vocab = GPU_FUSED
        for role in ("infer", "train"):
            for backend in OPS:
                if backend in FUSED:
                    plans.append((backend, Shape(fused_rows, fused_vocab, hidden, role)))
                else:
                    plans.append((backend, Shape(rows, vocab, 0, role)))
    else:
        shape = Shape(args.rows, args.vocab, args.hidden, args.role)
        plans = [(backend, shape) for backend in args.backends]
    tables = []
    for backend, shape in plans:
        if backend.startswith("triton") and device.type == "cpu":
            if not args.interpreted:
                print(f"{backend}: skipped on CPU (the Triton interpreter measures no speed)")
                continue
            print(f"{backend}: THE TRITON INTERPRETER: these times measure nothing about speed")
        table = measure(backend, shape, dtype, device, args.repeats)
        print_table(table, device)
        tables.append(table)
        if args.json:  # after every table: a later shape that fails keeps the earlier ones
            with open(args.json, "w") as out:
                json.dump({"device": str(device), "tables": tables}, out, indent=1)


if __name__ == "__main__":
    main()
