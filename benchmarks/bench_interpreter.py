"""Interpreted Triton launches with the interpreter's shortcuts against Triton's interpreter
as it is (``kernels/triton/interpreted.py``), side by side in one run.

Each Triton backend runs the same small train cases (forward and backward, entropy, bf16
and fp32, TP 1 and 2, padding and an inactive row) under both, alternating, ``--repeat``
times; the script prints the medians and their ratio, and checks that both gave the same
bits. The property suite's cases are this size: its time on CPU is this time.

Run: python benchmarks/bench_interpreter.py [--repeat 5] [--backend ID ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import torch

import tp_logprob as tpl
from tp_logprob.emulate import run_tp, run_tp_hidden
from tp_logprob.kernels.triton.interpreted import plain_interpreter

_ROWS, _PADDED, _REAL, _HIDDEN = 6, 64, 61, 16
_LOGITS = ("triton_online", "triton_exact_sum", "triton_portable")
_FUSED = ("triton_fused", "triton_fused_exact_sum")


def _contract(world: int, dtype: str, hidden: bool) -> tpl.LogprobContract:
    width = _PADDED // world
    bounds = tuple((rank * width, (rank + 1) * width) for rank in range(world))
    return tpl.LogprobContract(
        role="train",
        dtype=dtype,
        input_kind="hidden" if hidden else "logits",
        hidden_size=_HIDDEN if hidden else None,
        mask=tpl.MaskSpec(num_tokens=_ROWS, active_mask=[True] * (_ROWS - 1) + [False]),
        sharding=tpl.ShardingSpec(
            tp_rank=0,
            tp_world_size=world,
            vocab_shard_bounds=bounds,
            real_vocab_size=_REAL,
            padded_vocab_size=_PADDED,
        ),
        reduction=tpl.ReductionSpec(determinism_scope="fixed_topology"),
        export_entropy=True,
    )


def _once(backend: str, world: int, dtype: str) -> list[np.ndarray]:
    """One forward and backward; every output's and gradient's bits."""
    hidden = backend in _FUSED
    contract = _contract(world, dtype, hidden)
    op = tpl.registry.get_logprob_op(contract, backend, preflighted=True).op
    torch_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    generator = torch.Generator().manual_seed(world * 10 + len(dtype))
    targets = torch.randint(0, _REAL, (_ROWS,), generator=generator)
    if hidden:
        x = torch.randn(_ROWS, _HIDDEN, generator=generator).to(torch_dtype).requires_grad_()
        w = torch.randn(_PADDED, _HIDDEN, generator=generator).to(torch_dtype).requires_grad_()
        results = run_tp_hidden(op, x, w, targets, contract)
        leaves = [x, w]
    else:
        logits = 3 * torch.randn(_ROWS, _PADDED, generator=generator)
        logits = logits.to(torch_dtype).requires_grad_()
        results = run_tp(op, logits, targets, contract)
        leaves = [logits]
    result = results[0]
    (result.selected_logp.sum() + result.entropy.sum()).backward()
    outputs = [result.selected_logp, result.lse, result.entropy] + [leaf.grad for leaf in leaves]
    return [value.detach().float().numpy().view(np.int32).copy() for value in outputs]


def _workload(backend: str) -> list[np.ndarray]:
    return [
        bits
        for world in (1, 2)
        for dtype in ("bf16", "fp32")
        for bits in _once(backend, world, dtype)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs of each, alternating")
    parser.add_argument("--backend", action="append", choices=_LOGITS + _FUSED)
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat={args.repeat}: must be at least 1")
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; {_ROWS} rows x {_PADDED} columns")
    print(f"{'backend':24} {'plain':>9} {'shortcuts':>10} {'ratio':>7}  bits")
    for backend in args.backend or _LOGITS + _FUSED:
        _workload(backend)  # imports and first launches, untimed
        times: dict[str, list[float]] = {"plain": [], "shortcuts": []}
        bits: dict[str, list[np.ndarray]] = {}
        for _ in range(args.repeat):
            for label in ("plain", "shortcuts"):
                start = time.perf_counter()
                if label == "plain":
                    with plain_interpreter():
                        bits[label] = _workload(backend)
                else:
                    bits[label] = _workload(backend)
                times[label].append(time.perf_counter() - start)
        same = all(
            np.array_equal(a, b) for a, b in zip(bits["plain"], bits["shortcuts"], strict=True)
        )
        plain, fast = (statistics.median(times[label]) for label in ("plain", "shortcuts"))
        print(
            f"{backend:24} {plain:8.3f}s {fast:9.3f}s {fast / plain:7.3f}  "
            f"{'same' if same else 'DIFFERENT'}"
        )
        if not same:
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
