"""The fast path against the Ziv loop alone: bit for bit on adversarial cases, on constructed
near-halfway rows (where it must fall back) and on wide random rows; and its counters."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tp_logprob.oracle import (
    exact_entropy,
    exact_entropy_grad,
    exact_hidden_logits,
    exact_logprob_grad,
    exact_logsumexp,
    exact_selected_logprob,
    fast_path_stats,
)
from tp_logprob.oracle.fast_path import QUANTITIES, FastPathCounts, slow_path_only
from tp_logprob.strategies import cases

SETTINGS = settings(
    max_examples=int(os.environ.get("TP_LOGPROB_ORACLE_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _both(func: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    fast = func(*args, **kwargs)
    with slow_path_only():
        slow = func(*args, **kwargs)
    return fast, slow


def _assert_same(fast: Any, slow: Any) -> None:
    pairs = zip(fast, slow, strict=True) if isinstance(fast, tuple) else [(fast, slow)]
    for a, b in pairs:
        a, b = np.asarray(a), np.asarray(b)
        if a.tobytes() != b.tobytes():  # bitwise: the sign of zero and NaN included
            bad = np.flatnonzero(a.reshape(-1).view(np.int64) != b.reshape(-1).view(np.int64))
            where = bad[:5].tolist()
            raise AssertionError(
                f"fast and slow differ at flat indices {where}: "
                f"{a.reshape(-1)[where].tolist()} vs {b.reshape(-1)[where].tolist()}"
            )


def _all_quantities(logits: Any, targets: Any, **kwargs: Any) -> None:
    _assert_same(*_both(exact_selected_logprob, logits, targets, **kwargs))
    _assert_same(*_both(exact_logprob_grad, logits, targets, **kwargs))
    _assert_same(*_both(exact_entropy, logits, **kwargs))
    _assert_same(*_both(exact_entropy_grad, logits, **kwargs))


@SETTINGS
@given(case=cases(special_values=True, max_num_tokens=6, max_padded_vocab_size=96))
def test_same_bits_as_the_ziv_loop_on_adversarial_cases(case: Any) -> None:
    contract = case.contract
    _all_quantities(
        case.logits,
        case.targets,
        active_mask=contract.mask.dense(),
        real_vocab_size=contract.sharding.real_vocab_size,
        temperature=contract.temperature,
    )


def _row(*values: float) -> np.ndarray:
    return np.array([values], dtype=np.float64)


_LOG2 = math.log(2.0)
_LOG3 = math.log(3.0)
# (row, target, quantity that must fall back). Each exact value lies within far less
# than the fast path's enclosure of a rounding boundary (a midpoint, or zero).
NEAR_HALFWAY = {
    "selected on a midpoint, tail dropped": (_row(-(2.0**53), 1.0), 0, "selected_logp"),
    "selected on a midpoint near -1000": (_row(2.0**-44, -1000.0), 1, "selected_logp"),
    "lse cancels to a tiny value, two ties": (_row(-_LOG2, -_LOG2), 0, "lse"),
    "lse cancels to a tiny value, three ties": (_row(-_LOG3, -_LOG3, -_LOG3), 1, "lse"),
    "lse is zero to within a dropped tail": (_row(0.0, -1e4), 0, "lse"),
    "selected is -0 to within a dropped tail": (_row(3.0, -1e4), 0, "selected_logp"),
    "entropy below the float64 range": (_row(0.0, -1000.0), 0, "entropy"),
    "gradient of one lone value": (_row(7.0, -math.inf), 0, "logprob_grad"),
}


@pytest.mark.parametrize(("row", "target", "quantity"), NEAR_HALFWAY.values(), ids=NEAR_HALFWAY)
def test_near_halfway_rows_fall_back_and_agree(row: np.ndarray, target: int, quantity: str) -> None:
    fast_path_stats(reset=True)
    _all_quantities(row, [target])
    assert fast_path_stats()[quantity].fallbacks >= 1, fast_path_stats()


@SETTINGS
@given(count=st.integers(2, 40), nudge=st.integers(-3, 3))
def test_cancelling_lse_near_zero(count: int, nudge: int) -> None:
    # count ties at -log(count) (nudged by a few ulps): LSE is within ulps of 0, where its
    # own ulp is tiny; the fast path must defer whenever its enclosure is too wide.
    m = -math.log(count)
    for _ in range(abs(nudge)):
        m = math.nextafter(m, math.copysign(math.inf, nudge))
    row = np.full((1, count), m)
    _assert_same(*_both(exact_selected_logprob, row, [0]))
    _assert_same(*_both(exact_entropy, row))
    assert exact_logsumexp(row[0]) == exact_selected_logprob(row, [0])[1][0]


def _bf16(values: np.ndarray) -> np.ndarray:
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("width", [1024, 9000, 40_000])
@pytest.mark.parametrize("kind", ["fp32", "bf16"])
def test_wide_random_rows(width: int, kind: str) -> None:
    rng = np.random.default_rng(width)
    x = (rng.standard_normal((2, width)) * 4).astype(np.float32)
    if kind == "bf16":
        x = _bf16(x)  # wide bf16 rows take the deduplicated route
    targets = [int(np.argmax(x[0])), width // 3]
    fast_path_stats(reset=True)
    _assert_same(*_both(exact_selected_logprob, x, targets, temperature=0.7))
    _assert_same(*_both(exact_entropy, x))
    counts = fast_path_stats()
    assert counts["lse"] == FastPathCounts(2, 0)
    assert counts["selected_logp"] == FastPathCounts(2, 0)
    assert counts["entropy"] == FastPathCounts(2, 0)


def test_wide_gradients() -> None:
    rng = np.random.default_rng(5)
    x = _bf16(rng.standard_normal((2, 9000)) * 3)
    x[1, :100] = -np.inf
    _assert_same(*_both(exact_logprob_grad, x, [3, 4000], temperature=1.5))
    _assert_same(*_both(exact_entropy_grad, x, temperature=0.5))


def test_counters_count_and_reset() -> None:
    fast_path_stats(reset=True)
    x = np.random.default_rng(0).standard_normal((5, 64))
    x[4, 3] = np.nan  # answered before either path: not counted
    exact_selected_logprob(x, [0, 1, 2, 3, 4], active_mask=[True, True, True, False, True])
    counts = fast_path_stats(reset=True)
    assert set(counts) == set(QUANTITIES)
    assert counts["lse"] == FastPathCounts(4, 0)
    assert counts["selected_logp"] == FastPathCounts(3, 0)
    assert counts["lse"].fallback_rate == 0.0
    assert all(c == FastPathCounts(0, 0) for c in fast_path_stats().values())
    with slow_path_only():
        exact_selected_logprob(x, [0, 1, 2, 3, 4])
    assert fast_path_stats()["lse"] == FastPathCounts(0, 0)
    assert FastPathCounts(3, 1).fallback_rate == 0.25


f32_values = st.one_of(
    st.floats(-1e4, 1e4, width=32),
    st.floats(-(2.0**-120), 2.0**-120, width=32),
    st.sampled_from([0.0, -0.0, 1.0, 2.0**30, -(2.0**30), 3e38, np.inf, np.nan]),
)


@SETTINGS
@given(
    hidden=st.lists(st.lists(f32_values, min_size=6, max_size=6), min_size=1, max_size=3),
    weight=st.lists(st.lists(f32_values, min_size=6, max_size=6), min_size=1, max_size=5),
    cancel=st.booleans(),
    bias=st.booleans(),
)
def test_hidden_logits_same_bits_as_fsum(
    hidden: list[list[float]], weight: list[list[float]], cancel: bool, bias: bool
) -> None:
    h = np.array(hidden, np.float32)
    w = np.array(weight, np.float32)
    if cancel:  # the last three products undo the first three: sums of exactly zero
        h[:, 3:] = h[:, :3]
        w[:, 3:] = -w[:, :3]
    b = np.linspace(-1.0, 1.0, w.shape[0]).astype(np.float32) if bias else None
    _assert_same(*_both(exact_hidden_logits, h, w, b))


def test_hidden_logits_counted_per_element() -> None:
    rng = np.random.default_rng(1)
    h = rng.standard_normal((3, 64)).astype(np.float32)
    w = rng.standard_normal((50, 64)).astype(np.float32)
    w[7, 5] = np.nan  # that row's logits fall back to the IEEE sum
    fast_path_stats(reset=True)
    _assert_same(*_both(exact_hidden_logits, h, w))
    counts = fast_path_stats()["hidden_logits"]
    # Sums of 64 exact fp32 products often need 54 bits: an exact tie between two
    # floats, which an enclosure cannot settle; fsum rounds those (here 4 of 150).
    assert counts.hits + counts.fallbacks == 150
    assert 3 <= counts.fallbacks <= 15, counts


@pytest.mark.parametrize("layout", ["bfloat16", "float32 padded", "fortran order", "float64"])
def test_deduplicated_rows_from_every_input_layout(layout: str) -> None:
    rng = np.random.default_rng(9)
    x = _bf16(rng.standard_normal((3, 10_000)) * 3)
    x[1, 17] = -np.inf
    rv = 10_000
    if layout == "bfloat16":
        x = x.astype(pytest.importorskip("ml_dtypes").bfloat16)
    elif layout == "float32 padded":
        rv = 9_000
        x[:, rv:] = np.nan  # padding is never read
    elif layout == "fortran order":
        x = np.asfortranarray(x)
    else:
        x = x.astype(np.float64)
    fast_path_stats(reset=True)
    _assert_same(*_both(exact_selected_logprob, x, [0, 17, 9], real_vocab_size=rv))
    _assert_same(*_both(exact_logprob_grad, x, [0, 17, 9], real_vocab_size=rv))
    assert fast_path_stats()["lse"].hits == 3


_ROW_VALUES = st.one_of(
    st.sampled_from([0.0, -0.0, -math.inf, 2.0**-133, -(2.0**-126), 0.49, 0.5, 1e3, -1e3]),
    st.floats(-40.0, 40.0, width=32),
)


@SETTINGS
@given(
    values=st.lists(_ROW_VALUES, min_size=1, max_size=12),
    special=st.sampled_from([None, math.nan, math.inf, 2.0**41, -(2.0**41)]),
    dtype=st.sampled_from(["float32", "bfloat16"]),
    temperature=st.sampled_from([1.0, 0.75]),
    scale=st.sampled_from([0.05, 3.0, 8.0]),
    shift=st.sampled_from([0.0, -30.0, 20.0]),
    seed=st.integers(0, 2**16),
)
def test_one_wide_bf16_row_same_bits_as_the_ziv_loop(
    values: list[float],
    special: float | None,
    dtype: str,
    temperature: float,
    scale: float,
    shift: float,
    seed: int,
) -> None:
    """``exact_logsumexp`` of one wide bfloat16-valued row (the short way: its patterns,
    value bins, the stage on plain floats) against the Ziv loop: signed zeros, ``-inf``,
    subnormals, values far below the maximum (the tail bin), maxima beyond the first
    phase's range, NaN and ``+inf``, rows all negative, all near zero (``Y`` summed
    pairwise) or far above it (one dot product), float32 or bfloat16 storage, and a
    temperature (which takes the float64 way)."""
    rng = np.random.default_rng(seed)
    row = _bf16(rng.standard_normal(9000) * scale + shift)
    drawn = rng.choice(9000, size=len(values), replace=False)
    row[drawn] = _bf16(np.asarray(values))
    if special is not None:
        row[rng.integers(0, 9000)] = _bf16(np.array([special]))[0]
    if dtype == "bfloat16":
        row = row.astype(pytest.importorskip("ml_dtypes").bfloat16)
    fast, slow = _both(exact_logsumexp, row, temperature=temperature)
    assert math.isnan(fast) == math.isnan(slow)
    if not math.isnan(slow):
        assert np.float64(fast).tobytes() == np.float64(slow).tobytes(), (fast, slow)


def test_one_wide_bf16_row_is_certified_by_the_short_way() -> None:
    rng = np.random.default_rng(3)
    row = _bf16(rng.standard_normal(152_064) * 4)
    row[5] = -np.inf
    fast_path_stats(reset=True)
    _assert_same(*_both(exact_logsumexp, row))
    assert fast_path_stats()["lse"] == FastPathCounts(1, 0)


@pytest.mark.parametrize(
    ("scale", "shift"),
    [(4.0, 0.0), (3.0, -30.0), (0.05, 0.0), (2.5, -5.0)],
    ids=["normal*4", "all negative", "all near zero", "shifted"],
)
def test_the_short_way_itself_certifies_wide_rows(scale: float, shift: float) -> None:
    """The short way (its patterns, the maximum read from them, value bins, ``Y`` by a dot
    product or pairwise) settles these rows by itself, with the Ziv loop's bits: a wrong
    maximum or tail would only show as a fallback to the batch's way, not as wrong bits."""
    from tp_logprob.oracle import _fast_drivers as drivers

    rng = np.random.default_rng(4)
    row = _bf16(rng.standard_normal(32_768) * scale + shift)
    row[7] = -np.inf
    found = drivers._patterns(None, row)
    assert found is not None
    with np.errstate(all="ignore"):
        value = drivers._patterns_lse(found)
    with slow_path_only():
        want = exact_logsumexp(row)
    assert value is not None
    assert np.float64(value).tobytes() == np.float64(want).tobytes(), (value, want)
