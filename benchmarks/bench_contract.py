"""How long building a contract takes for a 1,000,000-token batch, per mask container.

Goal: well under 100 ms (no per-token Python loop). Run: python benchmarks/bench_contract.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

import tp_logprob as tpl

NUM_TOKENS = 1_000_000
REPEATS = 7


def build(mask: object) -> tpl.LogprobContract:
    return tpl.LogprobContract(
        role="train",
        dtype="bf16",
        mask=tpl.MaskSpec(NUM_TOKENS, mask),
        sharding=tpl.ShardingSpec(3, 8, tpl.even_shard_bounds(152_064, 8), 151_936, 152_064),
        reduction=tpl.ReductionSpec("fixed_topology"),
    )


def median_ms(make: Callable[[], object]) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        make()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    rng = np.random.default_rng(0)
    array = rng.random(NUM_TOKENS) < 0.7
    containers: dict[str, object] = {
        "none (all active)": None,
        "numpy bool array": array,
        "list of bools": array.tolist(),
        "tuple of bools": tuple(array.tolist()),
    }
    try:
        import torch

        containers["torch bool tensor"] = torch.from_numpy(array.copy())
    except ImportError:
        pass
    print(f"LogprobContract construction, N={NUM_TOKENS:,}, median of {REPEATS}")
    print(f"{'mask container':<20} {'ms':>8}  {'+ fingerprint ms':>16}")
    for name, mask in containers.items():
        build_ms = median_ms(lambda mask=mask: build(mask))
        both_ms = median_ms(lambda mask=mask: build(mask).cross_rank_fingerprint())
        print(f"{name:<20} {build_ms:8.2f}  {both_ms:16.2f}")


if __name__ == "__main__":
    main()
