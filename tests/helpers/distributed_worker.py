"""One rank of a real gloo process group, driven by tests/test_distributed.py.

Run as ``python tests/helpers/distributed_worker.py RANK WORLD PORT CASES OUT_DIR HANG_TIMEOUT``.
The rank joins a gloo group on 127.0.0.1, runs ``torch_native_logprob`` on
``CASES`` seeded cases (the same ones :func:`build_case` gives the test),
checks a planted preflight mismatch, then plays its part in a timeout: the
last rank never calls the collective, the others must raise within
``HANG_TIMEOUT`` seconds. Results go to ``OUT_DIR/rank{RANK}.pt``.

The test imports :func:`build_case` from this file, so keep it importable.
"""

from __future__ import annotations

import datetime
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import tp_logprob as tpl
from tp_logprob.kernels.dtypes import TORCH_DTYPES

DTYPES = ("bf16", "fp16", "fp32")


def build_case(seed: int, world: int) -> tuple[tpl.LogprobContract, torch.Tensor, torch.Tensor]:
    """Rank 0's contract, full logits and targets of case ``seed``: uneven, padded, masked."""
    rng = np.random.default_rng([seed, world])
    padded = int(rng.integers(world, 40))
    real = int(rng.integers(max(1, padded - 9), padded + 1))
    cuts = np.sort(rng.choice(np.arange(1, padded), size=world - 1, replace=False))
    edges = [0, *cuts.tolist(), padded]
    bounds = tuple((edges[i], edges[i + 1]) for i in range(world))
    num_tokens = int(rng.integers(1, 12))
    mask = rng.random(num_tokens) < 0.7 if rng.random() < 0.6 else None
    dtype = str(rng.choice(list(DTYPES)))
    logits = rng.normal(0.0, 3.0, (num_tokens, padded)).astype(np.float32)
    if padded > real:
        logits[:, real:] = rng.choice([np.nan, np.inf, 1e4], size=(num_tokens, padded - real))
    if rng.random() < 0.3:
        logits[0, : real // 2] = -np.inf
    targets = rng.integers(0, real, num_tokens)
    if mask is not None:
        targets[~mask] = rng.choice([-100, -7, 10**9], size=int((~mask).sum()))
    contract = tpl.LogprobContract(
        role=str(rng.choice(["train", "infer"])),
        dtype=dtype,
        mask=tpl.MaskSpec(num_tokens, mask),
        sharding=tpl.ShardingSpec(0, world, bounds, real, padded),
        reduction=tpl.ReductionSpec("fixed_topology"),
        output=tpl.LogprobOutputSpec(str(rng.choice(list(DTYPES)))),
        export_lse=bool(rng.random() < 0.8),
    )
    return contract, torch.from_numpy(logits).to(TORCH_DTYPES[dtype]), torch.from_numpy(targets)


def _run(rank: int, world: int, port: int, cases: int, hang_timeout: float) -> dict[str, Any]:
    import torch.distributed as dist

    from tp_logprob.comm import TorchGroup
    from tp_logprob.kernels.native import torch_native_logprob
    from tp_logprob.preflight import preflight

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    group = TorchGroup(timeout=60.0)
    report: dict[str, Any] = {"results": []}
    for seed in range(cases):
        contract, logits, targets = build_case(seed, world)
        start, end = contract.sharding.vocab_shard_bounds[rank]
        mine = contract.with_rank(rank)
        preflight(mine, "torch_native", group)
        result = torch_native_logprob(logits[:, start:end], targets, mine, group)
        report["results"].append((result.selected_logp, result.lse))

    contract = build_case(0, world)[0].with_rank(rank)
    try:
        preflight(contract, "triton_online" if rank == 1 else "torch_native", group)
        report["preflight"] = "passed"
    except tpl.LogprobDispatchError as error:
        report["preflight"] = str(error)

    hang = TorchGroup(timeout=hang_timeout)
    if rank == world - 1:
        time.sleep(hang_timeout + 2.0)  # never joins; stays up so peers see a timeout
        report["hang"] = None
    else:
        started = time.monotonic()
        try:
            hang.all_gather(torch.zeros(3))
            report["hang"] = {"error": None, "elapsed": time.monotonic() - started}
        except Exception as error:
            report["hang"] = {
                "error": type(error).__name__,
                "message": str(error),
                "elapsed": time.monotonic() - started,
            }
    return report


def main(argv: list[str]) -> int:
    rank, world, port, cases = (int(value) for value in argv[:4])
    out_dir, hang_timeout = Path(argv[4]), float(argv[5])
    report = _run(rank, world, port, cases, hang_timeout)
    torch.save(report, out_dir / f"rank{rank}.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
