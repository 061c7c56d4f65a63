"""The fast path's exp: its error-free building blocks, its argument reduction, and its claimed
relative error ``EXP_REL`` checked against mpmath at 400 bits (sound, and within 8x of the
worst error measured)."""

from __future__ import annotations

import math
import os
from fractions import Fraction

import mpmath
import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tp_logprob.oracle import _eft
from tp_logprob.oracle._fast_exp import (
    D_MIN,
    R_MAX,
    RL_MAX,
    exp_error_terms,
    exp_rel,
    exp_terms,
    reduce,
    tables,
)

SETTINGS = settings(
    max_examples=int(os.environ.get("TP_LOGPROB_ORACLE_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
_MP = mpmath.MPContext()
_MP.prec = 400
_C = _MP.log(2) / 1024


def _relative_errors(dh: np.ndarray, dl: np.ndarray, shift: int) -> np.ndarray:
    yh, yl = exp_terms(dh, dl if dl.any() else None, shift)
    out = []
    for h, lo, a, b in zip(yh.tolist(), yl.tolist(), dh.tolist(), dl.tolist(), strict=True):
        want = _MP.exp(_MP.mpf(a) + _MP.mpf(b)) * _MP.mpf(2) ** shift
        out.append(float(abs((_MP.mpf(h) + _MP.mpf(lo)) / want - 1)))
    return np.array(out)


floats = st.floats(allow_nan=False, allow_infinity=False)


@SETTINGS
@given(a=floats, b=floats)
def test_two_sum_and_two_prod_are_exact(a: float, b: float) -> None:
    if not (abs(a) < 2.0**990 and abs(b) < 2.0**990):
        return
    s, e = _eft.two_sum(np.array([a]), np.array([b]))
    assert Fraction(float(s[0])) + Fraction(float(e[0])) == Fraction(a) + Fraction(b)
    if not 2.0**-960 < abs(a * b) < 2.0**990:
        return  # Dekker's product is exact only without underflow or overflow
    p, q = _eft.two_prod(np.array([a]), np.array([b]))
    assert Fraction(float(p[0])) + Fraction(float(q[0])) == Fraction(a) * Fraction(b)


@SETTINGS
@given(values=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=300))
def test_tree_sum_error_within_its_factor(values: list[float]) -> None:
    a = np.array([values])
    root, err = _eft.tree_sum(a)
    exact = sum((Fraction(v) for v in values), Fraction(0))
    got = Fraction(float(root[0])) + Fraction(float(err[0]))
    bound = _eft.tree_error_factor(len(values)) * _eft.U * float(np.abs(a).sum()) * 1.01
    assert abs(got - exact) <= Fraction(bound)


def test_table_and_reduction_constants() -> None:
    t = tables()
    for j in (0, 1, 511, 1023):
        want = _MP.power(2, _MP.mpf(j) / 1024)
        assert abs(_MP.mpf(t.th[j]) + _MP.mpf(t.tl[j]) - want) <= want * _MP.mpf(2) ** -105
    assert Fraction(t.c1).denominator <= 2**42 and Fraction(t.c2).denominator <= 2**74
    assert abs(_MP.mpf(t.c1) + _MP.mpf(t.c2) + _MP.mpf(t.c3) - _C) <= _MP.mpf(2) ** -127
    # k C1 and k C2 are exact for |k| < 2^21: each constant fits in 32 bits.
    for c in (t.c1, t.c2):
        mantissa = Fraction(c).numerator
        assert mantissa < 2**32


def _reduction_edges() -> np.ndarray:
    # Arguments just inside and outside the rounding boundaries of k, at the largest |k|.
    t = tables()
    ks = np.array([0.0, 1.0, 2.0, 700.0, 1_477_319.0, 1_477_320.0])
    mid = -(ks + 0.5) / t.inv_c
    around = [np.nextafter(mid, 0.0), mid, np.nextafter(mid, -np.inf)]
    edges = np.concatenate([*around, [0.0, -5e-324, -1e-300, D_MIN, -(2.0**-12)]])
    return edges[edges >= D_MIN]


def test_reduced_argument_bounds() -> None:
    rng = np.random.default_rng(3)
    dh = np.concatenate([_reduction_edges(), -rng.uniform(0.0, -D_MIN, 5000)])
    dl = np.where(rng.random(dh.size) < 0.5, 0.0, np.spacing(dh) * rng.uniform(-0.5, 0.5, dh.size))
    k, rh, rl = reduce(dh, dl)
    assert np.abs(rh).max() <= R_MAX
    assert np.abs(rl).max() <= RL_MAX
    for i in range(0, dh.size, 97):
        exact = _MP.mpf(float(dh[i])) + _MP.mpf(float(dl[i])) - int(k[i]) * _C
        assert abs(exact - _MP.mpf(float(rh[i])) - _MP.mpf(float(rl[i]))) <= _MP.mpf(2) ** -104


@SETTINGS
@given(
    dh=st.floats(D_MIN, 0.0) | st.floats(-1e-3, 0.0) | st.sampled_from(_reduction_edges().tolist()),
    frac=st.floats(-0.5, 0.5),
    shift=st.sampled_from([0, 600]),
)
@example(dh=-0.5 / 1477.3197218702985, frac=0.0, shift=600)
@example(dh=D_MIN, frac=0.5, shift=600)
def test_exp_terms_within_exp_rel(dh: float, frac: float, shift: int) -> None:
    if shift == 0 and dh < -660:
        return  # the low part would be subnormal: callers pass a shift that avoids it
    dl = frac * math.ulp(dh) if dh else 0.0
    err = _relative_errors(np.array([dh]), np.array([dl]), shift)
    assert err[0] <= exp_rel()


def test_exp_rel_is_sound_and_tight() -> None:
    rng = np.random.default_rng(11)
    wide, near = -rng.uniform(0, -D_MIN, 3000), -rng.uniform(0, 1, 3000)
    dh = np.concatenate([wide, near, _reduction_edges()])
    worst = _relative_errors(dh, np.zeros_like(dh), 600).max()
    assert worst <= exp_rel()
    assert worst >= exp_rel() / 8, (worst, exp_rel())  # the bound is not loose by orders
    assert sum(exp_error_terms().values()) <= exp_rel()
