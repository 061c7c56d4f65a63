"""The support's classification: exact at zero margins, monotone in the margins, upper and
lower sets around the exact support; and admissibility, which accepts the exact support
and names what is wrong with one that is not."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tp_logprob.oracle import (
    SupportClassification,
    SupportMargins,
    admissible_support,
    classify_support,
    exact_support,
    support_margins,
)
from tp_logprob.oracle._support_rows import sorted_rows, top_values
from tp_logprob.oracle.support import analyse

SETTINGS = settings(
    max_examples=int(os.environ.get("TP_LOGPROB_ORACLE_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
INF = math.inf


def scaled(margins: SupportMargins, factor: float) -> SupportMargins:
    """Every error bound of ``margins`` times ``factor``."""
    fields = {f.name: getattr(margins, f.name) * factor for f in dataclasses.fields(margins)}
    return SupportMargins(**fields)


@st.composite
def cases(draw: st.DrawFn) -> tuple[np.ndarray, dict[str, Any]]:
    """Rows with ties, -inf and near-equal values, and rules (some near a row's boundary)."""
    n = draw(st.integers(1, 3), label="rows")
    v = draw(st.integers(1, 40), label="columns")
    base = draw(st.floats(-5, 5, width=32), label="base")
    elements = st.one_of(
        st.floats(-20, 20, width=32),
        st.sampled_from([0.0, -1.0, -INF]),
        st.integers(-3, 3).map(lambda k: float(np.float32(base) + np.float32(k * 2.0**-20))),
    )
    x = draw(hnp.arrays(np.float32, (n, v), elements=elements), label="logits")
    rules = {
        "top_k": draw(st.one_of(st.none(), st.integers(1, 10)), label="top_k"),
        "top_p": draw(st.one_of(st.none(), st.floats(1e-3, 1.0)), label="top_p"),
        "min_p": draw(st.one_of(st.none(), st.floats(0.0, 1.0), st.just(1.0)), label="min_p"),
    }
    return x, rules


@SETTINGS
@given(case=cases())
def test_zero_margins_classify_exactly(case: tuple[np.ndarray, dict[str, Any]]) -> None:
    x, rules = case
    c = classify_support(x, margins=SupportMargins.zero(), **rules)
    exact = exact_support(x, **rules)
    assert np.array_equal(c.exact.mask, exact.mask)
    assert np.array_equal(c.certainly_in, exact.mask)
    assert np.array_equal(c.certainly_out, ~exact.mask)
    assert not c.borderline.any()


@st.composite
def wide_cases(draw: st.DrawFn) -> tuple[np.ndarray, dict[str, Any], SupportMargins]:
    """Rows wide enough that the sorted top is a small part of them (so it is found by
    partition), with ties at and near the boundaries, and margins from none to bf16's."""
    x, rules = draw(cases())
    width = draw(st.integers(41, 400), label="width")
    spread = draw(st.sampled_from([1.0, 4.0, 2.0**-20]), label="spread")
    fill = draw(st.integers(0, 2**32 - 1), label="fill seed")
    rng = np.random.default_rng(fill)
    extra = (rng.standard_normal((x.shape[0], width)) * spread).astype(np.float32)
    extra[rng.random(extra.shape) < 0.05] = -INF
    # Repeat the drawn values so that ties reach across the row.
    extra[:, : x.shape[1]] = x
    x = np.concatenate([extra, x], axis=1)
    kind = draw(st.sampled_from(["zero", "fp32", "bf16", "huge"]), label="margins")
    margins = (
        SupportMargins.zero()
        if kind == "zero"
        else support_margins("bf16" if kind == "bf16" else "fp32", x.shape[1], num_shards=2)
    )
    if kind == "huge":
        margins = scaled(margins, 1e5)
    return x, rules, margins


@SETTINGS
@given(case=wide_cases(), temperature=st.sampled_from([1.0, 0.7]))
def test_the_sorted_top_decides_as_the_whole_sorted_row(
    case: tuple[np.ndarray, dict[str, Any], SupportMargins], temperature: float
) -> None:
    """Each row's top, found without a sort, gives the bits of sorting the whole row."""
    x, rules, margins = case
    for given_margins in (None, margins):
        args = (x, rules["top_k"], rules["top_p"], rules["min_p"], None, temperature)
        top = analyse(*args, given_margins)
        whole = analyse(*args, given_margins, whole_rows=True)
        for name in ("defined", "threshold", "sure_threshold", "out_threshold"):
            assert getattr(top, name).tobytes() == getattr(whole, name).tobytes(), name
    # The masses of the top are the whole sorted row's, bit for bit, on the top.
    z = top.z[top.defined]
    if z.size:
        m, need = z.max(axis=1), np.minimum(np.arange(z.shape[0]) + 3, z.shape[1])
        rows = np.flatnonzero(top.defined)
        part = sorted_rows(rows, top_values(z, need), m, z.shape[1])
        full = sorted_rows(rows, np.sort(z, axis=1)[:, ::-1], m, z.shape[1])
        for name in ("yh", "prefix_lo", "prefix_hi", "above_lo", "above_hi", "group_start"):
            for r, size in enumerate(need.tolist()):
                got, want = getattr(part, name)[r, :size], getattr(full, name)[r, :size]
                assert got.tobytes() == want.tobytes(), name


@SETTINGS
@given(case=wide_cases())
def test_blocks_of_rows_decide_as_one_block(
    case: tuple[np.ndarray, dict[str, Any], SupportMargins],
) -> None:
    """Rows are decided a block at a time, and their masses computed a piece at a time;
    blocks of one row and pieces of three terms give the bits of one block and piece."""
    import tp_logprob.oracle._support_rows as rows_module
    import tp_logprob.oracle.support as support_module

    x, rules, margins = case
    args = (x, rules["top_k"], rules["top_p"], rules["min_p"], None, 0.7, margins)
    whole = analyse(*args)
    saved = support_module._BLOCK_VALUES, support_module._MASS_BLOCK_VALUES, rows_module._EXP_PIECE
    support_module._BLOCK_VALUES = support_module._MASS_BLOCK_VALUES = 1
    rows_module._EXP_PIECE = 3
    try:
        rows = analyse(*args)
    finally:
        support_module._BLOCK_VALUES, support_module._MASS_BLOCK_VALUES = saved[:2]
        rows_module._EXP_PIECE = saved[2]
    for name in ("defined", "threshold", "sure_threshold", "out_threshold"):
        assert getattr(rows, name).tobytes() == getattr(whole, name).tobytes(), name


@SETTINGS
@given(
    z=hnp.arrays(
        np.float64,
        st.tuples(st.integers(1, 3), st.integers(1, 300)),
        elements=st.one_of(st.sampled_from([0.0, 1.0, -INF, 2.0**-30]), st.floats(-4, 4)),
    ),
    data=st.data(),
)
def test_top_values_are_the_largest_in_order(z: np.ndarray, data: st.DataObject) -> None:
    need = np.array(
        [data.draw(st.integers(1, z.shape[1]), label=f"need[{r}]") for r in range(z.shape[0])]
    )
    top = top_values(z, need)
    assert top.shape == (z.shape[0], need.max())
    for r in range(z.shape[0]):
        assert top[r, : need[r]].tolist() == np.sort(z[r])[::-1][: need[r]].tolist()
        assert (top[r, need[r] :] == -INF).all()


def _upper_set(z: np.ndarray, flags: np.ndarray) -> bool:
    """Every column with ``z`` at least a flagged one's is flagged (NaN padding aside)."""
    if not flags.any():
        return True
    return bool(flags[~np.isnan(z)][z[~np.isnan(z)] >= z[flags].min()].all())


def _check_structure(c: SupportClassification) -> None:
    assert not (c.certainly_in & c.certainly_out).any()
    assert not (c.certainly_in & ~c.exact.mask).any()
    assert not (c.certainly_out & c.exact.mask).any()
    for row in range(c.z.shape[0]):
        z = c.z[row]
        assert _upper_set(z, c.certainly_in[row])
        assert _upper_set(np.where(np.isnan(z), z, -z), c.certainly_out[row] & ~np.isnan(z))
        if c.defined[row]:  # the maximum is always certainly in
            assert c.certainly_in[row][np.nanargmax(z)]


@SETTINGS
@given(case=cases(), factors=st.lists(st.sampled_from([0.0, 1.0, 3.0, 1e3, 1e5]), min_size=2))
def test_borderline_grows_with_the_margins(
    case: tuple[np.ndarray, dict[str, Any]], factors: list[float]
) -> None:
    x, rules = case
    base = support_margins("fp32", x.shape[1], num_shards=4)
    previous = None
    for factor in sorted(factors):
        c = classify_support(x, margins=scaled(base, factor), **rules)
        _check_structure(c)
        if previous is not None:
            assert not (c.certainly_in & ~previous.certainly_in).any()
            assert not (c.certainly_out & ~previous.certainly_out).any()
        previous = c


def test_margins_make_near_boundary_tokens_borderline() -> None:
    # exp(-0.693147) exceeds 0.5 by 1.8e-7 relative: within fp32's error, so borderline;
    # exp(-0.69) exceeds it by 3e-3 and exp(-0.7) falls short by 7e-3: certain.
    x = np.array([[0.0, -0.693147, -0.69, -0.7]], np.float32)
    c = classify_support(x, min_p=0.5, margins=support_margins("fp32", 4))
    assert c.exact.mask[0].tolist() == [True, True, True, False]
    assert c.certainly_in[0].tolist() == [True, False, True, False]
    assert c.certainly_out[0].tolist() == [False, False, False, True]


def test_top_p_borderline_follows_the_sum_bound() -> None:
    # Z = 1 + e^-1 + e^-2; p just above A/Z = 1/Z for the value -1 keeps it exactly,
    # but by less than mu: borderline. The value -2 (A/Z = 0.84) is certainly out.
    z = np.array([0.0, -1.0, -2.0])
    ratio = 1.0 / np.exp(z).sum()
    margins = support_margins("fp32", 3)
    mu = margins.top_p_margin(ratio)
    x = z[None].astype(np.float32)
    near = classify_support(x, top_p=ratio * (1 + mu / 4), margins=margins)
    assert near.exact.mask[0].tolist() == [True, True, False]
    assert near.borderline[0].tolist() == [False, True, False]
    far = classify_support(x, top_p=ratio * (1 + 4 * mu), margins=margins)
    assert far.certainly_in[0].tolist() == [True, True, False]


def test_min_p_borderline_widens_the_survivor_total() -> None:
    # -0.693147 is a borderline min-p survivor; top-p must then hold for totals with
    # and without it, so a token certain under either total alone may not be.
    x = np.array([[0.0, -0.693147, -0.05, -3.0]], np.float32)
    margins = support_margins("fp32", 4)
    c = classify_support(x, min_p=0.5, margins=margins)
    assert c.borderline[0].tolist() == [False, True, False, False]
    z = x[0].astype(np.float64)
    mass = np.exp(z)
    # With p between 1/(1 + e^-.05 + e^-.693) and 1/(1 + e^-.05): -0.05's decision
    # flips with the borderline token's presence.
    low, high = 1 / (mass[0] + mass[2] + mass[1]), 1 / (mass[0] + mass[2])
    c = classify_support(x, min_p=0.5, top_p=(low + high) / 2, margins=margins)
    assert c.borderline[0][2]
    assert c.certainly_in[0][0] and c.certainly_out[0][3]


def test_undefined_rows_and_padding_are_certainly_out() -> None:
    x = np.array([[1.0, np.nan, 0.0], [1.0, 2.0, np.inf]], np.float32)
    c = classify_support(x, top_k=1, margins=support_margins("fp32", 3), real_vocab_size=2)
    assert c.defined.tolist() == [False, True]
    assert c.certainly_out.tolist() == [[True, True, True], [True, False, True]]
    assert c.certainly_in.tolist() == [[False] * 3, [False, True, False]]


def _problems(x: list[list[float]], kept: list[list[int]], **kwargs: Any) -> list[str]:
    arr = np.array(x, np.float32)
    rv = kwargs.pop("real_vocab_size", None)
    c = classify_support(arr, real_vocab_size=rv, **kwargs)
    return admissible_support(c, np.array(kept, bool), active_mask=kwargs.get("active"))


ZERO = SupportMargins.zero()


def test_admissible_accepts_the_exact_support_and_any_borderline_choice() -> None:
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((8, 500)) * 3).astype(np.float32)
    margins = support_margins("fp32", 500, num_shards=2)
    rules = {"top_k": 100, "top_p": 0.8, "min_p": 0.02}
    c = classify_support(x, margins=scaled(margins, 1e4), **rules)
    assert c.borderline.any()
    assert admissible_support(c, c.exact.mask) == []
    assert admissible_support(c, c.certainly_in) == []
    assert admissible_support(c, ~c.certainly_out & (c.z > -INF)) == []


