"""Tightness of each declared order's bound: measured worst errors next to the bound.

For vocabularies of 32 to 152,064 columns at TP 1 and 8 (shards of ``ceil(V / TP)``
columns), each order is run as an fp32 numpy sum in that order
(``tests/helpers/order_sums.py``) on

* ``half-ulp``: the row built against it (``tp_logprob.strategies.order_rows``: every
  addition on the maximum's path rounds up, the maximum on rank 0 and the other ranks
  worth just over half an ulp each at the merge), with numpy's ``exp`` and ``log``;
* ``half-ulp, edge``: the same row with ``exp`` 3 ulps and ``log`` ``8u + 2^-22`` above
  the exact values, the most the bound's assumptions A3 and A5 allow;
* ``bf16 normal*3``: random rows (``normal * 3`` rounded to bf16), numpy's ``exp``/``log``;

and its ``lse`` compared with the exact oracle's, against
``tolerance(..., max_shard_size=ceil(V / TP), order=...)`` with ``row_max`` given. It
prints a markdown table (``docs/tolerances.md``, "Declared orders").

Run: PYTHONPATH=src python benchmarks/bench_orders.py [--sizes 32 1024 ...] [--random-rows 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.helpers, from a checkout

from tests.helpers.order_sums import Realization, order_logprob  # noqa: E402

from tp_logprob.accumulation import fraction_bits  # noqa: E402
from tp_logprob.oracle import exact_selected_logprob, tolerance  # noqa: E402
from tp_logprob.strategies import round_to_dtype  # noqa: E402
from tp_logprob.strategies.order_rows import HALF_ULP, order_layout, order_row  # noqa: E402

F32 = np.float32

ORDERS: list[tuple[str, Realization, str]] = [
    ("sequential", Realization("sequential"), "sequential"),
    ("pairwise", Realization("tree"), "tree"),
    ("blocked 1024, pairwise inside", Realization("blocks", 1024, within="tree"), "blocks"),
    ("lanes 4096 (triton_online's loop)", Realization("lanes", 4096), "lanes"),
    ("online 4096 (triton_online)", Realization("online", 4096), "lanes"),
]
"""(name, realization, layout of its half-ulp row)."""


def shard_bounds(size: int, shards: int) -> list[tuple[int, int]]:
    width = -(-size // shards)
    return [(a, min(a + width, size)) for a in range(0, size, width)]


def half_ulp_row(how: Realization, layout: str, size: int, shards: int) -> np.ndarray:
    """The row built against ``layout`` on rank 0; the other ranks worth just over half an
    ulp each at the merge."""
    bounds = shard_bounds(size, shards)
    first = bounds[0][1]
    groups = order_layout(
        layout, first, block=how.block, fan_in=how.fan_in, tree_inside=how.within == "tree"
    )
    parts = [order_row(groups, first, "fp32")]
    for a, b in bounds[1:]:
        small = F32(1.0 + np.log(HALF_ULP * 1.01 / (b - a)))
        parts.append(np.full(b - a, small, F32))
    return np.concatenate(parts)


def measure(how: Realization, rows: np.ndarray, shards: int) -> tuple[float, float]:
    """Worst ``|lse - exact|`` over ``rows`` and the bound at that row."""
    size = rows.shape[1]
    bounds = shard_bounds(size, shards)
    declared = how.declared
    tol = tolerance(
        "bf16", size, num_shards=len(bounds), max_shard_size=bounds[0][1], order=declared
    )
    worst, at = -1.0, 0.0
    for row in rows:
        _, lse = order_logprob(row, 0, size, bounds, how)
        _, want = exact_selected_logprob(row[None, :], [0])
        error = abs(lse - float(want[0]))
        bound = float(tol.lse_bound(want, row_max=[float(row.max())])[0])
        if error / bound > worst / max(at, 1e-300) or worst < 0:
            worst, at = error, bound
    return worst, at


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 1024, 32000, 152064])
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--random-rows", type=int, default=4)
    args = parser.parse_args()
    print("|      V | TP | order | rows | worst abs error | bound | error / bound |")
    print("| ------:| --:| ----- | ---- | ---------:| ---------:| -----:|")
    for size in args.sizes:
        rng = np.random.default_rng(size)
        normal = round_to_dtype(rng.standard_normal((args.random_rows, size)) * 3.0, "bf16")
        for shards in args.shards:
            fixed = Realization("fixed_point", fraction_bits(size))
            for name, how, layout in [*ORDERS, ("fixed point", fixed, "sequential")]:
                edge = Realization(how.kind, how.block, how.fan_in, how.within, how.across, True)
                row = half_ulp_row(how, layout, size, shards)[None, :]
                for label, realization, rows in (
                    ("half-ulp", how, row),
                    ("half-ulp, edge", edge, row),
                    ("bf16 normal*3", how, normal),
                ):
                    error, bound = measure(realization, rows, shards)
                    print(
                        f"| {size:6d} | {shards:2d} | {name} | {label} | {error:.3e} | "
                        f"{bound:.3e} | {error / bound:.3f} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
