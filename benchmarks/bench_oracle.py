"""Oracle benchmarks: exact certification speed, reference throughput, tolerance tightness.

Goals: one bf16 row of 152,064 columns certified (correctly rounded LSE) in
under 0.1 s and at least 3x faster than a plain per-element mpmath exp + fsum at
113 bits; the float64 reference at 200 MB/s or more of fp32 logits on
[64, 152064]. The tolerance section prints, per vocabulary size and TP degree,
the bound next to the worst error measured for plain fp32 implementations, for
the LSE and (section entropy) the softmax entropy (numbers quoted in
docs/tolerances.md).

Section fast: the exact oracle (its fast path in front of the Ziv loop) against
python-flint's arb balls run through the same certify-then-round loop, on the
same rows in the same run (medians and ratios; goals: at least 10x faster than
arb on an fp32 row of 152,064 distinct values and on bf16-valued rows, whose
cost for arb follows their number of distinct values; 1,000 x
32,768 fp32 rows in under 10 s for lse and selected_logp; fallback rate below
0.1% on random rows), then the per-row cost by width and batch size. arb comes
from the optional extra ``pip install -e '.[bench]'`` (python-flint).

Section ratio: the exact oracle next to the float64 reference on the same inputs,
interleaved (goal: within 3x on ``selected_logprob`` of a [1000, 32768] fp32 batch
and on ``logsumexp`` of one fp32 row of 152,064 values).

Section support: ``exact_support`` and ``classify_support`` (processed logprobs'
sampling support) per row, by width and dtype, with the borderline tokens per row
and the rows that fell back to multi-precision (goal: a row of 10^5 columns
classified in well under a second, no fallback on random rows).

Run: PYTHONPATH=src python benchmarks/bench_oracle.py
    [--section exact|ratio|reference|tolerance|entropy|fast|support] [--repeat N] [--batch-rows N]
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
    classify_support,
    exact_entropy,
    exact_logprob_grad,
    exact_logsumexp,
    exact_selected_logprob,
    exact_support,
    fast_path_stats,
    reference_logprob_grad,
    reference_logsumexp,
    reference_selected_logprob,
    reference_sharded_logprob,
    support_margins,
    tolerance,
)
from tp_logprob.oracle._mpfloat import from_man_exp, to_float64

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
    return to_bf16((np.random.default_rng(seed).standard_normal(size) * 3).astype(F32))


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 values (nearest even), still float32."""
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


def side_by_side(
    ours: Callable[[], object], theirs: Callable[[], object], repeats: int
) -> tuple[tuple[float, float], tuple[float, float]]:
    """Medians of ``repeats`` interleaved runs of two callables (same load for both):
    wall-clock seconds, then this process's CPU seconds (steadier on a loaded machine)."""
    wall: tuple[list[float], list[float]] = ([], [])
    cpu: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for k, run in enumerate((ours, theirs)):
            start, start_cpu = time.perf_counter(), time.process_time()
            run()
            wall[k].append(time.perf_counter() - start)
            cpu[k].append(time.process_time() - start_cpu)
    med = statistics.median
    return (med(wall[0]), med(wall[1])), (med(cpu[0]), med(cpu[1]))


def bench_ratio(repeats: int, batch_rows: int) -> None:
    """The exact oracle next to the float64 reference on the same inputs, interleaved."""
    repeats = max(repeats, 3)
    logits = np.stack([fp32_row(100 + k, 32_768) for k in range(batch_rows)])
    targets = np.random.default_rng(7).integers(0, 32_768, batch_rows)
    row = fp32_row(1)
    print(f"exact oracle against the float64 reference, same inputs, median of {repeats}")
    print("| call | exact | reference | ratio | ratio of CPU times |")
    print("| --- | ---: | ---: | ---: | ---: |")
    cases: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        f"selected_logprob [{batch_rows}, 32768] fp32": (
            lambda: exact_selected_logprob(logits, targets),
            lambda: reference_selected_logprob(logits, targets),
        ),
        f"logsumexp [{batch_rows}, 32768] fp32": (
            lambda: exact_logsumexp(logits),
            lambda: reference_logsumexp(logits),
        ),
        f"logsumexp, one fp32 row of {VOCAB:,}": (
            lambda: exact_logsumexp(row),
            lambda: reference_logsumexp(row),
        ),
    }
    fast_path_stats(reset=True)
    for label, (ours, theirs) in cases.items():
        (a, b), (ca, cb) = side_by_side(ours, theirs, repeats)
        unit, mult = ("ms", 1e3) if a < 0.1 else ("s", 1.0)
        print(
            f"| {label} | {a * mult:.2f} {unit} | {b * mult:.2f} {unit} | {a / b:.1f}x "
            f"| {ca / cb:.1f}x |"
        )
    stats = fast_path_stats(reset=True)
    print(
        f"fallbacks to the Ziv loop: lse {stats['lse'].fallbacks}, "
        f"selected_logp {stats['selected_logp'].fallbacks}"
    )


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


