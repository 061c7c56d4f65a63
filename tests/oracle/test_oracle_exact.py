"""The exact oracle against brute force, against itself at twice the precision, and
against closed forms."""

from __future__ import annotations

import math
import os
import time

import mpmath
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tp_logprob.oracle import exact_logprob_grad, exact_logsumexp, exact_selected_logprob
from tp_logprob.oracle.exact import _logprob_grad, _logsumexp, _selected_logprob

# TP_LOGPROB_ORACLE_EXAMPLES raises the example count for a longer run by hand.
SETTINGS = settings(
    max_examples=int(os.environ.get("TP_LOGPROB_ORACLE_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# A private context: the global mpmath precision is never touched.
_MP = mpmath.MPContext()
_MP.prec = 800


def _brute(row: np.ndarray, target: int) -> tuple[float, float, list[float]]:
    """(selected, lse, grad row) by plain high-precision evaluation, rounded once."""
    xs = [_MP.mpf(float(v)) for v in row]
    top = max(xs)
    total = _MP.fsum(_MP.exp(v - top) for v in xs)
    lse = top + _MP.log(total)
    grad = [float((1 if i == target else 0) - _MP.exp(v - lse)) for i, v in enumerate(xs)]
    return float(xs[target] - lse), float(lse), grad


# Moderate spreads (<= 400) keep the brute force at 800 bits accurate and the
# results normal, so rounding its value once is correct rounding.
moderate_rows = hnp.arrays(
    np.float32,
    st.integers(1, 24),
    elements=st.one_of(
        st.floats(-200, 200, width=32),
        st.sampled_from([0.0, 1.0, -1.0, 0.5, 88.0, -16.635532]),
    ),
)


@SETTINGS
@given(row=moderate_rows, pick=st.integers(0, 63))
@example(row=np.array([0.0, -16.635532], np.float32), pick=0)
def test_matches_brute_force(row: np.ndarray, pick: int) -> None:
    target = pick % row.size
    want_sel, want_lse, want_grad = _brute(row, target)
    sel, lse = exact_selected_logprob(row[None, :], [target])
    assert (sel[0], lse[0]) == (want_sel, want_lse)
    assert exact_logsumexp(row) == want_lse
    assert exact_logprob_grad(row[None, :], [target])[0].tolist() == want_grad


wide_rows = hnp.arrays(
    np.float64,
    st.integers(1, 40),
    elements=st.one_of(
        st.floats(allow_nan=False, allow_infinity=False),
        st.floats(-1e4, 1e4),
        st.floats(-1e-300, 1e-300),
        st.sampled_from([0.0, -800.0, 745.0, -745.0, 1e308, -1e308]),
    ),
)


@SETTINGS
@given(row=wide_rows, pick=st.integers(0, 63))
@example(row=np.array([-(2.0**53), 1.0]), pick=0).via("halfway target, tail dropped")
def test_same_result_at_twice_the_precision(row: np.ndarray, pick: int) -> None:
    target = pick % row.size
    logits = row[None, :]
    once = _selected_logprob(logits, [target], active_mask=None, real_vocab_size=None)
    twice = _selected_logprob(
        logits, [target], active_mask=None, real_vocab_size=None, precision_scale=2
    )
    for a, b in zip(once, twice, strict=True):
        assert a.tobytes() == b.tobytes()  # bitwise, sign of zero included
    g1 = _logprob_grad(logits, [target], active_mask=None, real_vocab_size=None)
    g2 = _logprob_grad(logits, [target], active_mask=None, real_vocab_size=None, precision_scale=2)
    assert g1.tobytes() == g2.tobytes()


@SETTINGS
@given(
    value=st.floats(-1e300, 1e300, allow_nan=False) | st.floats(-10, 10),
    count=st.integers(1, 5000),
)
def test_equal_values_closed_form(value: float, count: int) -> None:
    # LSE = x + log(n) and selected = -log(n), computed independently.
    row = np.full(count, value)
    want_lse = float(_MP.mpf(value) + _MP.log(count))
    want_sel = float(-_MP.log(count))
    sel, lse = exact_selected_logprob(row[None, :], [count - 1])
    assert lse[0] == want_lse == _logsumexp(row, real_vocab_size=None, precision_scale=3)
    assert sel[0] == want_sel


@SETTINGS
@given(
    value=st.floats(allow_nan=False, allow_infinity=False),
    padding=hnp.arrays(np.float64, st.integers(0, 5)),  # anything, NaN and inf included
)
def test_single_live_column(value: float, padding: np.ndarray) -> None:
    row = np.concatenate([[value], padding])[None, :]
    sel, lse = exact_selected_logprob(row, [0], real_vocab_size=1)
    assert sel.tobytes() == np.zeros(1).tobytes()  # +0.0
    assert lse[0] == value
    assert exact_logprob_grad(row, [0], real_vocab_size=1)[0, 0] == 0.0


@SETTINGS
@given(
    row=hnp.arrays(np.float32, st.integers(1, 16), elements=st.floats(-100, 100, width=32)),
    shift_exp=st.integers(-30, 30),
    shift_mult=st.integers(-1000, 1000),
    pick=st.integers(0, 63),
)
def test_shift_invariance(row: np.ndarray, shift_exp: int, shift_mult: int, pick: int) -> None:
    # For c with x + c exact: selected is invariant and LSE moves by exactly c
    # whenever c is a multiple of ulp(LSE) and LSE + c stays in LSE's binade.
    c = math.ldexp(shift_mult, shift_exp)
    x = row.astype(np.float64)
    shifted = x + c
    if not np.array_equal(shifted - c, x):
        return  # the shifted inputs are not exact: the identity says nothing
    target = pick % row.size
    sel, lse = exact_selected_logprob(x[None, :], [target])
    sel_c, lse_c = exact_selected_logprob(shifted[None, :], [target])
    assert sel_c[0] == sel[0]
    ulp = math.ulp(lse[0])
    if (
        lse[0] != 0
        and math.fmod(c, ulp) == 0
        and math.frexp(lse[0])[1] == math.frexp(lse[0] + c)[1]
    ):
        assert lse_c[0] == lse[0] + c


def test_exact_grad_rows_sum_to_about_zero() -> None:
    rng = np.random.default_rng(7)
    logits = rng.normal(scale=4.0, size=(3, 500))
    g = exact_logprob_grad(logits, [0, 17, 499])
    assert np.abs(g.sum(axis=1)).max() < 1e-14


def test_bf16_row_of_152064_is_certified_quickly() -> None:
    # The performance target (< 0.1 s per row; see benchmarks/bench_oracle.py),
    # checked loosely here so a shared CI machine does not flake.
    rng = np.random.default_rng(0)
    row = (rng.standard_normal(152064) * 3).astype(np.float32)
    bf16 = (row.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    start = time.perf_counter()
    lse = exact_logsumexp(bf16)
    assert time.perf_counter() - start < 2.0
    assert lse == float(_brute_lse_grouped(bf16))


def _brute_lse_grouped(row: np.ndarray) -> float:
    values, counts = np.unique(row.astype(np.float64), return_counts=True)
    ctx = mpmath.MPContext()
    ctx.prec = 200
    top = ctx.mpf(float(values[-1]))
    total = ctx.fsum(
        int(c) * ctx.exp(ctx.mpf(float(v)) - top) for v, c in zip(values, counts, strict=True)
    )
    return float(top + ctx.log(total))


def test_bfloat16_input_is_taken_exactly() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    row = np.array([1.0, 2.5, -3.0078125], dtype=ml_dtypes.bfloat16)
    assert exact_logsumexp(row) == exact_logsumexp(row.astype(np.float64))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: exact_logsumexp(np.zeros((2, 2, 2))), ValueError, r"row must be 1-D"),
        (lambda: exact_logsumexp(np.zeros(3, np.int64)), TypeError, r"row has dtype int64"),
        (lambda: exact_logsumexp(np.zeros(3, np.complex128)), TypeError, r"complex128"),
        (lambda: exact_logsumexp([0.0], real_vocab_size=2), ValueError, r"real_vocab_size=2"),
        (lambda: exact_logsumexp([0.0], real_vocab_size=-1), ValueError, r"real_vocab_size=-1"),
        (lambda: exact_logsumexp([0.0], real_vocab_size=True), TypeError, r"real_vocab_size"),
        (
            lambda: exact_logsumexp([0.0], real_vocab_size=1.0),  # type: ignore[arg-type]
            TypeError,
            r"real_vocab_size",
        ),
        (lambda: exact_selected_logprob(np.zeros(3), [0]), ValueError, r"logits must be 2-D"),
        (lambda: exact_selected_logprob(np.zeros((2, 3)), [0]), ValueError, r"targets has shape"),
        (lambda: exact_selected_logprob(np.zeros((1, 3)), [0.0]), TypeError, r"targets has dtype"),
        (
            lambda: exact_selected_logprob(np.zeros((1, 3)), [0], active_mask=[1]),
            TypeError,
            r"active_mask has dtype",
        ),
        (
            lambda: exact_selected_logprob(np.zeros((1, 3)), [0], active_mask=[True, False]),
            ValueError,
            r"active_mask has shape",
        ),
        (
            lambda: exact_logprob_grad(np.zeros((1, 3), np.float16), [3]),
            ValueError,
            r"targets\[0\]=3",
        ),
    ],
    ids=[
        "3-D row",
        "int row",
        "complex row",
        "real_vocab_size too big",
        "negative real_vocab_size",
        "bool real_vocab_size",
        "float real_vocab_size",
        "1-D logits",
        "targets length",
        "float targets",
        "int mask",
        "mask length",
        "grad target out of range",
    ],
)
def test_invalid_arguments(call: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()  # type: ignore[operator]
