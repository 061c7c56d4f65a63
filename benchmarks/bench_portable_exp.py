"""The portable exp on every fp32 input it serves, and the portable log on sampled inputs,
against their proved bounds (``docs/tolerances.md``, "Portable exp and log").

exp: every fp32 bit pattern ``d`` in ``[-87, -0]`` (1,118,699,521 of them), through the
torch twin itself (``kernels/portable.portable_exp``) in chunks, against float64 ``exp``
(error below ``2^-52`` relative, a ten-millionth of an fp32 ulp); the error in ulps of the
exact result. It also checks that the Cody-Waite step ``d - n LN2_HI`` is exact (fp32
against float64, where it is exact) and that every result is at least ``2^-126``.
``--below`` also runs every pattern in ``[-104, -87)`` (subnormal results: the error
after the bound's relative error, in units of the subnormal ulp ``2^-149``), and every
pattern below ``-104`` to ``-inf`` (each must give exactly 0).

log: ``--log-samples`` float64 ``s`` in ``[1, 2^31]`` (log-uniform, and every ``1 + k 2^-52``
near 1 and ``2^e`` neighbours), against an 80-bit ``long double`` log.

Run: python benchmarks/bench_portable_exp.py [--chunk-bits 24] [--below] [--log-samples N]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from tp_logprob.kernels import portable
from tp_logprob.kernels.portable import portable_exp, portable_log

EXP_BOUND = 2.288  # ulp, benchmarks/portable_bounds.py
LOG_BOUND = 5.332
FIRST_NEGATIVE = 0x80000000  # -0.0
FLOOR_BITS = 0xC2AE0000  # -87.0
ZERO_BITS = 0xC2D00000  # -104.0
NEG_INF_BITS = 0xFF800000


def _patterns(start: int, stop: int) -> torch.Tensor:
    """fp32 values with bit patterns ``start .. stop - 1`` (as uint32)."""
    bits = np.arange(start, stop, dtype=np.uint64).astype(np.uint32)
    return torch.from_numpy(bits.view(np.float32))


def _ulps32(approx: np.ndarray, exact: np.ndarray) -> np.ndarray:
    exponent = np.frexp(exact)[1]  # exact in [2^(e-1), 2^e): one fp32 ulp is 2^(e-24)
    return np.abs(approx.astype(np.float64) - exact) / np.ldexp(1.0, exponent - 24)


def exp_sweep(chunk: int) -> dict[str, float]:
    worst, worst_at, count = 0.0, 0.0, 0
    for start in range(FIRST_NEGATIVE, FLOOR_BITS + 1, chunk):
        d = _patterns(start, min(start + chunk, FLOOR_BITS + 1))
        y = portable_exp(d).numpy()
        d64 = d.numpy().astype(np.float64)
        exact = np.exp(d64)
        errors = _ulps32(y, exact)
        at = int(np.argmax(errors))
        if errors[at] > worst:
            worst, worst_at = float(errors[at]), float(d64[at])
        if (y < np.float32(2.0**-126)).any():
            raise AssertionError(f"subnormal or zero result in chunk at {start:#x}")
        # Cody-Waite: d - n LN2_HI in fp32 equals the float64 value, which is exact.
        rounded = d * portable.LOG2E + portable.ROUNDER
        whole = rounded - portable.ROUNDER
        reduced = (d - whole * portable.LN2_HI).numpy().astype(np.float64)
        exact_reduced = d64 - whole.numpy().astype(np.float64) * portable.LN2_HI
        if not np.array_equal(reduced, exact_reduced):
            raise AssertionError(f"inexact reduction in chunk at {start:#x}")
        count += d.numel()
    return {"inputs": count, "max_ulp": worst, "at": worst_at}


def subnormal_sweep(chunk: int) -> dict[str, float]:
    """``[-104, -87)``: ``|y - exp(d)| - EXP_BOUND u exp(d)``, in subnormal ulps ``2^-149``."""
    worst, count = 0.0, 0
    for start in range(FLOOR_BITS + 1, ZERO_BITS + 1, chunk):
        d = _patterns(start, min(start + chunk, ZERO_BITS + 1))
        y = portable_exp(d).numpy().astype(np.float64)
        exact = np.exp(d.numpy().astype(np.float64))
        excess = (np.abs(y - exact) - EXP_BOUND * 2.0**-24 * exact) / 2.0**-149
        worst = max(worst, float(excess.max()))
        count += d.numel()
    return {"inputs": count, "excess": worst}


def below_sweep(chunk: int) -> int:
    count = 0
    for start in range(ZERO_BITS + 1, NEG_INF_BITS + 1, chunk):
        d = _patterns(start, min(start + chunk, NEG_INF_BITS + 1))
        if bool((portable_exp(d) != 0.0).any()):
            raise AssertionError(f"nonzero exp below -104 in chunk at {start:#x}")
        count += d.numel()
    return count


def log_sweep(samples: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    spread = np.exp(rng.uniform(0.0, 31 * np.log(2.0), samples))
    near_one = 1.0 + np.arange(1, 1 << 16) * 2.0**-52
    powers = np.ldexp(1.0, np.arange(0, 32))
    neighbours = np.concatenate([np.nextafter(powers, 0.0), powers, np.nextafter(powers, 3e9)])
    s = np.concatenate([spread, near_one, neighbours[neighbours >= 1.0], [np.sqrt(2.0)]])
    got = portable_log(torch.from_numpy(s)).numpy()
    exact = np.log(s.astype(np.longdouble))
    nonzero = exact != 0
    spacing = np.spacing(np.abs(exact[nonzero]).astype(np.float64)).astype(np.longdouble)
    errors = np.abs(got[nonzero].astype(np.longdouble) - exact[nonzero]) / spacing
    at = int(np.argmax(errors))
    if (got[~nonzero] != 0.0).any():
        raise AssertionError("log(1) is not 0")
    return {"inputs": s.size, "max_ulp": float(errors[at]), "at": float(s[nonzero][at])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk-bits", type=int, default=24)
    parser.add_argument("--below", action="store_true", help="also every input below -87")
    parser.add_argument("--log-samples", type=int, default=10_000_000)
    args = parser.parse_args()
    chunk = 1 << args.chunk_bits
    started = time.perf_counter()
    exp = exp_sweep(chunk)
    print(
        f"exp: {exp['inputs']:,} inputs in [-87, -0]: max {exp['max_ulp']:.4f} ulp "
        f"(at d={exp['at']!r}), bound {EXP_BOUND} ulp; reduction exact; no subnormal "
        f"[{time.perf_counter() - started:.0f} s]"
    )
    if args.below:
        started = time.perf_counter()
        under = subnormal_sweep(chunk)
        print(
            f"exp: {under['inputs']:,} inputs in [-104, -87): error at most the bound's "
            f"relative error plus {under['excess']:.4f} subnormal ulp (2^-149)"
        )
        zeros = below_sweep(chunk)
        print(f"exp: {zeros:,} inputs below -104 give 0 [{time.perf_counter() - started:.0f} s]")
    started = time.perf_counter()
    log = log_sweep(args.log_samples)
    print(
        f"log: {log['inputs']:,} inputs in [1, 2^31]: max {log['max_ulp']:.4f} ulp "
        f"(at s={log['at']!r}), bound {LOG_BOUND} ulp [{time.perf_counter() - started:.0f} s]"
    )
    assert exp["max_ulp"] <= EXP_BOUND and log["max_ulp"] <= LOG_BOUND


if __name__ == "__main__":
    main()
