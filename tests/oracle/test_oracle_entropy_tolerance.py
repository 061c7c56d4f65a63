"""The fp32 entropy tolerance is sound (plain fp32 implementations of the three
evaluation styles never exceed it under a Hypothesis search that targets the worst
case, temperatures included) and tight (an adversarial row reaches a good part of it)."""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, target
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tp_logprob.oracle import (
    LogprobTolerance,
    apply_temperature,
    exact_entropy,
    exact_selected_logprob,
    tolerance,
)

F32 = np.float32
INF = math.inf
SETTINGS = settings(
    max_examples=int(os.environ.get("TP_LOGPROB_ORACLE_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

Partial = tuple[Any, Any, Any]


def _sum32(terms: np.ndarray, order: str) -> Any:
    if terms.size == 0:
        return F32(0)
    if order == "sequential":
        return F32(np.cumsum(terms, dtype=F32)[-1])
    return F32(terms.sum(dtype=F32))


def _terms32(z: np.ndarray, m: Any) -> tuple[np.ndarray, np.ndarray]:
    """``exp(d)`` and ``exp(d) d`` in fp32 with ``d = fl(z - m)``; a -inf column gives 0."""
    d = (z - m).astype(F32)
    e = np.exp(d)
    t = np.where(e > 0, (e * np.where(e > 0, d, F32(0))).astype(F32), F32(0))
    return e, t


def _shard32(z: np.ndarray, order: str) -> Partial:
    """Per-shard partial (m, s, q) in fp32; the identity for no finite column."""
    if z.size == 0 or z.max() == -INF:
        return F32(-INF), F32(0), F32(0)
    m = z.max()
    e, t = _terms32(z, m)
    return m, _sum32(e, order), _sum32(t, order)


def _merge(parts: list[Partial], dtype: Any) -> tuple[Any, Any, Any]:
    """``M, S, Q`` merged in shard order in ``dtype`` (np.float32 or np.float64)."""
    big_m = max(m for m, _, _ in parts)
    s_total, q_total = dtype(0), dtype(0)
    for m, s, q in parts:
        if m == -INF:
            continue
        gap = dtype(dtype(m) - dtype(big_m))
        scale = dtype(np.exp(gap))
        if scale == 0:
            continue  # the whole term is below 2^-149 (and gap * s may overflow)
        s_total = dtype(s_total + dtype(dtype(s) * scale))
        q_total = dtype(q_total + dtype(scale * dtype(dtype(q) + dtype(gap * dtype(s)))))
    return big_m, s_total, q_total


def _final(s: Any, q: Any) -> float:
    """``log S - Q / S`` in float64, rounded once to fp32."""
    s64, q64 = float(s), float(q)
    if not (s64 > 0 and math.isfinite(s64) and math.isfinite(q64)):
        return math.nan  # no finite live value, or a NaN / +inf one
    return float(F32(math.log(s64) - q64 / s64))


def fp32_sharded(z: np.ndarray, bounds: list[tuple[int, int]], order: str, merge: Any) -> float:
    """torch_native style: per-shard fp32 partials, merged once in shard order."""
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        _, s, q = _merge([_shard32(z[a:b], order) for a, b in bounds], merge)
    return _final(s, q)


def _online32(z: np.ndarray, lanes: int) -> Partial:
    """Online softmax over blocks of ``lanes`` columns: one (m, s, q) per lane,
    rescaled at every block whose max rises, then the lanes merged in fp32."""
    m = np.full(lanes, -INF, F32)
    s = np.zeros(lanes, F32)
    q = np.zeros(lanes, F32)
    for k in range(0, z.size, lanes):
        block = np.full(lanes, -INF, F32)
        block[: min(lanes, z.size - k)] = z[k : k + lanes]
        new_m = np.maximum(m, block)
        live = new_m > -INF
        first = live & (m == -INF)
        rise = live & ~first
        safe_new = np.where(live, new_m, F32(0))
        gap = np.where(rise, (m - safe_new).astype(F32), F32(0))
        scale = np.exp(gap)
        # A lane whose scale underflows to 0 restarts: its old terms are below
        # 2^-149 (and gap * s might overflow).
        first |= rise & (scale == 0)
        rise &= scale != 0
        e, t = _terms32(block, safe_new)
        q_new = (scale * (q + (gap * s).astype(F32)).astype(F32)).astype(F32)
        q = np.where(first, t, np.where(rise, (q_new + t).astype(F32), q))
        s = np.where(first, e, np.where(rise, ((s * scale).astype(F32) + e).astype(F32), s))
        m = new_m
    return _merge(list(zip(m, s, q, strict=True)), F32)


def fp32_online(z: np.ndarray, bounds: list[tuple[int, int]], lanes: int) -> float:
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        _, s, q = _merge([_online32(z[a:b], lanes) for a, b in bounds], np.float64)
    return _final(s, q)


def fp32_fixed_point(z: np.ndarray, bits: int) -> float:
    """The cross-TP construction: exp(d) and exp(d) d to int64 with `bits` fractional
    bits (floor, and truncation toward zero), summed exactly."""
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        e, t = _terms32(z, z.max())
    s_int = int(np.floor(np.ldexp(e.astype(np.float64), bits)).astype(np.int64).sum())
    q_int = int(np.trunc(np.ldexp(t.astype(np.float64), bits)).astype(np.int64).sum())
    return _final(F32(s_int) * F32(2.0**-bits), F32(q_int) * F32(2.0**-bits))


values = st.one_of(
    st.floats(-30, 30, width=32),
    st.floats(-1e4, 1e4, width=32),
    st.floats(-(2.0**-100), 2.0**-100, width=32),
    st.sampled_from([0.0, -16.635532, -15.942385, -1.0, 88.0, -88.0, -103.0, 3e38, -3e38]),
    st.just(-INF),
)
temperatures = st.one_of(
    st.sampled_from([1.0, 2.0, 0.5, 2.0**-20, 2.0**30, 0.7, 1.3, 1e-30, 1e30]),
    st.floats(1e-3, 1e3),
)

Case = tuple[np.ndarray, float, list[tuple[int, int]]]


@st.composite
def entropy_cases(draw: st.DrawFn) -> Case:
    """A fp32 row (runs of equal values and -inf, a dominant value), T and shards."""
    v = draw(st.integers(1, 80), label="columns")
    base = draw(st.floats(-1e6, 1e6, width=32) | st.just(0.0), label="offset")
    offsets = draw(hnp.arrays(F32, v, elements=values), label="values")
    runs = draw(st.lists(st.tuples(st.integers(0, v - 1), st.integers(1, 40)), max_size=3))
    for start, length in runs:
        offsets[start : start + length] = offsets[start]
    if draw(st.booleans(), label="dominant"):
        offsets[draw(st.integers(0, v - 1))] = F32(draw(st.floats(20, 120)))
    with np.errstate(over="ignore"):
        row = (offsets + F32(base)).astype(F32)
    t = draw(temperatures, label="temperature")
    cuts = draw(st.sets(st.integers(1, v - 1), max_size=7) if v > 1 else st.just(set()))
    return row, t, list(itertools.pairwise([0, *sorted(cuts), v]))


def _ratio(tol: LogprobTolerance, row: np.ndarray, t: float, got: float) -> float:
    """error / bound against the exact oracle (0 for a NaN entropy, which must match)."""
    want = exact_entropy(row[None, :], temperature=t)
    if not math.isfinite(want[0]):
        assert math.isnan(got)
        return 0.0
    _, lse = exact_selected_logprob(row[None, :], [0], temperature=t)
    z_max = float(apply_temperature(row, t).max())
    bound = tol.entropy_bound(want, lse=lse, row_max=[z_max])
    assert not tol.violations(
        [0.0], lse, [0.0], lse, row_max=[z_max], kernel_entropy=[got], exact_entropy=want
    ).any()
    return abs(got - float(want[0])) / float(bound[0])


def _search(label: str, run_case: Callable[[np.ndarray, float, list[tuple[int, int]]], float]):
    worst = [0.0]

    @SETTINGS
    @given(case=entropy_cases())
    @example(case=(np.array([0.0, *[-16.63553] * 63], F32), 1.0, [(0, 64)]))
    @example(case=(np.array([1e-30, -1e-30, 0.0, -INF], F32), 1e-30, [(0, 2), (2, 4)]))
    @example(case=(np.array([3e38, -3e38, 1.0], F32), 2.0**30, [(0, 1), (1, 3)]))
    def search(case: Case) -> None:
        ratio = run_case(*case)
        target(ratio, label="entropy error / bound")
        worst[0] = max(worst[0], ratio)
        assert ratio <= 1.0

    search()
    print(f"\n{label}: worst entropy error/bound {worst[0]:.3f}")
    return worst[0]


def _z32(row: np.ndarray, t: float) -> np.ndarray:
    return apply_temperature(row, t).astype(F32)


def _widest(bounds: list[tuple[int, int]]) -> int:
    return max(b - a for a, b in bounds)


@pytest.mark.parametrize(
    ("order", "merge"),
    [("sequential", np.float64), ("pairwise", np.float64), ("sequential", np.float32)],
    ids=["sequential, fp64 merge", "pairwise, fp64 merge", "sequential, fp32 merge"],
)
def test_fp32_sharded_entropy_within_tolerance(order: str, merge: Any) -> None:
    def run_case(row: np.ndarray, t: float, bounds: list[tuple[int, int]]) -> float:
        got = fp32_sharded(_z32(row, t), bounds, order, merge)
        n = row.size
        tol = tolerance("fp32", n, num_shards=len(bounds), max_shard_size=_widest(bounds))
        return _ratio(tol, row, t, got)

    _search(f"entropy, fp32 {order} shards, merge in {np.dtype(merge).name}", run_case)


@pytest.mark.parametrize("lanes", [16, 4])
def test_fp32_online_entropy_within_tolerance(lanes: int) -> None:
    def run_case(row: np.ndarray, t: float, bounds: list[tuple[int, int]]) -> float:
        got = fp32_online(_z32(row, t), bounds, lanes)
        widest = _widest(bounds)
        # Rescalings on a column's path: at most blocks - 1 per lane, the lane
        # merge and the shard merge.
        hops = -(-widest // lanes) + 1
        tol = tolerance(
            "fp32", row.size, num_shards=len(bounds), max_shard_size=widest, rescales=hops
        )
        return _ratio(tol, row, t, got)

    _search(f"entropy, fp32 online softmax ({lanes} lanes)", run_case)


def test_fp32_fixed_point_entropy_within_tolerance() -> None:
    def run_case(row: np.ndarray, t: float, bounds: list[tuple[int, int]]) -> float:
        z = _z32(row, t)
        if not (np.isfinite(z).any() and not np.isnan(z).any() and (z < INF).all()):
            return 0.0
        bits = 62 - math.ceil(math.log2(row.size)) if row.size > 1 else 62
        got = fp32_fixed_point(z, bits)
        tol = tolerance("fp32", row.size, rescales=0, fixed_point_bits=bits)
        return _ratio(tol, row, t, got)

    _search("entropy, fp32 fixed point", run_case)


def _half_ulp_row(n: int) -> np.ndarray:
    """0 and n - 1 copies of the smallest fp32 x with exp(x) > 2^-24: every sequential
    fp32 addition of S rounds up, the worst case of the any-order summation bound."""
    x = np.array([math.log(2.0**-24)], dtype=F32)
    while np.exp(x)[0] <= F32(2.0**-24):
        x = np.nextafter(x, F32(INF))
    row = np.full(n, x[0], dtype=F32)
    row[0] = 0.0
    return row


@pytest.mark.parametrize(("n", "low"), [(64, 0.45), (4096, 0.85)])
def test_entropy_bound_is_reached_by_sequential_summation(n: int, low: float) -> None:
    row = _half_ulp_row(n)
    got = fp32_sharded(row, [(0, n)], "sequential", np.float64)
    ratio = _ratio(tolerance("fp32", n), row, 1.0, got)
    print(f"\nhalf-ulp row of {n}: entropy error/bound {ratio:.3f}")
    assert low < ratio <= 1.0


def test_violations_judge_entropy_with_special_values_and_inactive_tokens() -> None:
    tol = tolerance("bf16", 8)
    exact_lse = np.array([1.0, 2.0, math.nan, 2.0, 2.0, 2.0])
    exact_h = np.array([1.0, 1.0, math.nan, 1.0, 0.0, 1.0])
    kernel_h = np.array([1.0 + 1e-7, 1.0 + 1e-3, math.nan, math.nan, 0.5, 1.0])
    active = np.array([True, True, True, True, False, True])
    zeros = np.zeros(6)
    bad = tol.violations(
        zeros, exact_lse, zeros, exact_lse, active_mask=active,
        kernel_entropy=kernel_h, exact_entropy=exact_h,
    )  # fmt: skip
    # row 1: off by 1e-3; row 3: NaN for a finite entropy; row 4: inactive but nonzero.
    assert bad.tolist() == [False, True, False, True, True, False]
    assert not tol.violations(zeros, exact_lse, zeros, exact_lse).any()
    with pytest.raises(ValueError, match="together"):
        tol.violations(zeros, exact_lse, zeros, exact_lse, kernel_entropy=kernel_h)
    with pytest.raises(ValueError, match="together"):
        tol.entropy_bound([1.0], lse=[2.0])


def test_entropy_bound_grows_with_vocab_and_is_tightened_by_lse() -> None:
    small, large = tolerance("fp32", 32), tolerance("fp32", 32000)
    assert small.entropy_bound([1.0])[0] < large.entropy_bound([1.0])[0]
    assert small.entropy_bound([0.1])[0] < small.entropy_bound([3.0])[0]
    loose = small.entropy_bound([1.0])[0]
    assert small.entropy_bound([1.0], lse=[5.1], row_max=[5.0])[0] < loose
    fixed = tolerance("fp32", 32, rescales=0, fixed_point_bits=56)
    assert fixed.entropy_bound([1.0])[0] < loose
