"""The fast path's enclosures hold: ``T``, ``S``, ``L = log S``, ``1/S``, the probabilities,
``P = sum exp(d)|d|``, ``P/S`` and the entropy, each against mpmath at 2,400 bits on drawn
rows (with and without counts). Run as a script, it prints how much of each radius the
measured error uses (the tightness quoted in docs/tolerances.md)."""

from __future__ import annotations

import os
import sys
from typing import Any

import mpmath
import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tp_logprob.oracle import _fast_grads as grads
from tp_logprob.oracle import _fast_rows as rows

SETTINGS = settings(
    max_examples=int(os.environ.get("TP_LOGPROB_ORACLE_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
_MP = mpmath.MPContext()
_MP.prec = 2400  # c + T keeps a T of exp(-1100) = 2^-1587 to 800 bits
_SCALE = _MP.mpf(2) ** rows.SHIFT

values = st.one_of(
    st.floats(-30, 30),
    st.floats(-1100, 0),
    st.floats(-1e-5, 1e-5),
    st.sampled_from([0.0, -745.0, -1000.0, -1001.0, -np.inf]),
)
rows_strategy = hnp.arrays(np.float64, st.integers(1, 40), elements=values)


def _truth(x: np.ndarray, counts: np.ndarray | None) -> dict[str, Any]:
    w = [1] * x.size if counts is None else [int(c) for c in counts]
    finite = [(_MP.mpf(float(v)), c) for v, c in zip(x.tolist(), w, strict=True) if v > -np.inf]
    top = max(v for v, _ in finite)
    # T apart from the max's count: 1 + T would lose a T below 2^-500.
    t = _MP.fsum(c * _MP.exp(v - top) for v, c in finite if v < top)
    count_max = sum(c for v, c in finite if v == top)
    s = count_max + t
    log_s = _MP.log(count_max) + _MP.log1p(t / count_max)
    p = _MP.fsum(c * _MP.exp(v - top) * (top - v) for v, c in finite)
    probs = [_MP.exp(_MP.mpf(float(v)) - top) / s if v > -np.inf else 0 for v in x.tolist()]
    return {
        "T": t * _SCALE,
        "S": s,
        "L": log_s,
        "Ls": log_s * _SCALE,
        "R": 1 / s,
        "p": [v * _SCALE for v in probs],
        "P": p * _SCALE,
        "rho": p / s * _SCALE,
        "H": (log_s + p / s) * _SCALE,
    }


def _use(name: str, want: Any, hi: float, lo: float, rad: float, record: dict[str, float]) -> None:
    err = abs(_MP.mpf(hi) + _MP.mpf(lo) - want)
    assert err <= _MP.mpf(rad), (name, float(err), rad)
    if rad > 0 and np.isfinite(rad):
        record[name] = max(record.get(name, 0.0), float(err / _MP.mpf(rad)))


def check_row(x: np.ndarray, counts: np.ndarray | None, record: dict[str, float]) -> None:
    finite = x[x > -np.inf]
    if finite.size == 0:
        return
    m = np.array([finite.max()])
    terms = rows.build_terms(x[None, :], m, None if counts is None else counts[None, :])
    want = _truth(x, counts)
    _use("T", want["T"], terms.t_h[0], terms.t_l[0], terms.t_rad[0], record)
    s = rows.row_sum(terms)
    _use("S", want["S"], s.hi[0], s.lo[0], s.rad[0], record)
    plain, scaled = rows.log_sum(terms)
    _use("L", want["L"], plain.hi[0], plain.lo[0], plain.rad[0], record)
    _use("L scaled", want["Ls"], scaled.hi[0], scaled.lo[0], scaled.rad[0], record)
    r_h, r_l, rel = grads.reciprocal(terms)
    _use("1/S", want["R"], r_h[0], r_l[0], float(want["R"] * rel[0] * 1.0000001), record)
    probs = grads.probabilities(terms, r_h, r_l, rel)
    for i, p in enumerate(want["p"]):
        if terms.head[0, i] or terms.is_max[0, i]:
            _use("p", p, probs.hi[0, i], probs.lo[0, i], probs.rad[0, i], record)
    neg_q = grads.neg_q_terms(terms)
    _use("P", want["P"], neg_q.hi[0], neg_q.lo[0], neg_q.rad[0], record)
    rho = grads.ratio(neg_q, r_h, r_l, rel)
    _use("P/S", want["rho"], rho.hi[0], rho.lo[0], rho.rad[0], record)
    # The certified results are the correctly rounded true values.
    h, h_ok = grads.entropy(scaled, rho)
    if h_ok[0]:
        assert h[0] == float(want["H"] / _SCALE)
    lse, lse_ok = rows.lse(terms, plain)
    if lse_ok[0]:
        assert lse[0] == float(_MP.mpf(float(m[0])) + want["L"])


@SETTINGS
@given(x=rows_strategy, with_counts=st.booleans(), seed=st.integers(0, 2**32 - 1))
@example(x=np.array([0.0, -1e-6, -1e-6]), with_counts=False, seed=0).via("S - 1 near 2")
@example(x=np.array([0.0, -700.0]), with_counts=False, seed=0).via("T tiny, series branch")
@example(x=np.array([0.0, -20.0, -20.5]), with_counts=False, seed=0).via("T near 2^-30")
@example(x=np.array([-703.0] + [0.0] * 32), with_counts=False, seed=0).via("1/S low part subnormal")
def test_enclosures_hold(x: np.ndarray, with_counts: bool, seed: int) -> None:
    with np.errstate(all="ignore"):  # the drivers run rows this way
        counts = None
        if with_counts:
            counts = np.random.default_rng(seed).integers(1, 2**20, x.size).astype(np.float64)
        check_row(x, counts, {})


def main() -> None:
    rng = np.random.default_rng(0)
    record: dict[str, float] = {}
    with np.errstate(all="ignore"):
        for k in range(int(sys.argv[1]) if len(sys.argv) > 1 else 300):
            size = int(rng.integers(2, 200))
            x = rng.standard_normal(size) * rng.choice([0.01, 1.0, 4.0, 30.0, 300.0])
            counts = rng.integers(1, 1000, size).astype(np.float64) if k % 2 else None
            check_row(x, counts, record)
    for name, ratio in record.items():
        print(f"{name:10s} worst error / radius {ratio:.3g}")


if __name__ == "__main__":
    main()
