"""The rollout check on one long response: its time, the exact oracle included.

A response of ``--tokens`` tokens at vocabulary ``--vocab`` (4,096 and 152,064 by
default, Qwen2's vocabulary), fp32 logits ``4 * randn`` in TP shards (``--tp``), the
engine's mask the ``--top-k`` largest logits at temperature 0.7, its logprob the
fp32 ``log_softmax`` over that mask (as an engine computes it), every fourth token
nudged by a few ulps and one token given the full vocabulary's logprob, so that
the hypotheses run too. The check runs ``--repeat`` times; the median wall time
(and CPU time, which a machine shared with other work inflates less) is printed,
with and without the sampling parameters (with them, each row's support is also
classified exactly). The logits take 2.5 GB at the default shape; the check holds
one 16 MiB float64 block besides.

    python benchmarks/bench_rollout.py --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from tp_logprob.engine_formats import EngineRollout, prime_rl_rollout
from tp_logprob.replay.rollout import check_rollout

TEMPERATURE = 0.7


def response(x: torch.Tensor, top_k: int) -> EngineRollout:
    """The engine's masks and logprobs for ``x`` (one response)."""
    z = x / TEMPERATURE
    kept = torch.topk(z, top_k, dim=1).indices.sort(dim=1).values
    tokens = kept[:, 0]
    values = z.gather(1, kept)
    logprobs = values[:, 0] - torch.logsumexp(values, dim=1)
    logprobs[::4] = torch.nextafter(logprobs[::4], torch.tensor(-np.inf))
    logprobs[1] = torch.log_softmax(z[1], 0)[tokens[1]]
    counts = np.full(x.shape[0], top_k)
    rollout = prime_rl_rollout(
        kept.flatten().numpy(), counts, tokens.numpy(), logprobs=logprobs.double().tolist(),
        vocab_size=x.shape[1],
    )  # fmt: skip
    return rollout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=152_064)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = 4 * torch.randn(args.tokens, args.vocab)
    rollout = response(x, args.top_k)
    shards = list(torch.tensor_split(x, args.tp, dim=1))
    print(
        f"rollout check: {args.tokens} tokens, V={args.vocab}, TP={args.tp}, top-k "
        f"{args.top_k} masks, torch threads {torch.get_num_threads()}"
    )
    for label, params in (("mask only", {}), ("with top_k", {"top_k": args.top_k})):
        times, cpu = [], []
        for _ in range(args.repeat):
            start, start_cpu = time.perf_counter(), time.process_time()
            check = check_rollout(shards, rollout, engine_temperature=TEMPERATURE, **params)
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        print(
            f"  {label:10s}: median {statistics.median(times):.2f} s of {args.repeat} "
            f"(min {min(times):.2f}, max {max(times):.2f}; CPU time, all threads, median "
            f"{statistics.median(cpu):.2f} s); verdicts {check.counts()}"
        )


if __name__ == "__main__":
    main()
