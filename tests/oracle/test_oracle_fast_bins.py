"""The binned first phase of the fast path: its table, its polynomial and its enclosure of
``W = sum exp(x - M')`` hold against mpmath, and every ``lse`` / ``selected_logp`` it
certifies is the Ziv loop's value, bit for bit, on drawn rows and constructed hard ones."""

from __future__ import annotations

import math
import os

import mpmath
import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tp_logprob.oracle import _fast_bins as bins
from tp_logprob.oracle import _fast_drivers as drivers
from tp_logprob.oracle import exact_selected_logprob
from tp_logprob.oracle.fast_path import slow_path_only

SETTINGS = settings(
    max_examples=int(os.environ.get("TP_LOGPROB_ORACLE_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
_MP = mpmath.MPContext()
_MP.prec = 2400

values = st.one_of(
    st.floats(-30, 30),
    st.floats(-30, 30).map(lambda v: float(np.float32(v))),
    st.floats(-1100, 0),
    st.floats(-1e-5, 1e-5),
    st.floats(-1e6, 1e6),
    st.floats(-1e-300, 1e-300),
    st.sampled_from([0.0, -63.9, -64.0, -64.1, -745.0, -1000.0, -np.inf]),
)
rows_strategy = hnp.arrays(np.float64, st.integers(1, 40), elements=values)


def _w_truth(x: np.ndarray, counts: np.ndarray | None, m_grid: float) -> mpmath.mpf:
    w = [1] * x.size if counts is None else [int(c) for c in counts]
    top = _MP.mpf(m_grid)
    return _MP.fsum(
        c * _MP.exp(_MP.mpf(float(v)) - top)
        for v, c in zip(x.tolist(), w, strict=True)
        if v > -np.inf
    )


def test_table_holds_exp_at_every_checked_bin() -> None:
    tables = bins.bin_tables()
    for j in [0, 1, 2, 255, 256, 4097, bins.TAIL_BIN - 1]:
        want = _MP.exp((1 - j) * _MP.mpf(2) ** -bins.Q)
        limbs = sum(
            _MP.mpf(float(v)) * _MP.mpf(2) ** (-bins.LIMB_BITS * (k + 1))
            for k, v in enumerate(tables.limbs[j])
        )
        assert abs(limbs - want) <= bins.LIMB_ERR, j
        assert abs(_MP.mpf(float(tables.gh[j])) - want) <= 2.0**-53 * want * 1.0001, j
        assert all(0 <= v < 2**30 and v == int(v) for v in tables.limbs[j])
    assert not tables.limbs[bins.TAIL_BIN].any()
    assert tables.gh[bins.TAIL_BIN] == 0.0


def test_polynomial_error_within_its_bound_and_not_far_below() -> None:
    rng = np.random.default_rng(5)
    beta = np.concatenate([rng.uniform(-0.5, 0.5, 3000), [-0.5, 0.5, 0.0, 2.0**-60, -(2.0**-1070)]])
    grid = beta * 2.0**-bins.Q
    # Values x = beta 2^-Q put beta on the grid directly (rint(x 2^Q) = 0 or +-1 at the ends).
    _, e = _e_values(grid)
    worst = 0.0
    for b, got in zip(grid.tolist(), e.tolist(), strict=True):
        t = b * 2.0**bins.Q
        frac = t - round(t)
        want = _MP.expm1(_MP.mpf(frac) * _MP.mpf(2) ** -bins.Q)
        err = float(abs(_MP.mpf(got) - want))
        assert err <= bins.ERR_E, b
        worst = max(worst, err)
    assert worst >= bins.ERR_E / 16
    assert abs(e).max() <= bins.E_MAX


def _e_values(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The per-value ``e`` of :func:`._fast_bins._row_bins` (its Horner form), for a check."""
    c = bins.bin_tables().coeffs
    t = x * bins.SCALE_Q
    beta = t - np.rint(t)
    e = beta * c[4]
    for k in (3, 2, 1, 0):
        e = (e + c[k]) * beta
    return beta, e


def _check_enclosure(x: np.ndarray, counts: np.ndarray | None) -> float | None:
    finite = x[x > -np.inf]
    if finite.size == 0 or abs(finite.max()) >= bins.M_LIMIT:
        return None
    m = np.array([finite.max()])
    got = bins.bin_sums(x[None, :], m, None if counts is None else counts[None, :])
    assert got.m_grid[0] <= m[0] < got.m_grid[0] + 2.0**-bins.Q
    want = _w_truth(x, counts, float(got.m_grid[0]))
    assert want >= 1
    err = abs(_MP.mpf(float(got.w.hi[0])) + _MP.mpf(float(got.w.lo[0])) - want)
    rad = _MP.mpf(float(got.w.rad[0]))
    assert err <= rad, (float(err), float(rad))
    return float(rad / want)


@SETTINGS
@given(row=rows_strategy)
@example(row=np.array([5.0, -np.inf]))
@example(row=np.array([0.0, -1100.0, -745.0, -744.4, -np.inf]))
@example(row=np.array([1e6, 1e6 - 63.99, 1e6 - 64.01, 1e6 - 700.0]))
@example(row=np.array([2.0**-1074, 0.0, -(2.0**-1074)]))
def test_w_enclosure_holds(row: np.ndarray) -> None:
    _check_enclosure(row, None)


@SETTINGS
@given(
    row=rows_strategy,
    counts=hnp.arrays(np.float64, 40, elements=st.integers(1, 2**16).map(float)),
)
def test_w_enclosure_holds_with_counts(row: np.ndarray, counts: np.ndarray) -> None:
    _check_enclosure(row, counts[: row.size])


@SETTINGS
@given(
    near=hnp.arrays(np.float64, st.integers(1, 39), elements=st.floats(-0.49, 0.49)),
    peak_steps=st.integers(30 << bins.Q, 60 << bins.Q),
    counts=hnp.arrays(np.float64, 41, elements=st.integers(1, 2**16).map(float)),
)
def test_w_enclosure_holds_both_ways_of_summing_y(
    near: np.ndarray, peak_steps: int, counts: np.ndarray
) -> None:
    """``Y`` is summed pairwise where its dot product's bound, ``gamma(bins) sum gh |E|``,
    is not negligible (values near the maximum, one with ``e`` about ``2^-10`` and a
    count of ``2^10``), and by one dot product where it is (a maximum on the grid, so
    ``e = 0``, at least 30 above every value with ``e != 0``): both enclosures hold,
    and each way is the one taken."""
    row = np.append(0.3 * 2.0**-bins.Q, near)  # beta = 0.3: e = exp(0.3 2^-8) - 1
    counts = counts[: row.size + 1].copy()
    counts[0] = 2.0**10
    folds = []
    fold = bins.pairwise_sum

    def counted(a: np.ndarray) -> np.ndarray:
        folds.append(a.shape)
        return fold(a)

    bins.pairwise_sum = counted  # type: ignore[assignment]
    try:
        _check_enclosure(row, counts[: row.size])
        assert len(folds) == 1
        _check_enclosure(np.append(row, peak_steps * 2.0**-bins.Q), counts)
        assert len(folds) == 1
    finally:
        bins.pairwise_sum = fold  # type: ignore[assignment]


def _phase_one(x: np.ndarray, target: np.ndarray, every_row: bool = True) -> drivers.Selected:
    """The first phase alone; ``every_row`` lifts its cost rule (bins per value), so that
    narrow drawn rows exercise it too."""
    n = x.shape[0]
    out = drivers.Selected(np.zeros(n), np.zeros(n, bool), np.zeros(n), np.zeros(n, bool))
    target_values = x[np.arange(n), target]
    saved = drivers._BINS_PER_VALUE
    drivers._BINS_PER_VALUE = math.inf if every_row else saved
    try:
        with np.errstate(all="ignore"):
            batch = drivers._batch(x, None)
            drivers._binned_selected(batch, target_values, np.ones(n, bool), out)
    finally:
        drivers._BINS_PER_VALUE = saved
    return out


def _assert_phase_one_exact(x: np.ndarray, target: np.ndarray) -> drivers.Selected:
    got = _phase_one(x, target)
    with slow_path_only():
        want_sel, want_lse = exact_selected_logprob(x, target)
    for i in range(x.shape[0]):
        if got.lse_ok[i]:
            assert got.lse[i] == want_lse[i] and math.copysign(1, got.lse[i]) == math.copysign(
                1, want_lse[i]
            ), (i, got.lse[i], want_lse[i])
        if got.selected_ok[i]:
            assert got.selected[i] == want_sel[i], (i, got.selected[i], want_sel[i])
    return got


@SETTINGS
@given(row=rows_strategy, data=st.data())
@example(row=np.array([5.0, -np.inf]), data=None)
@example(row=np.array([0.0, -1100.0, -745.0]), data=None)
@example(row=np.array([0.0, 0.0, -1e-300]), data=None)
@example(row=np.array([-744.0, -1488.0, 2.0**-1074]), data=None)
def test_phase_one_certifies_only_correctly_rounded_values(
    row: np.ndarray, data: st.DataObject | None
) -> None:
    target = 0 if data is None else data.draw(st.integers(0, row.size - 1), label="target")
    if not (row > -np.inf).any():
        return
    _assert_phase_one_exact(row[None, :], np.array([target]))


def test_near_halfway_rows_are_left_or_exact() -> None:
    """Rows whose exact values sit closer to a rounding boundary than any enclosure
    resolves: a target on a midpoint with a dropped tail, an lse that cancels to a tiny
    value, ties at -log c; the first phase must leave them or agree."""
    half = 2.0**-53
    hard = [
        ([1.0 + half, -2000.0], 0),
        ([2.0**53 + 1.0, 2.0**53 - 1100.0], 1),
        ([-math.log(2.0), -math.log(2.0)], 0),
        ([-math.log(3.0)] * 3, 2),
        ([0.0, -800.0], 0),
        ([0.0, -40.0, -40.0], 0),
        ([1000.0, 1000.0 - 2.0**-40], 1),
    ]
    for values, target in hard:
        _assert_phase_one_exact(np.array([values]), np.array([target]))


def test_phase_one_settles_random_wide_rows() -> None:
    rng = np.random.default_rng(11)
    for scale in (1.0, 4.0):
        x = (rng.standard_normal((8, 8192)) * scale).astype(np.float32).astype(np.float64)
        target = rng.integers(0, 8192, 8)
        got = _assert_phase_one_exact(x, target)
        assert got.lse_ok.sum() >= 7 and got.selected_ok.sum() >= 7, scale


def test_narrow_rows_skip_phase_one() -> None:
    # 1,024 values spread over about 26 units: some 6,600 bins, more than twice the values.
    x = np.random.default_rng(3).standard_normal((4, 1024)) * 4
    assert not _phase_one(x, np.zeros(4, dtype=int), every_row=False).lse_ok.any()
    assert _phase_one(x, np.zeros(4, dtype=int)).lse_ok.all()
