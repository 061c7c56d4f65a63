"""The a-priori error bounds of the portable exp and log (``docs/tolerances.md``, "Portable
exp and log"), computed with mpmath.

Each bound is the sum of three parts, as in the derivation there:

- reduction: how far the computed reduced argument is from the exact one;
- approximation: ``max |P(r) / f(r) - 1|`` over the reduced range, the polynomial's own
  error with its coefficients as the exact binary numbers the code uses, at 60 digits,
  sampled on a grid and each local maximum refined by golden-section search;
- evaluation: a first-order running bound on the roundings of the fixed Horner order
  (each ``+ - * /`` errs by at most ``u |result|``), maximised over the same grid.

Run: python benchmarks/portable_bounds.py
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import mpmath

from tp_logprob.kernels import portable

GRID = 4096
U32 = 2.0**-24  # fp32 unit roundoff
U64 = 2.0**-53


def _local_max(error: Callable[[mpmath.mpf], mpmath.mpf], low: float, high: float) -> float:
    """The largest ``|error|`` on ``[low, high]``: a grid, then golden-section refinement."""
    points = [low + (high - low) * i / GRID for i in range(GRID + 1)]
    values = [abs(error(mpmath.mpf(p))) for p in points]
    best = max(values)
    step = (high - low) / GRID
    for i in range(1, GRID):
        if values[i] >= values[i - 1] and values[i] >= values[i + 1]:
            a, b = points[i] - step, points[i] + step
            for _ in range(60):
                c, d = b - (b - a) * 0.618, a + (b - a) * 0.618
                if abs(error(mpmath.mpf(c))) > abs(error(mpmath.mpf(d))):
                    b = d
                else:
                    a = c
            best = max(best, abs(error(mpmath.mpf((a + b) / 2))))
    return float(best)


def _horner(coefficients: Sequence[float], x: mpmath.mpf) -> mpmath.mpf:
    value = mpmath.mpf(coefficients[0])
    for c in coefficients[1:]:
        value = value * x + c
    return value


def exp_reduction_range() -> float:
    """``R``: every reduced argument ``d - n ln 2`` of an input in ``[-104, 0]``: ``|r| <= R``."""
    log2e = mpmath.mpf(portable.LOG2E)
    # |fl(d LOG2E) - d log2(e)| <= |d| |LOG2E - log2 e| + half an ulp of a value below 256.
    slack = 104 * abs(log2e - 1 / mpmath.log(2)) + 2.0**-17
    return float(mpmath.log(2) * (mpmath.mpf(0.5) + slack))


def exp_bound() -> dict[str, float]:
    """Relative error parts of ``portable_exp`` on ``[-104, 0]`` (before the final rounding
    into the subnormal range, below ``-87``), and the bound in ulps."""
    mpmath.mp.dps = 60
    big_r = exp_reduction_range()
    q = portable.EXP_COEFFICIENTS

    def approx(r: mpmath.mpf) -> mpmath.mpf:
        return (_horner(q, r) * r * r + r + 1) / mpmath.exp(r) - 1

    approximation = _local_max(approx, -big_r, big_r)
    ln2 = mpmath.log(2)
    split = abs(ln2 - mpmath.mpf(portable.LN2_HI) - mpmath.mpf(portable.LN2_LO))
    # r = fl(r_hi - fl(n LN2_LO)), r_hi exact: 150 |ln 2 - HI - LO|, the product's
    # rounding (half an ulp of at most 150 LN2_LO), and the subtraction's (u |r|).
    absolute = 150 * split + U32 * 150 * portable.LN2_LO
    reduction = float(absolute) + U32 * big_r  # exp(r + e) = exp(r)(1 + e + ...)

    def evaluation(r: float) -> float:
        # Magnitudes from the absolute-valued Horner (an upper bound on every |partial|).
        a = abs(r)
        value, error = abs(q[0]), 0.0
        for c in q[1:]:
            product = value * a
            error = error * a + U32 * product
            value = product + abs(c)
            error += U32 * value
        rr = a * a
        qrr = value * rr
        error_qrr = error * rr + value * U32 * rr + U32 * qrr
        w = qrr + a
        error_w = error_qrr + U32 * w
        p = float(_horner(q, mpmath.mpf(r)) * r * r + r + 1)
        return (error_w + U32 * abs(p)) / math.exp(r)

    points = [-big_r + 2 * big_r * i / GRID for i in range(GRID + 1)]
    rounding = max(evaluation(r) for r in points) * (1 + 8 * U32)
    total = approximation + reduction + rounding
    # One ulp of y in [2^e, 2^(e+1)) is 2^(e-23) >= y 2^-24.
    return {
        "R": big_r,
        "approximation": approximation,
        "reduction": reduction,
        "rounding": rounding,
        "relative": total,
        "ulps": total / U32,
    }


def log_bound() -> dict[str, float]:
    """Error parts of ``portable_log`` on ``[1, 2^62]`` relative to ``log s``, and the ulps."""
    mpmath.mp.dps = 60
    coefficients = portable.LOG_COEFFICIENTS
    # m <= SQRT2 (fp64 sqrt(2), just above the real one), or m = m' / 2 with m' > SQRT2.
    root = mpmath.mpf(portable.SQRT2)
    t_max = float(max((root - 1) / (root + 1), (1 - root / 2) / (1 + root / 2)))

    def approx(t: mpmath.mpf) -> mpmath.mpf:
        exact = mpmath.log((1 + t) / (1 - t))
        if t == 0:
            return mpmath.mpf(0)
        z = t * t
        return (2 * t + t * (_horner(coefficients, z) * z)) / exact - 1

    approximation = _local_max(approx, -t_max, t_max)
    # log(1+f) = 2t + t R(t^2) with t = fl(f / fl(f + 2)): t errs by 2u relative and
    # log(1+f) / t is in [2, 2.02], so 2.02 u; the roundings of t R (R < 0.03 of 2t's
    # size: 10 roundings there) and of the sum (u).
    log1p_rel = 2.02 * U64 + 0.03 * 10 * U64 + U64 + approximation
    # log s = e HI + (fl(e LO) + L): e HI exact (|e| <= 62, HI has 32 trailing zeros).
    worst = 0.0
    ln2 = math.log(2.0)
    split = abs(mpmath.log(2) - mpmath.mpf(portable.LN2_HI64) - mpmath.mpf(portable.LN2_LO64))
    for e in range(0, 63):
        for frac in (-0.3466, -0.2, -0.1, -1e-9, 1e-9, 0.1, 0.2, 0.3466):
            if e == 0 and frac < 0:
                continue
            log1p = frac
            value = e * ln2 + log1p
            inner = abs(e * portable.LN2_LO64 + log1p)
            # e = 0: 0 * LO, the inner sum and the outer one are exact (they add zeros).
            error = log1p_rel * abs(log1p)
            if e:
                error += e * float(split) + U64 * abs(e * portable.LN2_LO64)
                error += U64 * inner + U64 * abs(value)
            worst = max(worst, error / (abs(value) * U64))  # an ulp is >= |value| 2^-53
    return {"t_max": t_max, "approximation": approximation, "log1p_rel": log1p_rel, "ulps": worst}


def main() -> None:
    exp = exp_bound()
    print(
        f"exp: |r| <= {exp['R']:.9f}; relative errors: approximation {exp['approximation']:.3e}"
        f" ({exp['approximation'] / U32:.3f} u), reduction {exp['reduction']:.3e}"
        f" ({exp['reduction'] / U32:.3f} u), rounding {exp['rounding']:.3e}"
        f" ({exp['rounding'] / U32:.3f} u); bound {exp['ulps']:.3f} ulp"
    )
    log = log_bound()
    print(
        f"log: |t| <= {log['t_max']:.9f}; approximation {log['approximation']:.3e}"
        f" (2^{math.log2(log['approximation']):.2f}), log(1+f) relative"
        f" {log['log1p_rel'] / U64:.3f} u; bound {log['ulps']:.3f} ulp"
    )


if __name__ == "__main__":
    main()