def _flint() -> object | None:
    try:
        import flint
    except ImportError:
        return None
    return flint


def arb_logsumexp(row: np.ndarray) -> float:
    """The certify-then-round loop of the exact oracle with python-flint's arb balls.

    Distinct values and counts (np.unique), ``sum c exp(v - M)`` at the oracle's
    first precision, ``M + log``; both ends of the ball rounded to float64 must
    agree, else the precision doubles.
    """
    import flint

    values, counts = np.unique(np.asarray(row, np.float64), return_counts=True)
    top = float(values[-1])
    if values.size == 1 and counts[0] == 1:
        return top
    bits = 80 + int(row.size).bit_length()
    saved = flint.ctx.prec
    try:
        while True:
            flint.ctx.prec = bits
            m = flint.arb(top)
            total = flint.arb(0)
            for v, c in zip(values.tolist(), counts.tolist(), strict=True):
                total += c * (flint.arb(v) - m).exp()
            lse = m + total.log()
            lo, hi = (
                to_float64(from_man_exp(*map(int, end.man_exp())))
                for end in (lse.lower(), lse.upper())
            )
            if lo == hi:
                return lo
            bits *= 2
    finally:
        flint.ctx.prec = saved


def fp32_row(seed: int, size: int = VOCAB) -> np.ndarray:
    """N(0, 16) in float32: every value distinct, as a trained model's fp32 logits are."""
    return (np.random.default_rng(seed).standard_normal(size) * 4).astype(F32)


def bench_fast(repeats: int, batch_rows: int) -> None:
    have_arb = _flint() is not None
    if not have_arb:
        print("python-flint is not installed: no arb column (pip install -e '.[bench]')")
    print(f"exact oracle (fast path) against arb, same rows, median of {repeats}")
    print("| row (V = 152,064) | distinct values | tp_logprob | arb | ratio |")
    print("| --- | ---: | ---: | ---: | ---: |")
    rng = np.random.default_rng(5)
    normal = rng.standard_normal(VOCAB).astype(F32)
    peaked = normal.copy()
    peaked[123] += 20.0
    # A language model's logits sit mostly below zero with a few tokens far above:
    # fewer values near zero, where bfloat16 is densest, so fewer distinct values.
    shifted = np.concatenate([normal[30:] * 2.5 - 5.0, rng.normal(15.0, 2.0, 30)]).astype(F32)
    rows = {
        "fp32, all values distinct (N(0, 16))": fp32_row(1),
        "bf16-valued (normal * 3)": bf16_row(0),
        "bf16-valued (normal * 1)": to_bf16(normal),
        "bf16-valued (normal * 4)": to_bf16(normal * 4),
        "bf16-valued (uniform in [-10, 10])": to_bf16(rng.uniform(-10, 10, VOCAB).astype(F32)),
        "bf16-valued (normal * 1, one logit +20)": to_bf16(peaked),
        "bf16-valued (normal * 2.5 - 5, 30 logits near +15)": to_bf16(shifted),
    }
    for label, row in rows.items():
        ours = median_s(lambda row=row: exact_logsumexp(row), repeats)
        distinct = f"{np.unique(row).size:,}"
        if have_arb:
            theirs = median_s(lambda row=row: arb_logsumexp(row), repeats)
            assert arb_logsumexp(row) == exact_logsumexp(row), label
            print(
                f"| {label} | {distinct} | {ours * 1e3:.2f} ms | {theirs * 1e3:.2f} ms | "
                f"{theirs / ours:.1f}x faster |"
            )
        else:
            print(f"| {label} | {distinct} | {ours * 1e3:.2f} ms | - | - |")
    logits = np.stack([fp32_row(100 + k, 32_768) for k in range(batch_rows)])
    targets = np.random.default_rng(7).integers(0, 32_768, batch_rows)
    fast_path_stats(reset=True)
    start = time.perf_counter()
    exact_selected_logprob(logits, targets)
    took = time.perf_counter() - start
    stats = fast_path_stats(reset=True)
    print(
        f"exact_selected_logprob on [{batch_rows}, 32768] fp32: {took:.2f} s "
        f"({took / batch_rows * 1e3:.2f} ms per row); fallbacks: "
        f"lse {stats['lse'].fallbacks}/{batch_rows}, "
        f"selected_logp {stats['selected_logp'].fallbacks}/{batch_rows}"
    )
    _fallback_rates(repeats)
    _per_row_costs(repeats)


