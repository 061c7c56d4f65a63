"""Time of ``tp_logprob.testing.assert_logprob_close`` on a trainer-sized batch.

The goal is under 5 s for ``[1000, 32768]`` fp32 logits (``selected_logp`` and
``lse``) on 2 cores. The outputs judged are the exact values rounded to fp32, so
every call passes and does all of its work; ``--grad`` adds the gradient.
Prints each repeat's wall and CPU time, the medians with the load average (a
shared machine's wall time is not the assert's), and (``--profile``) the top of a
cProfile of one call, cumulative time first, to say where the time goes.

Run: python benchmarks/bench_testing.py [--rows 1000] [--vocab 32768] [--repeat 3]
     [--dtype fp32] [--grad] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import time

import numpy as np

from tp_logprob.oracle import exact_logprob_grad, exact_selected_logprob
from tp_logprob.strategies import round_to_dtype
from tp_logprob.testing import assert_logprob_close


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--grad", action="store_true", help="judge the gradient too")
    parser.add_argument("--profile", action="store_true", help="cProfile one more call")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    logits = round_to_dtype(rng.normal(size=(args.rows, args.vocab)) * 3, args.dtype)
    targets = rng.integers(0, args.vocab, args.rows)
    selected, lse = exact_selected_logprob(logits, targets)
    kwargs = {"lse": lse.astype(np.float32), "dtype": args.dtype}
    if args.grad:
        kwargs["grad"] = exact_logprob_grad(logits, targets).astype(np.float32)
    observed = selected.astype(np.float32)

    def call() -> None:
        assert_logprob_close(observed, logits, targets, **kwargs)

    times, cpu = [], []
    for repeat in range(args.repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        call()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        print(f"repeat {repeat}: {times[-1]:.3f} s wall, {cpu[-1]:.3f} s cpu")
    shape = f"[{args.rows}, {args.vocab}] {args.dtype}" + (" + grad" if args.grad else "")
    print(
        f"assert_logprob_close {shape}: median {statistics.median(times):.3f} s wall, "
        f"{statistics.median(cpu):.3f} s cpu (load average {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores)"
    )
    if args.profile:
        profile = cProfile.Profile()
        profile.runcall(call)
        pstats.Stats(profile).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
