"""What a sampling support costs over the raw logprob, on torch_native (TP=1).

One logits shape (fp32 on CPU, bf16 on a GPU), one op call per candidate, each timed
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
  returned mask; built into a device mask per call.

``--role train`` times forward and backward (``selected_logp.sum().backward()``).
The logits are ``4 * randn``: min-p 0.05 keeps about 14 tokens, top-p 0.9 a median of
about 200 and at most about 500 of 32000 (so some rows take the radix select).

Run: python benchmarks/bench_processed.py [--rows 256] [--vocab 32000] [--repeats 7]
     [--role infer|train] [--device cpu|cuda] [--threads N]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import tp_logprob as tpl
from tp_logprob.kernels.native import torch_native_logprob

VLLM_LIKE = {"min_p": 0.05, "top_k": 50, "top_p": 0.9}


def contract_for(
    rows: int, vocab: int, dtype: str, role: str, support: tpl.SupportSpec | None
) -> tpl.LogprobContract:
    return tpl.LogprobContract(
        role=role,
        dtype=dtype,
        mask=tpl.MaskSpec(rows),
        sharding=tpl.ShardingSpec(0, 1, ((0, vocab),), vocab, vocab),
        reduction=tpl.ReductionSpec("fixed_topology"),
        support=support,
    )


def candidates(
    logits: torch.Tensor, targets: torch.Tensor, dtype: str, role: str
) -> dict[str, Callable[[], Any]]:
    rows, vocab = logits.shape
    supports: dict[str, tpl.SupportSpec | None] = {
        "raw": None,
        "all rules off": tpl.SupportSpec(top_p=1.0),
        "min_p=0.05": tpl.SupportSpec(min_p=0.05),
        "top_k=50": tpl.SupportSpec(top_k=50),
        "top_p=0.9": tpl.SupportSpec(top_p=0.9),
        "vLLM-like": tpl.SupportSpec(**VLLM_LIKE),  # type: ignore[arg-type]
    }
    probe = contract_for(rows, vocab, dtype, "infer", supports["vLLM-like"])
    with torch.no_grad():
        tau = torch_native_logprob(logits, targets, probe).support_threshold
    keep = logits.float() >= tau.unsqueeze(1)
    supports["replayed"] = tpl.SupportSpec.from_mask(keep.cpu().numpy())
    kept_targets = torch.argmax(logits.float(), dim=1)  # the maximum is always kept

    def run(contract: tpl.LogprobContract) -> Callable[[], Any]:
        if role == "infer":
            return lambda: torch_native_logprob(logits, kept_targets, contract)

        def train() -> None:
            leaf = logits.detach().requires_grad_(True)
            torch_native_logprob(leaf, kept_targets, contract).selected_logp.sum().backward()

        return train

    return {
        name: run(contract_for(rows, vocab, dtype, role, support))
        for name, support in supports.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--role", choices=["infer", "train"], default="infer")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = "fp32" if device.type == "cpu" else "bf16"
    gen = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(args.rows, args.vocab, generator=gen, device=device) * 4
    logits = logits.to(torch.float32 if dtype == "fp32" else torch.bfloat16)
    targets = torch.zeros(args.rows, dtype=torch.int64, device=device)
    runs = candidates(logits, targets, dtype, args.role)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():  # warm up
        run()
    order = list(runs)
    shuffle = random.Random(0).shuffle
    for _ in range(args.repeats):
        shuffle(order)  # no candidate always runs first, or after the same one
        for name in order:
            run = runs[name]
            sync()
            start = time.perf_counter()
            run()
            sync()
            times[name].append((time.perf_counter() - start) * 1e3)
    threads = torch.get_num_threads()
    print(
        f"torch_native {args.role}, {args.rows} x {args.vocab} {dtype} on {device} "
        f"({threads} threads), median of {args.repeats}"
    )
    raw = statistics.median(times["raw"])
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"  {name:<14} {median:9.2f} ms  {median / raw:6.2f}x raw")


if __name__ == "__main__":
    main()
