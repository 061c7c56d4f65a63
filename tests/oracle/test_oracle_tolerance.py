"""The tolerance table is sound (plain fp32 implementations never exceed it, under a
Hypothesis search that targets the worst case) and tight (an adversarial row
reaches it)."""

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

from tp_logprob.oracle import LogprobTolerance, exact_selected_logprob, tolerance

F32 = np.float32
INF = math.inf
# TP_LOGPROB_ORACLE_EXAMPLES raises the example count for a longer run by hand;
# run with -s to see the worst error/bound ratios found.
SETTINGS = settings(
    max_examples=int(os.environ.get("TP_LOGPROB_ORACLE_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def _sum32(terms: np.ndarray, order: str) -> Any:
    if order == "sequential":  # add.accumulate is strictly left to right
        return F32(np.cumsum(terms, dtype=F32)[-1])
    return F32(terms.sum(dtype=F32))  # numpy's pairwise summation


def _partial32(xs: np.ndarray, order: str, block: int | None) -> tuple[Any, Any]:
    """Shard partial (m, s) in fp32; the identity (-inf, 0) for no finite column."""
    if xs.size == 0 or xs.max() == -INF:
        return F32(-INF), F32(0)
    if block is None:
        m = xs.max()
        return m, _sum32(np.exp(xs - m), order)
    # Online softmax over blocks: rescale the running sum when the max grows.
    m, s = F32(-INF), F32(0)
    for k in range(0, xs.size, block):
        chunk = xs[k : k + block]
        new_m = max(m, chunk.max())
        if new_m == -INF:
            continue
        scale = F32(0) if m == -INF else np.exp(F32(m - new_m))
        s = F32(F32(s * scale) + _sum32(np.exp(chunk - new_m), order))
        m = new_m
    return m, s


def fp32_logprob(
    row: np.ndarray,
    target_index: int,
    bounds: list[tuple[int, int]],
    real_vocab_size: int,
    order: str,
    block: int | None = None,
    shift_first: bool = False,
) -> tuple[float, float]:
    """A plain fp32 max-shifted implementation: shard partials, merge in shard order.

    ``selected`` is ``x_t - lse``, or ``(x_t - M) - log S`` with ``shift_first``
    (the order of torch's CUDA log_softmax).
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        parts = [_partial32(row[a : min(b, real_vocab_size)], order, block) for a, b in bounds]
        big_m = max(m for m, _ in parts)
        total = F32(0)
        for m, s in parts:
            if m != -INF:
                total = F32(total + F32(s * np.exp(F32(m - big_m))))
        log_sum = np.log(total)  # no finite column: log(0) = -inf
        lse = F32(big_m + log_sum)
        if shift_first:
            return float(F32(F32(row[target_index] - big_m) - log_sum)), float(lse)
        return float(F32(row[target_index] - lse)), float(lse)


def fp32_fixed_point(
    row: np.ndarray, target_index: int, real_vocab_size: int, bits: int
) -> tuple[float, float]:
    """The cross-TP construction: exp(x - M) to int64 with `bits` fractional bits."""
    live = row[:real_vocab_size]
    big_m = live.max()
    terms = np.floor(np.ldexp(np.exp(live - big_m).astype(np.float64), bits)).astype(np.int64)
    total = F32(int(terms.sum())) * F32(2.0**-bits)
    lse = F32(big_m + np.log(total))
    return float(F32(row[target_index] - lse)), float(lse)


values = st.one_of(
    st.floats(-30, 30, width=32),
    st.floats(-1e4, 1e4, width=32),
    st.sampled_from([0.0, -16.635532, -16.635531, -15.942385, -17.328680, 88.0, -88.0]),
    st.just(-INF),
)


Case = tuple[np.ndarray, int, int, list[tuple[int, int]]]
RunCase = Callable[[np.ndarray, int, int, list[tuple[int, int]]], tuple[float, float]]


@st.composite
def fp32_cases(draw: st.DrawFn) -> Case:
    v = draw(st.integers(1, 64), label="columns")
    base = draw(st.floats(-1e6, 1e6, width=32) | st.just(0.0), label="offset")
    offsets = draw(hnp.arrays(F32, v, elements=values), label="values")
    with np.errstate(over="ignore"):
        row = (offsets + F32(base)).astype(F32)
    rv = draw(st.integers(1, v), label="real_vocab_size")
    finite = np.flatnonzero(np.isfinite(row[:rv]))
    pick = draw(st.integers(0, rv - 1), label="target")
    t = int(finite[pick % finite.size]) if finite.size else pick
    cuts = draw(st.sets(st.integers(1, v - 1), max_size=7) if v > 1 else st.just(set()))
    edges = [0, *sorted(cuts), v]
    return row, t, rv, list(itertools.pairwise(edges))


def _ratios(
    tol: LogprobTolerance, row: np.ndarray, t: int, rv: int, sel: float, lse: float
) -> tuple[float, float]:
    want_sel, want_lse = exact_selected_logprob(row[None, :], [t], real_vocab_size=rv)
    assert not tol.violations([sel], [lse], want_sel, want_lse, row_max=[row[:rv].max()]).any()
    if not (math.isfinite(want_lse[0]) and math.isfinite(want_sel[0])):
        return 0.0, 0.0
    row_max = [float(row[:rv].max())]
    lse_b = float(tol.lse_bound(want_lse, row_max=row_max)[0])
    sel_b = float(tol.selected_bound(want_sel, want_lse, row_max=row_max)[0])
    return abs(lse - float(want_lse[0])) / lse_b, abs(sel - float(want_sel[0])) / sel_b


def _search(label: str, run_case: RunCase) -> None:
    worst = {"lse": 0.0, "selected": 0.0}

    @SETTINGS
    @given(case=fp32_cases())
    # Small lse, large |selected|: (x_t - M) - log S rounds x_t - M first, which
    # the x_t - lse bound alone would miss by a factor of 1.9.
    @example(case=(np.array([-1.5713087, -16454.305, -1.64051], F32), 1, 3, [(0, 3)]))
    @example(case=(np.array([0.0, *[-16.63553] * 63], F32), 0, 64, [(0, 64)]))
    def search(case: Case) -> None:
        r_lse, r_sel = run_case(*case)
        target(r_lse, label="lse error / bound")
        target(r_sel, label="selected error / bound")
        worst["lse"] = max(worst["lse"], r_lse)
        worst["selected"] = max(worst["selected"], r_sel)
        assert r_lse <= 1.0 and r_sel <= 1.0

    search()
    print(f"\n{label}: worst lse/bound {worst['lse']:.3f}, selected/bound {worst['selected']:.3f}")


def _widest(bounds: list[tuple[int, int]], rv: int) -> int:
    return max(max(0, min(b, rv) - a) for a, b in bounds)


@pytest.mark.parametrize("shift_first", [False, True], ids=["x_t - lse", "(x_t - M) - log S"])
@pytest.mark.parametrize("order", ["sequential", "pairwise"])
def test_fp32_sharded_within_tolerance(order: str, shift_first: bool) -> None:
    def run_case(
        row: np.ndarray, t: int, rv: int, bounds: list[tuple[int, int]]
    ) -> tuple[float, float]:
        sel, lse = fp32_logprob(row, t, bounds, rv, order, shift_first=shift_first)
        widest = _widest(bounds, rv)
        tol = tolerance("fp32", rv, num_shards=len(bounds), max_shard_size=widest)
        return _ratios(tol, row, t, rv, sel, lse)

    form = "(x_t - M) - log S" if shift_first else "x_t - lse"
    _search(f"fp32 {order}, sharded, selected = {form}", run_case)


def test_fp32_online_softmax_within_tolerance() -> None:
    block = 4

    def run_case(
        row: np.ndarray, t: int, rv: int, bounds: list[tuple[int, int]]
    ) -> tuple[float, float]:
        sel, lse = fp32_logprob(row, t, bounds, rv, "sequential", block)
        widest = _widest(bounds, rv)
        blocks = -(-widest // block)
        tol = tolerance("fp32", rv, num_shards=len(bounds), max_shard_size=widest, rescales=blocks)
        return _ratios(tol, row, t, rv, sel, lse)

    _search("fp32 online softmax (blocks of 4), sharded", run_case)


def test_fp32_fixed_point_within_tolerance() -> None:
    def run_case(
        row: np.ndarray, t: int, rv: int, bounds: list[tuple[int, int]]
    ) -> tuple[float, float]:
        if not np.isfinite(row[:rv]).any():
            return 0.0, 0.0
        bits = 62 - rv.bit_length()
        sel, lse = fp32_fixed_point(row, t, rv, bits)
        tol = tolerance("fp32", rv, num_shards=len(bounds), rescales=0, fixed_point_bits=bits)
        return _ratios(tol, row, t, rv, sel, lse)

    _search("fp32 fixed point", run_case)


@pytest.mark.parametrize("n", [64, 4096])
def test_bound_is_reached_by_sequential_summation(n: int) -> None:
    # Terms just over half an ulp of the running sum make every fp32 addition
    # round up: the error approaches the any-order bound (n - 1) u.
    x = np.array([math.log(2.0**-24)], dtype=F32)
    while np.exp(x)[0] <= F32(2.0**-24):  # the smallest fp32 with exp(x) > 2^-24
        x = np.nextafter(x, F32(INF))
    row = np.full(n, x[0], dtype=F32)
    row[0] = 0.0
    _, lse = fp32_logprob(row, 0, [(0, n)], n, "sequential")
    _, want_lse = exact_selected_logprob(row[None, :], [0])
    bound = tolerance("fp32", n).lse_bound(want_lse, row_max=[0.0])[0]
    ratio = abs(lse - float(want_lse[0])) / float(bound)
    assert {64: 0.65, 4096: 0.95}[n] < ratio <= 1.0


def test_violations_special_values_and_inactive_tokens() -> None:
    tol = tolerance("bf16", 8)
    exact_sel = np.array([math.nan, math.nan, -INF, -3.0e38, -1.0, 0.0, -1.0])
    exact_lse = np.array([math.nan, INF, 2.0, 3.0e38, 2.0, 2.0, 2.0])
    kernel_sel = np.array([math.nan, math.nan, -INF, -INF, -1.0 - 1e-3, 5.0, -1.0])
    kernel_lse = np.array([math.nan, INF, 2.0, F32(3.0e38), 2.0, 2.0, math.nan])
    active = np.array([True, True, True, True, True, False, True])
    bad = tol.violations(kernel_sel, kernel_lse, exact_sel, exact_lse, active_mask=active)
    # row 3: fp32 overflow of a value past the fp32 range is accepted;
    # row 4: off by 1e-3; row 5: inactive but nonzero; row 6: NaN lse.
    assert bad.tolist() == [False, False, False, True, True, True, True]
    exact_sel[3] = -3.4028235e38 * (1 + 2.0**-20)
    bad = tol.violations(kernel_sel, kernel_lse, exact_sel, exact_lse, active_mask=active)
    assert not bad[3]


def test_bounds_grow_with_vocab_shards_and_magnitude() -> None:
    small, large = tolerance("fp32", 32), tolerance("fp32", 32000)
    assert small.lse_bound([1.0])[0] < large.lse_bound([1.0])[0]
    assert small.lse_bound([1.0])[0] < small.lse_bound([1e4])[0]
    assert small.sum_rel < tolerance("fp32", 32, num_shards=8).sum_rel
    assert tolerance("fp32", 32, num_shards=8, max_shard_size=4).sum_rel < small.sum_rel
    assert tolerance("fp16", 32).lse_bound([1.0]) == small.lse_bound([1.0])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"dtype": "int8", "vocab_size": 8}, ValueError, r"dtype='int8'"),
        ({"dtype": "fp64", "vocab_size": 8}, ValueError, r"dtype='fp64'"),
        ({"dtype": "bf16", "vocab_size": -1}, ValueError, r"vocab_size=-1"),
        ({"dtype": "bf16", "vocab_size": 8.0}, TypeError, r"vocab_size=8.0"),
        ({"dtype": "bf16", "vocab_size": 8, "num_shards": 0}, ValueError, r"num_shards=0"),
        ({"dtype": "bf16", "vocab_size": 8, "max_shard_size": 0}, ValueError, r"max_shard_size=0"),
        ({"dtype": "bf16", "vocab_size": 8, "exp_ulp": -1.0}, ValueError, r"exp_ulp=-1.0"),
        ({"dtype": "bf16", "vocab_size": 8, "log_abs": math.nan}, ValueError, r"log_abs=nan"),
    ],
    ids=[
        "int8",
        "fp64",
        "negative vocab",
        "float vocab",
        "no shards",
        "empty shard",
        "negative ulp",
        "nan abs",
    ],
)
def test_invalid_arguments(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        tolerance(**kwargs)