@pytest.mark.parametrize(
    ("x", "kept", "rules", "message"),
    [
        pytest.param(
            [[3.0, 2.0, 1.0]],
            [[1, 0, 0]],
            {"top_k": 2},
            "row 0: token 1 (z=2.0) is certainly in the support but was dropped",
            id="missing-certainly-in",
        ),
        pytest.param(
            [[3.0, 2.0, 1.0]],
            [[1, 1, 1]],
            {"top_k": 2},
            "row 0: token 2 (z=1.0) is certainly out of the support but was kept",
            id="containing-certainly-out",
        ),
        pytest.param(
            [[3.0, 2.0, 2.0]],
            [[1, 1, 0]],
            {"top_k": 2},
            "token 1 (z=2.0) was kept but token 2 (z=2.0, tied with it) was dropped",
            id="not-tie-closed",
        ),
        pytest.param(
            [[3.0, 2.0, 1.0]],
            [[1, 0, 1]],
            {"top_k": 3},
            "token 2 (z=1.0) was kept but token 1 (z=2.0, larger) was dropped",
            id="not-an-upper-set",
        ),
        pytest.param(
            [[1.0, np.nan, 0.0]],
            [[1, 0, 0]],
            {"top_k": 1},
            "row 0: the support is undefined",
            id="undefined-row-kept",
        ),
        pytest.param(
            [[1.0, 0.0, 5.0]],
            [[1, 0, 1]],
            {"top_k": 1, "real_vocab_size": 2},
            "row 0: padding column 2 was kept",
            id="padding-kept",
        ),
    ],
)
def test_admissible_names_the_problem(
    x: list[list[float]], kept: list[list[int]], rules: dict[str, Any], message: str
) -> None:
    problems = _problems(x, kept, margins=ZERO, **rules)
    assert any(message in p for p in problems), problems


def test_admissible_skips_inactive_rows_and_caps_the_report() -> None:
    x = np.tile(np.array([[3.0, 2.0, 1.0]], np.float32), (30, 1))
    c = classify_support(x, top_k=2, margins=ZERO)
    wrong = np.zeros((30, 3), bool)
    problems = admissible_support(c, wrong)
    assert len(problems) == 21 and problems[-1] == "... and 10 more"
    active = np.zeros(30, bool)
    active[4] = True
    assert [p.split(":")[0] for p in admissible_support(c, wrong, active_mask=active)] == ["row 4"]


def test_bad_arguments() -> None:
    x = np.zeros((1, 3), np.float32)
    with pytest.raises(TypeError, match=r"margins=0\.1 must be a SupportMargins"):
        classify_support(x, top_k=1, margins=0.1)  # type: ignore[arg-type]
    c = classify_support(x, top_k=1, margins=ZERO)
    with pytest.raises(ValueError, match=r"support_mask has shape \(3,\)"):
        admissible_support(c, np.ones(3, bool))
    with pytest.raises(ValueError, match=r"sum_rel=-1\.0 must be a finite number >= 0"):
        SupportMargins(-1.0, 0.0, 0.0, 0.0, 0.0, 0.0)
