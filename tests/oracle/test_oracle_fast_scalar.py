"""One row's stage runs on plain floats (``_fast_rows.select``): the same enclosures, bit
for bit, as the same row inside a batch, in both branches of ``log_sum``; ``exp_terms``
of a plain float is the array way's; the bfloat16 table holds the ``a`` and ``e``
that computing them gives; a row's maximum read from its patterns is numpy's; and
both ways of counting patterns agree."""

from __future__ import annotations

import math
import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tp_logprob.oracle import _fast_bins as bins
from tp_logprob.oracle import _fast_drivers as drivers
from tp_logprob.oracle import _fast_rows as rows

SETTINGS = settings(
    max_examples=int(os.environ.get("TP_LOGPROB_ORACLE_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

values = st.one_of(
    st.floats(-30, 30),
    st.floats(-1100, 0),
    st.sampled_from([0.0, -745.0, -1000.0, -1001.0, -np.inf]),
)
# A peak of +40 over the rest makes c = 1 and T tiny: the series branch of log_sum.
batches = st.tuples(
    hnp.arrays(np.float64, st.tuples(st.integers(2, 6), st.integers(1, 30)), elements=values),
    st.lists(st.booleans(), min_size=6, max_size=6),
)


def _bits(value: object) -> bytes:
    return np.asarray(value, dtype=np.float64).tobytes()


@SETTINGS
@given(batch=batches, seed=st.integers(0, 2**16))
def test_one_row_on_scalars_is_that_row_of_the_batch(
    batch: tuple[np.ndarray, list[bool]], seed: int
) -> None:
    x, peaked = batch
    x = x.copy()
    x[:, 0] = 0.0  # a finite maximum in every row
    for i, peak in enumerate(peaked[: x.shape[0]]):
        if peak:
            x[i, 0] = np.max(x[i]) + 40.0
    m = x.max(axis=1)
    target = x[
        np.arange(x.shape[0]), np.random.default_rng(seed).integers(0, x.shape[1], x.shape[0])
    ]
    with np.errstate(all="ignore"):
        terms = rows.build_terms(x, m, None, keep=False)
        lse, lse_ok, chosen = drivers._settle(terms, target)
        assert chosen is not None
        sel, sel_ok = chosen
        whole = rows.log_sum(terms)
        for i in range(x.shape[0]):
            one = rows.build_terms(x[i : i + 1], m[i : i + 1], None, keep=False)
            s_lse, s_ok, s_chosen = drivers._settle(one, target[i : i + 1])
            assert np.ndim(s_lse) == 0  # the scalar way was taken
            assert s_chosen is not None
            assert _bits(s_lse) == _bits(lse[i]) and bool(s_ok) == bool(lse_ok[i]), i
            assert _bits(s_chosen[0]) == _bits(sel[i]) and bool(s_chosen[1]) == bool(sel_ok[i]), i
            plain, scaled = rows.log_sum(rows.Sums(*(float(v[i]) for v in rows.fields(terms))))
            for got, want in zip((plain, scaled), whole, strict=True):
                assert _bits([got.hi, got.lo, got.rad]) == _bits(
                    [want.hi[i], want.lo[i], want.rad[i]]
                ), i


def test_the_bf16_table_holds_the_computed_a_and_e() -> None:
    patterns = np.arange(1 << 16, dtype=np.uint32)
    with np.errstate(invalid="ignore"):  # NaN patterns
        x = (patterns << 16).view(np.float32).astype(np.float64)
    x_table, a_table, e_table = bins.bf16_grid()
    assert _bits(x_table) == _bits(x)
    # Every value a row's first phase can see: |x| < M_LIMIT. Uncapped, _keys_and_e
    # gives j = a1 - a and e.
    seen = np.abs(x) < bins.M_LIMIT
    a1 = np.array([2.0**50])
    keys, e = bins._keys_and_e(x[seen][None, :], a1, 0, False)
    assert np.array_equal(a1[0] - keys[0], a_table[seen])
    assert _bits(e[0]) == _bits(e_table[seen])


@SETTINGS
@given(
    d=st.lists(
        st.one_of(st.floats(-1000.0, 0.0), st.sampled_from([0.0, -0.0, -1000.0, -709.0])),
        min_size=1,
        max_size=20,
    ),
    shift=st.sampled_from([0, 600, -300]),
)
def test_exp_of_a_plain_float_is_the_array_way(d: list[float], shift: int) -> None:
    from tp_logprob.oracle._fast_exp import exp_terms

    # exp_terms' domain: exp(d) 2^shift >= 2^-968.
    d = [v for v in d if v + shift * math.log(2) >= -968 * math.log(2) + 1e-9] or [0.0]
    yh, yl = exp_terms(np.array(d), None, shift)
    for i, value in enumerate(d):
        h, lo = exp_terms(value, None, shift)
        assert isinstance(h, float) and isinstance(lo, float)
        assert _bits([h, lo]) == _bits([yh[i], yl[i]]), value


_SPECIAL_PATTERNS = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x0001, 0x8001]


@st.composite
def pattern_sets(draw: st.DrawFn) -> list[int]:
    """Distinct bfloat16 patterns: of both signs, or all of one sign (zeros, infinities,
    NaN and subnormals among them)."""
    low, high = draw(st.sampled_from([(0, 0xFFFF), (0x8000, 0xFFFF), (0, 0x7FFF)]))
    special = [p for p in _SPECIAL_PATTERNS if low <= p <= high]
    element = st.one_of(st.integers(low, high), st.sampled_from(special))
    return draw(st.lists(element, min_size=1, max_size=40, unique=True))


@SETTINGS
@given(chosen=pattern_sets())
def test_a_rows_maximum_read_from_its_patterns(chosen: list[int]) -> None:
    present = np.array(sorted(chosen), dtype=np.intp)
    found = drivers._Patterns(present, present, np.ones(present.size))
    with np.errstate(invalid="ignore"):
        want = float(np.max(bins.bf16_grid()[0][present]))
    got = found.top()
    assert got == want or (math.isnan(got) and math.isnan(want)), (got, want)


@SETTINGS
@given(keys=st.lists(st.integers(0, (1 << 16) - 1), min_size=1, max_size=200))
def test_both_ways_of_counting_patterns_agree(keys: list[int]) -> None:
    """``add.at`` (numpy 1.25 and later) and ``bincount`` (before) count the same."""
    array = np.array(keys, dtype=np.intp)
    fast = drivers._count(array)
    saved = drivers._ADD_AT_COUNTS
    drivers._ADD_AT_COUNTS = False
    try:
        plain = drivers._count(array)
    finally:
        drivers._ADD_AT_COUNTS = saved
    assert plain.shape == fast.shape == (1 << 16,)
    assert np.array_equal(plain, fast)
    assert int(fast.sum()) == len(keys)
