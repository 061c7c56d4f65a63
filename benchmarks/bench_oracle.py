"""Oracle benchmarks: exact certification speed, reference throughput, tolerance tightness.

Goals: one bf16 row of 152,064 columns certified (correctly rounded LSE) in
under 0.1 s and at least 3x faster than a plain per-element mpmath exp + fsum at
113 bits; the float64 reference at 200 MB/s or more of fp32 logits on
[64, 152064]. The tolerance section prints, per vocabulary size and TP degree,
the bound next to the worst error measured for plain fp32 implementations, for
the LSE and (section entropy) the softmax entropy (numbers quoted in
docs/tolerances.md).

Run: PYTHONPATH=src python benchmarks/bench_oracle.py [--section exact|reference|tolerance|entropy]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import mpmath
import numpy as np

from tp_logprob.oracle import (
    exact_entropy,
    exact_logprob_grad,
    exact_logsumexp,
    exact_selected_logprob,
    reference_logprob_grad,
    reference_selected_logprob,
    reference_sharded_logprob,
    tolerance,
)

VOCAB = 152_064
F32 = np.float32


def median_s(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bf16_row(seed: int, size: int = VOCAB) -> np.ndarray:
    """normal * 3 rounded to bfloat16 (round to nearest even on the float32 bits)."""
    x = (np.random.default_rng(seed).standard_normal(size) * 3).astype(F32)
    bits = x.view(np.uint32).astype(np.uint64)
    odd = (bits >> np.uint64(16)) & np.uint64(1)
    rounded = (bits + np.uint64(0x7FFF) + odd) & np.uint64(0xFFFF0000)
    out: np.ndarray = rounded.astype(np.uint32).view(F32)
    return out


def plain_mpmath_lse(row: np.ndarray) -> mpmath.mpf:
    """The naive baseline: per-element exp at 113 bits, then fsum (not certified)."""
    ctx = mpmath.MPContext()
    ctx.prec = 113
    xs = [ctx.mpf(float(v)) for v in row]
    top = max(xs)
    return top + ctx.log(ctx.fsum(ctx.exp(x - top) for x in xs))


def bench_exact(repeats: int) -> None:
    row = bf16_row(0)
    print(f"exact oracle, one bf16 row of {VOCAB} columns ({np.unique(row).size} distinct)")
    ours = median_s(lambda: exact_logsumexp(row), repeats)
    plain = median_s(lambda: plain_mpmath_lse(row), max(1, repeats // 2))
    print(f"  exact_logsumexp (certified)          median {ours * 1e3:8.1f} ms")
    print(f"  plain mpmath exp + fsum, 113 bits    median {plain * 1e3:8.1f} ms")
    print(f"  speed-up                             {plain / ours:8.1f}x")
    logits = row[None, :]
    sel = median_s(lambda: exact_selected_logprob(logits, [7]), repeats)
    grad = median_s(lambda: exact_logprob_grad(logits, [7]), max(1, repeats // 2))
    print(f"  exact_selected_logprob (1 row)       median {sel * 1e3:8.1f} ms")
    print(f"  exact_logprob_grad (1 row)           median {grad * 1e3:8.1f} ms")
    f32_row = (np.random.default_rng(1).standard_normal(VOCAB) * 3).astype(F32)
    full = median_s(lambda: exact_logsumexp(f32_row), max(1, repeats // 2))
    print(f"  exact_logsumexp, fp32 row (all distinct) median {full * 1e3:8.1f} ms")


def bench_reference(repeats: int) -> None:
    logits = (np.random.default_rng(2).standard_normal((64, VOCAB)) * 3).astype(F32)
    targets = np.arange(64) * 1000
    mb = logits.nbytes / 1e6
    print(f"float64 reference on fp32 logits [64, {VOCAB}] ({mb:.1f} MB)")
    bounds = [(k * VOCAB // 8, (k + 1) * VOCAB // 8) for k in range(8)]
    runs: dict[str, Callable[[], object]] = {
        "reference_selected_logprob": lambda: reference_selected_logprob(logits, targets),
        "reference_sharded_logprob (8 shards)": lambda: reference_sharded_logprob(
            logits, targets, bounds
        ),
        "reference_logprob_grad": lambda: reference_logprob_grad(logits, targets),
    }
    for name, run in runs.items():
        t = median_s(run, repeats)
        print(f"  {name:38s} median {t * 1e3:7.1f} ms  {mb / t:8.0f} MB/s")
    _, lse = reference_selected_logprob(logits[:4], targets[:4])
    _, want_lse = exact_selected_logprob(logits[:4], targets[:4])
    ulps = np.abs(lse - want_lse) / np.spacing(np.abs(want_lse))
    print(f"  reference lse vs exact on 4 rows: max {ulps.max():.0f} float64 ulps")


def _fp32_lse(row: np.ndarray, shards: int, order: str) -> float:
    """A plain fp32 max-shifted LSE: per-shard partials, merge in shard order."""
    parts = []
    for k in range(shards):
        xs = row[k * row.size // shards : (k + 1) * row.size // shards]
        m = xs.max()
        e = np.exp(xs - m)
        s = np.cumsum(e, dtype=F32)[-1] if order == "sequential" else e.sum(dtype=F32)
        parts.append((m, s))
    big_m = max(m for m, _ in parts)
    total = F32(0)
    for m, s in parts:
        total = F32(total + F32(s * np.exp(np.array([m - big_m], F32))[0]))
    return float(F32(big_m + np.log(np.array([total], F32))[0]))


def _half_ulp_row(size: int) -> np.ndarray:
    """0 and size-1 copies of the smallest x with exp(x) > 2^-24: every sequential
    fp32 addition rounds up, the worst case of the any-order summation bound."""
    x = np.array([math.log(2.0**-24)], F32)
    while np.exp(x)[0] <= F32(2.0**-24):
        x = np.nextafter(x, F32(math.inf))
    row = np.full(size, x[0], F32)
    row[0] = 0.0
    return row


def bench_tolerance(repeats: int) -> None:
    print("tolerance: fp32 LSE error against the bound (row max given)")
    header = ["V", "TP", "rows", "order", "worst |err|", "bound", "err/bound"]
    print("  " + " | ".join(f"{h:>11s}" for h in header))
    for size in (32, 1024, 32_000, VOCAB):
        for shards in (1, 8):
            if shards > size:
                continue
            tol = tolerance("bf16", size, num_shards=shards, max_shard_size=-(-size // shards))
            rows = {
                "bf16 normal*3": [bf16_row(100 + k, size) for k in range(repeats)],
                "half-ulp": [_half_ulp_row(size)],
            }
            for label, batch in rows.items():
                for order in ("pairwise", "sequential"):
                    worst = (0.0, 1.0)
                    for row in batch:
                        want = exact_logsumexp(row)
                        got = _fp32_lse(row, shards, order)
                        bound = float(tol.lse_bound([want], row_max=[float(row.max())])[0])
                        if abs(got - want) / bound >= worst[0] / worst[1]:
                            worst = (abs(got - want), bound)
                    cells = [size, shards, label, order]
                    cells += [f"{worst[0]:.3e}", f"{worst[1]:.3e}", f"{worst[0] / worst[1]:.3f}"]
                    print("  " + " | ".join(f"{c!s:>11s}" for c in cells))


def _fp32_entropy(row: np.ndarray, shards: int, order: str) -> tuple[float, float, float]:
    """Plain fp32 per-shard (m, s, q), merged in float64; returns (entropy, lse, max)."""
    big_m, total_s, total_q = -math.inf, 0.0, 0.0
    parts = []
    for k in range(shards):
        xs = row[k * row.size // shards : (k + 1) * row.size // shards]
        m = xs.max()
        d = (xs - m).astype(F32)
        e = np.exp(d)
        t = (e * d).astype(F32)
        if order == "sequential":
            s, q = np.cumsum(e, dtype=F32)[-1], np.cumsum(t, dtype=F32)[-1]
        else:
            s, q = e.sum(dtype=F32), t.sum(dtype=F32)
        parts.append((float(m), float(s), float(q)))
        big_m = max(big_m, float(m))
    for m, s, q in parts:
        scale = math.exp(m - big_m)
        total_s += s * scale
        total_q += scale * (q + (m - big_m) * s)
    h = float(F32(math.log(total_s) - total_q / total_s))
    return h, big_m + math.log(total_s), big_m


def bench_entropy(repeats: int) -> None:
    print("tolerance: fp32 entropy error against the bound (lse and row max given)")
    header = ["V", "TP", "rows", "order", "worst |err|", "bound", "err/bound"]
    print("  " + " | ".join(f"{h:>11s}" for h in header))
    for size in (32, 1024, 32_000, VOCAB):
        for shards in (1, 8):
            tol = tolerance("bf16", size, num_shards=shards, max_shard_size=-(-size // shards))
            rows = {
                "bf16 normal*3": [bf16_row(100 + k, size) for k in range(repeats)],
                "half-ulp": [_half_ulp_row(size)],
            }
            for label, batch in rows.items():
                for order in ("pairwise", "sequential"):
                    worst = (0.0, 1.0)
                    for row in batch:
                        want = exact_entropy(row[None, :])
                        lse = exact_logsumexp(row)
                        got, _, _ = _fp32_entropy(row, shards, order)
                        bound = float(
                            tol.entropy_bound(want, lse=[lse], row_max=[float(row.max())])[0]
                        )
                        err = abs(got - float(want[0]))
                        if err / bound >= worst[0] / worst[1]:
                            worst = (err, bound)
                    cells = [size, shards, label, order]
                    cells += [f"{worst[0]:.3e}", f"{worst[1]:.3e}", f"{worst[0] / worst[1]:.3f}"]
                    print("  " + " | ".join(f"{c!s:>11s}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", choices=["exact", "reference", "tolerance", "entropy", "all"])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    section = args.section or "all"
    if section in ("exact", "all"):
        bench_exact(args.repeat)
    if section in ("reference", "all"):
        bench_reference(args.repeat)
    if section in ("tolerance", "all"):
        bench_tolerance(args.repeat)
    if section in ("entropy", "all"):
        bench_entropy(args.repeat)


if __name__ == "__main__":
    main()