def _fallback_rates(repeats: int) -> None:
    rng = np.random.default_rng(2024)
    fast_path_stats(reset=True)
    count = 0
    for _ in range(20 * repeats):
        width = int(rng.choice([1024, 4096, 32_000, 65_536]))
        scale, offset = float(rng.choice([0.5, 3.0, 10.0])), float(rng.choice([0.0, -20.0, 50.0]))
        x = (offset + scale * rng.standard_normal((16, width))).astype(F32)
        if rng.random() < 0.5:
            x = np.stack(
                [bf16_row(int(rng.integers(1 << 30)), width) * scale / 3 for _ in range(16)]
            )
        exact_selected_logprob(x, rng.integers(0, width, 16))
        count += 16
    stats = fast_path_stats(reset=True)
    print(f"fallback rate on {count} random rows (fp32 and bf16, widths 1k-64k, scales 0.5-10):")
    for name in ("lse", "selected_logp"):
        c = stats[name]
        print(f"  {name:14s} {c.fallbacks} of {c.hits + c.fallbacks} ({c.fallback_rate:.3%})")


def _per_row_costs(repeats: int) -> None:
    print("per-row cost of exact_selected_logprob (lse and selected_logp), fast path")
    print(
        "| width | fp32, 1 row | fp32, 64 rows (per row) | bf16, 1 row | bf16, 64 rows (per row) |"
    )
    print("| ---: | ---: | ---: | ---: | ---: |")
    for width in (1024, 4096, 32_768, VOCAB, 262_144):
        cells = []
        for make in (fp32_row, bf16_row):
            one = make(3, width)[None, :]
            many = np.stack([make(10 + k, width) for k in range(64)])
            t1 = median_s(lambda one=one: exact_selected_logprob(one, [0]), repeats)
            t64 = median_s(lambda many=many: exact_selected_logprob(many, np.zeros(64, int)), 1)
            cells += [f"{t1 * 1e3:.2f} ms", f"{t64 / 64 * 1e3:.2f} ms"]
        print(f"| {width:,} | " + " | ".join(cells) + " |")


def bench_support(repeats: int) -> None:
    print("exact_support and classify_support, 8 rows of normal * 3, TP 8 margins")
    print(
        "| width | dtype | rules | exact_support (per row) | classify_support (per row) "
        "| borderline per row | fallback rows |"
    )
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: |")
    rng = np.random.default_rng(7)
    for width in (32_000, 100_000, VOCAB):
        for dtype in ("fp32", "bf16"):
            x = (rng.standard_normal((8, width)) * 3).astype(F32)
            if dtype == "bf16":
                x = np.stack([bf16_row(int(rng.integers(1 << 30)), width) for _ in range(8)])
            margins = support_margins(dtype, width, num_shards=8, max_shard_size=-(-width // 8))
            for rules in ({"top_k": 50, "top_p": 0.9, "min_p": 0.05}, {"top_p": 0.9}):
                fast_path_stats(reset=True)
                exact_s = median_s(lambda x=x, r=rules: exact_support(x, **r), repeats) / 8
                found = classify_support(x, margins=margins, **rules)
                classify_s = (
                    median_s(
                        lambda x=x, m=margins, r=rules: classify_support(x, margins=m, **r),
                        repeats,
                    )
                    / 8
                )
                stats = fast_path_stats(reset=True)
                fallbacks = stats["support_min_p"].fallbacks + stats["support_top_p"].fallbacks
                named = " ".join(f"{k}={v}" for k, v in rules.items())
                print(
                    f"| {width:,} | {dtype} | {named} | {exact_s * 1e3:.1f} ms "
                    f"| {classify_s * 1e3:.1f} ms | {found.borderline.sum() / 8:.2f} "
                    f"| {fallbacks} |"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sections = ["exact", "ratio", "reference", "tolerance", "entropy", "fast", "support", "all"]
    parser.add_argument("--section", choices=sections)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--batch-rows", type=int, default=1000)
    args = parser.parse_args()
    section = args.section or "all"
    if section in ("exact", "all"):
        bench_exact(args.repeat)
    if section in ("ratio", "all"):
        bench_ratio(args.repeat, args.batch_rows)
    if section in ("reference", "all"):
        bench_reference(args.repeat)
    if section in ("tolerance", "all"):
        bench_tolerance(args.repeat)
    if section in ("entropy", "all"):
        bench_entropy(args.repeat)
    if section in ("fast", "all"):
        bench_fast(args.repeat, args.batch_rows)
    if section in ("support", "all"):
        bench_support(args.repeat)


if __name__ == "__main__":
    main()
