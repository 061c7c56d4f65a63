"""The exact sampling support against a brute-force evaluation of the rules in mpmath,
on drawn rows and on rows built to sit on the rules' boundaries (ties at the k-th
value, masses one ulp either side of top_p, min_p inside a tie), with the
multi-precision fallback exercised and the fast path compared with the slow one."""

from __future__ import annotations

import math
import os
from typing import Any

import mpmath
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tp_logprob.oracle import (
    FastPathCounts,
    exact_support,
    fast_path_stats,
    replayed_support_mask,
)
from tp_logprob.oracle.fast_path import slow_path_only

SETTINGS = settings(
    max_examples=int(os.environ.get("TP_LOGPROB_ORACLE_EXAMPLES", "80")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
INF = math.inf
# A private context: the global mpmath precision is never touched.
_MP = mpmath.MPContext()
_MP.prec = 2000


def brute_support(
    z: np.ndarray, top_k: int | None, top_p: float | None, min_p: float | None
) -> np.ndarray | None:
    """The rules of docs/semantics.md read literally, at 2000 bits; None when undefined."""
    if np.isnan(z).any() or (z == INF).any() or not (z > -INF).any():
        return None
    top = _MP.mpf(float(z.max()))
    mass = [_MP.zero if v == -INF else _MP.exp(_MP.mpf(float(v)) - top) for v in z]
    keep = np.ones(z.size, dtype=bool)
    top_p = None if top_p == 1.0 else top_p  # off, as min_p = 0 is (it keeps every mass)
    if min_p is not None:
        keep &= np.array([m >= _MP.mpf(min_p) for m in mass])
    if top_k is not None:
        survivors = np.sort(z[keep])[::-1]
        if survivors.size >= top_k:
            keep &= z >= survivors[top_k - 1]
    if top_p is not None:
        kept = np.flatnonzero(keep)
        total = _MP.fsum(mass[u] for u in kept)
        keep = np.zeros(z.size, dtype=bool)
        for v in kept:
            above = _MP.fsum(mass[u] for u in kept if z[u] > z[v])
            keep[v] = above < _MP.mpf(top_p) * total
    return keep


def _tempered(x: np.ndarray, temperature: float) -> np.ndarray:
    if temperature == 1.0:
        return x.astype(np.float64)
    return (x.astype(np.float32) / np.float32(temperature)).astype(np.float64)


def _check(x: np.ndarray, temperature: float = 1.0, **rules: Any) -> Any:
    """exact_support on one row, fast and slow, against the brute force."""
    got = exact_support(x[None, :], temperature=temperature, **rules)
    with slow_path_only():
        slow = exact_support(x[None, :], temperature=temperature, **rules)
    want = brute_support(_tempered(x, temperature), **{**_OFF, **rules})
    assert np.array_equal(got.mask, slow.mask)
    if want is None:
        assert not got.defined[0] and not got.mask.any() and got.size[0] == 0
        assert math.isnan(got.threshold[0])
        return got
    assert got.mask[0].tolist() == want.tolist(), (x.tolist(), rules)
    z = _tempered(x, temperature)
    assert got.threshold[0] == z[want].min()
    assert got.size[0] == want.sum()
    return got


_OFF: dict[str, Any] = {"top_k": None, "top_p": None, "min_p": None}

rows = hnp.arrays(
    np.float32,
    st.integers(1, 24),
    elements=st.one_of(
        st.floats(-40, 40, width=32),
        st.sampled_from([0.0, 1.0, -1.0, 2.0, -INF]),  # ties and -inf
    ),
)
top_ks = st.one_of(st.none(), st.integers(1, 8))
top_ps = st.one_of(st.none(), st.sampled_from([0.5, 0.9, 1.0]), st.floats(1e-6, 1.0))
min_ps = st.one_of(st.none(), st.sampled_from([0.0, 0.1, 1.0]), st.floats(0.0, 1.0))


@SETTINGS
@given(x=rows, top_k=top_ks, top_p=top_ps, min_p=min_ps, t=st.sampled_from([1.0, 0.6, 3.0]))
@example(x=np.array([1.0, 1.0, 0.0], np.float32), top_k=1, top_p=None, min_p=None, t=1.0)
@example(x=np.array([-INF, -INF], np.float32), top_k=None, top_p=0.5, min_p=None, t=1.0)
def test_matches_brute_force(
    x: np.ndarray, top_k: int | None, top_p: float | None, min_p: float | None, t: float
) -> None:
    _check(x, t, top_k=top_k, top_p=top_p, min_p=min_p)


def _mass_ratio(z: np.ndarray, v: int) -> Any:
    """``A_v / Z`` over the whole row, exactly enough to find the floats around it."""
    top = _MP.mpf(float(z.max()))
    mass = [_MP.zero if w == -INF else _MP.exp(_MP.mpf(float(w)) - top) for w in z]
    return _MP.fsum(m for m, w in zip(mass, z, strict=True) if w > z[v]) / _MP.fsum(mass)


def _floats_around(value: Any) -> tuple[float, float]:
    """The largest float below and the smallest float above a non-float real."""
    nearest = float(value)
    if _MP.mpf(nearest) < value:
        return nearest, float(np.nextafter(nearest, INF))
    return float(np.nextafter(nearest, -INF)), nearest


@SETTINGS
@given(
    x=hnp.arrays(np.float32, st.integers(2, 20), elements=st.floats(-20, 20, width=32)),
    pick=st.integers(0, 63),
)
def test_top_p_one_ulp_either_side_of_the_mass(x: np.ndarray, pick: int) -> None:
    """At the float just above ``A_v / Z`` the value ``z_v`` is kept, just below it dropped."""
    z = x.astype(np.float64)
    v = pick % z.size
    if z[v] == z.max():
        return
    below, above = _floats_around(_mass_ratio(z, v))
    fast_path_stats(reset=True)
    assert exact_support(x[None], top_p=above).mask[0, v]
    assert not exact_support(x[None], top_p=below).mask[0, v]
    assert fast_path_stats()["support_top_p"].fallbacks >= 1  # no enclosure is that narrow
    _check(x, top_p=above)
    _check(x, top_p=below)


@pytest.mark.parametrize("tie", [1, 3])
def test_min_p_one_ulp_either_side_inside_a_tie(tie: int) -> None:
    x = np.array([0.0, *([-1.25] * tie), -3.0], np.float32)
    below, above = _floats_around(_MP.exp(_MP.mpf(-1.25)))
    fast_path_stats(reset=True)
    kept = exact_support(x[None], min_p=below).mask[0]
    assert kept.tolist() == [True] + [True] * tie + [False]
    dropped = exact_support(x[None], min_p=above).mask[0]
    assert dropped.tolist() == [True] + [False] * tie + [False]
    assert fast_path_stats()["support_min_p"].fallbacks == 2
    _check(x, min_p=below)
    _check(x, min_p=above)


BOUNDARY_ROWS = [
    # (row, rules, kept)
    pytest.param([3.0, 2.0, 2.0, 2.0, 1.0], {"top_k": 2}, [1, 1, 1, 1, 0], id="tie-at-kth"),
    pytest.param([5.0, 1.0, 5.0], {"top_k": 1}, [1, 0, 1], id="top_k=1-tied-max"),
    pytest.param([0.0, 0.0, 0.0], {"top_p": 1e-9}, [1, 1, 1], id="tie-at-max-kept-by-top_p"),
    pytest.param([0.0, -INF, -1.0], {"top_k": 3}, [1, 1, 1], id="top_k-keeps--inf"),
    pytest.param(
        [0.0, -INF, -1.0], {"top_k": 3, "top_p": 0.9999}, [1, 0, 1], id="top_p-drops--inf"
    ),
    pytest.param([0.0, -INF, -1.0], {"min_p": 0.0, "top_p": 1.0}, [1, 1, 1], id="rules-off"),
    pytest.param([2.0, 2.0, 1.0], {"min_p": 1.0}, [1, 1, 0], id="min_p=1-tied-max"),
    pytest.param([0.0, -1e-30], {"min_p": 1.0}, [1, 0], id="min_p=1-just-below-max"),
    pytest.param([0.0, -744.0, -745.0], {"min_p": 5e-324}, [1, 1, 0], id="min_p-subnormal"),
    pytest.param(
        [0.0, -1.0, -1.0, -5.0], {"min_p": 0.01, "top_k": 2}, [1, 1, 1, 0], id="k-after-p"
    ),
]


@pytest.mark.parametrize(("row", "rules", "kept"), BOUNDARY_ROWS)
def test_boundary_rows(row: list[float], rules: dict[str, Any], kept: list[int]) -> None:
    got = _check(np.array(row, np.float32), **rules)
    assert got.mask[0].astype(int).tolist() == kept


def test_top_p_renormalises_over_the_survivors() -> None:
    # top_k=2 leaves {0, -0.5}: Z = 1.607 and 0.55 Z = 0.88 < 1, the mass above -0.5, so
    # -0.5 goes; on the whole row (Z = 2.34, SGLang's joint rule) it would stay.
    x = np.array([0.0, -1.0, -1.0, -0.5], np.float32)
    assert exact_support(x[None], top_k=2, top_p=0.55).mask[0].tolist() == [1, 0, 0, 0]
    assert exact_support(x[None], top_p=0.55).mask[0].tolist() == [1, 0, 0, 1]
    # min-p and top-k both intersect upper sets, so their order does not matter.
    assert exact_support(x[None], min_p=0.3, top_k=2).mask[0].tolist() == [1, 0, 0, 1]
    _check(x, top_k=2, top_p=0.55)
    _check(x, min_p=0.3, top_k=2, top_p=0.9)


def test_float64_rows_with_a_huge_range() -> None:
    # z_2 - M = -2.2e284: its mass is far below any min_p, and no difference overflows.
    x = np.array([1e300, -1e300, 1e300 * (1 - 2**-52)])
    assert exact_support(x[None], min_p=1e-300, top_p=0.7).mask[0].tolist() == [1, 0, 0]
    _check(x, min_p=1e-300, top_p=0.7)
    _check(x, top_p=0.7)


def test_padding_and_undefined_rows() -> None:
    x = np.array(
        [
            [1.0, 2.0, np.nan, np.inf],  # garbage in padding: defined
            [1.0, np.nan, 0.0, 0.0],
            [1.0, np.inf, 0.0, 0.0],
            [-INF, -INF, 5.0, 5.0],
        ],
        np.float32,
    )
    got = exact_support(x, top_p=0.5, real_vocab_size=2)
    assert got.defined.tolist() == [True, False, False, False]
    assert got.mask.tolist() == [[False, True, False, False]] + [[False] * 4] * 3
    assert got.size.tolist() == [1, 0, 0, 0]
    assert got.threshold[0] == 2.0 and np.isnan(got.threshold[1:]).all()
    empty = exact_support(np.zeros((2, 3), np.float32), top_k=1, real_vocab_size=0)
    assert not empty.defined.any() and empty.mask.shape == (2, 3)


def test_temperature_overflow_makes_a_row_undefined() -> None:
    x = np.array([[3e38, 1.0]], np.float32)
    assert not exact_support(x, top_k=1, temperature=0.5).defined[0]


def _float64_rules(z: np.ndarray, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    """The rules in plain float64, for rows with no decision near a boundary."""
    mass = np.exp(z - z.max())
    keep = mass >= min_p
    keep &= z >= np.sort(z[keep])[::-1][min(top_k, keep.sum()) - 1]
    order = np.argsort(-z[keep], kind="stable")
    values, masses = z[keep][order], mass[keep][order]
    above = np.concatenate([[0.0], np.cumsum(masses)[:-1]])
    first = np.searchsorted(-values, -values, side="left")  # each value's first position
    kept_values = values[above[first] < top_p * masses.sum()]
    return keep & (z >= kept_values.min())


def test_wide_rows_take_the_fast_path() -> None:
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 40_000)) * 3).astype(np.float32)
    fast_path_stats(reset=True)
    got = exact_support(x, top_k=500, top_p=0.9, min_p=0.01)
    counts = fast_path_stats()
    assert counts["support_top_p"] == counts["support_min_p"] == FastPathCounts(3, 0)
    for row in range(3):
        want = _float64_rules(x[row].astype(np.float64), 500, 0.9, 0.01)
        assert got.mask[row].tolist() == want.tolist()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"top_k": 0}, ValueError, "top_k=0"),
        ({"top_k": True}, TypeError, "top_k=True"),
        ({"top_k": 1.5}, TypeError, "top_k=1.5"),
        ({"top_p": 0.0}, ValueError, r"top_p=0.0 must lie in \(0, 1\]"),
        ({"top_p": 1.5}, ValueError, "top_p=1.5"),
        ({"top_p": math.nan}, ValueError, "top_p=nan"),
        ({"top_p": "0.9"}, TypeError, "top_p='0.9'"),
        ({"min_p": -0.1}, ValueError, r"min_p=-0.1 must lie in \[0, 1\]"),
        ({"min_p": True}, TypeError, "min_p=True"),
        ({"temperature": 0.0}, ValueError, "temperature=0.0"),
        ({"real_vocab_size": 9}, ValueError, "real_vocab_size=9"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        exact_support(np.zeros((1, 4), np.float32), **kwargs)


def test_bad_logits_are_refused() -> None:
    with pytest.raises(TypeError, match="logits has dtype int64"):
        exact_support(np.zeros((1, 4), np.int64), top_k=1)
    with pytest.raises(ValueError, match="logits must be 2-D"):
        exact_support(np.zeros(4, np.float32), top_k=1)


def test_replayed_support_mask() -> None:
    mask = replayed_support_mask(np.array([0, 2, 2, 3]), np.array([4, 0, 1]), 5)
    assert mask.astype(int).tolist() == [[1, 0, 0, 0, 1], [0] * 5, [0, 1, 0, 0, 0]]
    assert replayed_support_mask([0], np.zeros(0, np.int64), 3).shape == (0, 3)


@pytest.mark.parametrize(
    ("offsets", "ids", "match"),
    [
        ([1, 2], [0], "kept_offsets=\\[1, 2\\] must start at 0"),
        ([0, 2, 1], [0, 1], "kept_offsets\\[2\\]=1 is below"),
        ([0, 1], [0, 1], "must equal len\\(kept_ids\\)=2"),
        ([0, 1], [7], "kept_ids\\[0\\]=7 is outside \\[0, width=4\\)"),
        ([0, 1], [-1], "kept_ids\\[0\\]=-1"),
    ],
)
def test_replayed_support_mask_refuses(offsets: list[int], ids: list[int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        replayed_support_mask(offsets, ids, 4)
