"""The exact entropy and its gradient against brute force, closed forms, finite
differences and itself at twice the precision; the float64 references against it."""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable
from typing import Any

import mpmath
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tp_logprob.oracle import (
    apply_temperature,
    exact_entropy,
    exact_entropy_grad,
    exact_selected_logprob,
    reference_entropy,
    reference_entropy_error_bounds,
    reference_entropy_grad,
    reference_sharded_entropy,
)
from tp_logprob.oracle.exact import _entropy, _entropy_grad

SETTINGS = settings(
    max_examples=int(os.environ.get("TP_LOGPROB_ORACLE_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
NAN, INF = math.nan, math.inf
U64 = 2.0**-53
_MP = mpmath.MPContext()
_MP.prec = 1600  # H can be near 2**-1074 while log S sits next to 0


def _brute(z: np.ndarray, t32: float = 1.0) -> tuple[float, list[float]]:
    """(entropy, grad row) of finite values by plain high-precision evaluation."""
    xs = [_MP.mpf(float(v)) for v in z]
    top = max(xs)
    e = [_MP.exp(v - top) for v in xs]
    s = _MP.fsum(e)
    ratio = -_MP.fsum(a * (v - top) for a, v in zip(e, xs, strict=True)) / s
    h = _MP.log(s) + ratio
    grad = [float(-(a / s) * ((v - top) + ratio) / t32) for a, v in zip(e, xs, strict=True)]
    return float(h), grad


moderate_rows = hnp.arrays(
    np.float32,
    st.integers(1, 20),
    elements=st.one_of(
        st.floats(-200, 200, width=32), st.sampled_from([0.0, 1.0, -1.0, 0.5, -16.635532])
    ),
)


@SETTINGS
@given(row=moderate_rows, temperature=st.sampled_from([1.0, 0.5, 3.0, 0.1, 7.25]))
@example(row=np.array([0.0, -16.635532], np.float32), temperature=1.0)
@example(row=np.array([2.0, 2.0, 2.0, -1.0], np.float32), temperature=3.0)
def test_matches_brute_force(row: np.ndarray, temperature: float) -> None:
    z = apply_temperature(row, temperature)
    want_h, want_grad = _brute(z, float(np.float32(temperature)))
    assert exact_entropy(row[None, :], temperature=temperature)[0] == want_h
    got = exact_entropy_grad(row[None, :], temperature=temperature)[0]
    assert got.tolist() == want_grad


wide_rows = hnp.arrays(
    np.float64,
    st.integers(1, 30),
    elements=st.one_of(
        st.floats(allow_nan=False, allow_infinity=False),
        st.floats(-1e4, 1e4),
        st.floats(-1e-300, 1e-300),
        st.sampled_from([0.0, -800.0, 745.0, -745.0, 1e308, -1e308, -INF]),
    ),
)


@SETTINGS
@given(row=wide_rows)
@example(row=np.array([0.0, -1000.0])).via("entropy below the float64 range")
@example(row=np.array([0.0, -700.0, -700.0])).via("subnormal entropy")
def test_same_result_at_twice_the_precision(row: np.ndarray) -> None:
    kw: dict[str, Any] = {"active_mask": None, "real_vocab_size": None}
    once = _entropy(row[None, :], **kw)
    twice = _entropy(row[None, :], precision_scale=2, **kw)
    assert once.tobytes() == twice.tobytes()
    g1 = _entropy_grad(row[None, :], **kw)
    g2 = _entropy_grad(row[None, :], precision_scale=2, **kw)
    assert g1.tobytes() == g2.tobytes()


@SETTINGS
@given(value=st.floats(-1e300, 1e300, allow_nan=False), count=st.integers(1, 5000))
def test_uniform_row_is_log_n(value: float, count: int) -> None:
    row = np.full((1, count), value)
    assert exact_entropy(row)[0] == float(_MP.log(count))
    assert exact_entropy_grad(row).tobytes() == np.zeros((1, count)).tobytes()


@SETTINGS
@given(
    value=st.floats(allow_nan=False, allow_infinity=False),
    padding=hnp.arrays(np.float64, st.integers(0, 5)),  # NaN and inf included
    neg_inf=st.integers(0, 3),
)
def test_one_finite_live_value_is_zero(value: float, padding: np.ndarray, neg_inf: int) -> None:
    row = np.concatenate([[-INF] * neg_inf, [value], padding])[None, :]
    rv = neg_inf + 1
    for impl in (exact_entropy, reference_entropy):
        got = impl(row, real_vocab_size=rv)
        assert got.tobytes() == np.zeros(1).tobytes()  # +0.0
    assert (exact_entropy_grad(row, real_vocab_size=rv) == 0.0).all()


@SETTINGS
@given(a=st.floats(-100, 100), b=st.floats(-100, 100))
@example(a=0.0, b=-50.0)
def test_two_values_closed_form(a: float, b: float) -> None:
    # p = 1 / (1 + e^-delta): H = log(1 + e^-delta) + delta e^-delta / (1 + e^-delta).
    delta = abs(_MP.mpf(a) - _MP.mpf(b))
    w = _MP.exp(-delta)
    want = float(_MP.log1p(w) + delta * w / (1 + w))
    assert exact_entropy([[a, b]])[0] == want


def _mp_entropy(zs: list[Any]) -> Any:
    z = [v for v in zs if not _MP.isinf(v)]  # -inf contributes 0
    top = max(z)
    e = [_MP.exp(v - top) for v in z]
    s = _MP.fsum(e)
    return _MP.log(s) - _MP.fsum(a * (v - top) for a, v in zip(e, z, strict=True)) / s


@pytest.mark.parametrize(
    ("row", "temperature"),
    [
        ([0.0, 1.0, -2.5, 3.0], 1.0),
        ([10.0, 10.0, -INF, 9.0, -30.0], 1.0),
        ([1.5, -0.25, 0.75], 0.3),
        ([100.0, 99.0, 120.0, -5.0], 8.0),
    ],
)
def test_grad_matches_finite_differences(row: list[float], temperature: float) -> None:
    # d/dx = (d/dz) / T at z = fp32(x) / fp32(T): moving x by h moves z by h / T.
    t32 = float(np.float32(temperature))
    z = [_MP.mpf(float(v)) for v in apply_temperature(np.array(row, np.float32), temperature)]
    got = exact_entropy_grad([row], temperature=temperature)[0]
    step = _MP.mpf(2) ** -200
    dz = step / t32
    for v in range(len(row)):
        if row[v] == -INF:
            assert got[v] == 0.0
            continue
        up = [*z[:v], z[v] + dz, *z[v + 1 :]]
        down = [*z[:v], z[v] - dz, *z[v + 1 :]]
        fd = (_mp_entropy(up) - _mp_entropy(down)) / (2 * step)
        assert abs(got[v] - float(fd)) <= 2 * U64 * abs(float(fd)), (v, got[v], float(fd))


def _sharded(logits: Any, **kw: Any) -> np.ndarray:
    width = np.asarray(logits).shape[1]
    cut = max(1, width // 2)
    bounds = [(0, cut), (cut, width)] if width > 1 else [(0, 1)]
    return reference_sharded_entropy(logits, bounds, **kw)


IMPLS: dict[str, Callable[..., np.ndarray]] = {
    "exact": exact_entropy,
    "reference": reference_entropy,
    "sharded": _sharded,
}

# (id, row, real_vocab_size, expected entropy)
SPECIAL = [
    ("nan live", [0.0, NAN, 1.0], None, NAN),
    ("nan in padding is ignored", [0.0, 0.0, NAN], 2, math.log(2)),
    ("+inf live", [0.0, INF, 1.0], None, NAN),
    ("+inf in padding is ignored", [1.0, INF], 1, 0.0),
    ("all live -inf", [-INF, -INF, 3.0], 2, NAN),
    ("no live column", [1.0, 2.0], 0, NAN),
    ("-inf columns contribute 0", [-INF, 0.0, -INF, 0.0], None, math.log(2)),
    ("one live column", [7.5, 100.0, -3.0], 1, 0.0),
    ("fp32 max ties", [3.4028235e38, 3.4028235e38], None, math.log(2)),
    ("fp32 max against -fp32 max", [3.4028235e38, -3.4028235e38], None, 0.0),
    ("1e30 with -1e30", [1e30, -1e30, 1e30], None, math.log(2)),
]


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize(
    ("row", "real_vocab_size", "want"), [c[1:] for c in SPECIAL], ids=[c[0] for c in SPECIAL]
)
def test_special_rows(
    impl: str, row: list[float], real_vocab_size: int | None, want: float
) -> None:
    got = float(IMPLS[impl](np.array([row]), real_vocab_size=real_vocab_size)[0])
    if math.isnan(want):
        assert math.isnan(got)
    elif impl == "exact":
        assert got == want
    else:
        assert abs(got - want) <= 4 * U64 * abs(want)


@pytest.mark.parametrize("impl", list(IMPLS))
def test_inactive_tokens_are_zero(impl: str) -> None:
    logits = np.array([[NAN, 0.0, 0.0], [INF, 0.0, 0.0], [-INF, -INF, -INF], [0.0, 1.0, 2.0]])
    active = np.array([False, False, False, True])
    got = IMPLS[impl](logits, active_mask=active)
    assert got[:3].tobytes() == np.zeros(3).tobytes()
    assert abs(got[3] - exact_entropy(logits[3:])[0]) <= 4 * U64


@pytest.mark.parametrize("grad", [exact_entropy_grad, reference_entropy_grad])
def test_grad_special_rows(grad: Callable[..., np.ndarray]) -> None:
    logits = np.array(
        [
            [0.0, -INF, 0.0, 9.0],  # finite row, padding column 3
            [NAN, 0.0, 0.0, 0.0],  # NaN row
            [INF, 0.0, 0.0, 0.0],  # +inf row
            [-INF, -INF, -INF, 1.0],  # no finite live value
            [NAN, INF, 5.0, 5.0],  # inactive
            [2.0, -INF, -INF, NAN],  # one finite live value
        ]
    )
    active = np.array([True, True, True, True, False, True])
    g = grad(logits, active_mask=active, real_vocab_size=3)
    assert np.abs(g[0]).tolist() == [0.0] * 4
    for i in (1, 2, 3):
        assert np.isnan(g[i, :3]).all() and g[i, 3] == 0.0
    assert g[4].tolist() == [0.0] * 4
    assert g[5].tolist() == [0.0] * 4


values = st.one_of(
    st.floats(-1e4, 1e4, width=32),
    st.floats(-30, 30, width=32),
    st.floats(width=32, allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -16.635532, 88.72, -104.0, 1e30, -1e30, -INF]),
)


@SETTINGS
@given(data=st.data())
@example(data=None)
def test_references_within_proven_bound_of_exact(data: Any) -> None:
    if data is None:  # pinned: a shard wholly -inf, huge gaps between shards
        logits = np.array([[0.0, -1e30, 1e30, -INF, 5.0]], np.float32)
        rv, active, t, bounds = 4, np.array([True]), 1.0, [(0, 1), (1, 3), (3, 4), (4, 5)]
    else:
        n = data.draw(st.integers(1, 3), label="rows")
        v = data.draw(st.integers(1, 40), label="columns")
        logits = data.draw(hnp.arrays(np.float32, (n, v), elements=values), label="logits")
        rv = data.draw(st.integers(1, v), label="real_vocab_size")
        active = data.draw(hnp.arrays(np.bool_, n), label="active_mask")
        t = data.draw(st.sampled_from([1.0, 0.5, 3.0, 2.0**-40, 2.0**40]), label="temperature")
        cuts = data.draw(st.sets(st.integers(1, v - 1), max_size=6) if v > 1 else st.just(set()))
        bounds = list(itertools.pairwise([0, *sorted(cuts), v]))
    kw: dict[str, Any] = {"active_mask": active, "real_vocab_size": rv, "temperature": t}
    want = exact_entropy(logits, **kw)
    _, lse = exact_selected_logprob(logits, np.zeros(len(logits), np.int64), **kw)
    z_max = apply_temperature(logits[:, :rv], t).max(axis=1)
    finite = np.isfinite(want)
    usable = finite & np.isfinite(lse)
    for got, shards in (
        (reference_entropy(logits, **kw), 1),
        (reference_sharded_entropy(logits, bounds, **kw), len(bounds)),
    ):
        assert np.array_equal(np.isnan(got), ~finite)
        bound = reference_entropy_error_bounds(
            np.where(finite, want, 0.0),
            rv,
            num_shards=shards,
            lse=np.where(usable, lse, 0.0),
            row_max=np.where(usable, z_max, 0.0),
        )
        err = np.abs(got - want)[finite]
        assert (err <= bound[finite] + U64 * np.abs(want[finite])).all(), (err, bound)


@SETTINGS
@given(
    logits=hnp.arrays(np.float32, (2, 12), elements=st.floats(-40, 40, width=32) | st.just(-INF)),
    t=st.sampled_from([1.0, 0.5, 3.0]),
)
def test_reference_grad_close_to_exact(logits: np.ndarray, t: float) -> None:
    want = exact_entropy_grad(logits, temperature=t)
    got = reference_entropy_grad(logits, temperature=t)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    z = apply_temperature(logits, t)
    _, lse = exact_selected_logprob(logits, [0, 0], temperature=t)
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.exp(z - lse[:, None])
        scale = p * (np.abs(z - lse[:, None]) + math.log(12) + 1.0) / np.float32(t)
    ok = np.isnan(want) | (np.abs(got - want) <= 1e-13 * np.nan_to_num(scale) + 1e-300)
    assert ok.all()
