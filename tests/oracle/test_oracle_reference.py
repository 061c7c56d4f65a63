"""The float64 references against the exact oracle, within their proven bound."""

from __future__ import annotations

import itertools
import math
import os
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tp_logprob.oracle import (
    exact_logprob_grad,
    exact_selected_logprob,
    reference_error_bounds,
    reference_logprob_grad,
    reference_logsumexp,
    reference_selected_logprob,
    reference_sharded_logprob,
)

SETTINGS = settings(
    max_examples=int(os.environ.get("TP_LOGPROB_ORACLE_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
U64 = 2.0**-53

values = st.one_of(
    st.floats(-1e4, 1e4, width=32),
    st.floats(-30, 30, width=32),
    st.floats(width=32, allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -16.635532, 88.72, -104.0, 1e30, -1e30]),
)


Case = tuple[np.ndarray, np.ndarray, np.ndarray, int, list[tuple[int, int]]]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """Logits, targets, mask, real_vocab_size and random contiguous shard bounds."""
    n = draw(st.integers(1, 4), label="rows")
    v = draw(st.integers(1, 40), label="columns")
    logits = draw(hnp.arrays(np.float32, (n, v), elements=values), label="logits")
    rv = draw(st.integers(1, v), label="real_vocab_size")
    targets = draw(hnp.arrays(np.int64, n, elements=st.integers(0, rv - 1)), label="targets")
    active = draw(hnp.arrays(np.bool_, n), label="active_mask")
    # Cuts anywhere, so width-1 shards and shards wholly in the padding occur.
    cuts = draw(st.sets(st.integers(1, v - 1), max_size=7) if v > 1 else st.just(set()))
    edges = [0, *sorted(cuts), v]
    bounds = list(itertools.pairwise(edges))
    return logits, targets, active, rv, bounds


def _assert_within(got: np.ndarray, want: np.ndarray, bound: np.ndarray, what: str) -> None:
    special = ~np.isfinite(want)
    assert np.array_equal(got[special], want[special], equal_nan=True), what
    err = np.abs(got[~special] - want[~special])
    # The bound is for the true value; the oracle itself is within half an ulp.
    allowed = bound[~special] + U64 * np.abs(want[~special])
    assert (err <= allowed).all(), (what, err, allowed)


def _bounds(
    sel: np.ndarray, lse: np.ndarray, rv: int, shards: int, logits: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    finite = np.isfinite(sel) & np.isfinite(lse)
    row_max = logits[:, :rv].astype(np.float64).max(axis=1)
    return reference_error_bounds(
        np.where(finite, sel, 0.0),
        np.where(np.isfinite(lse), lse, 0.0),
        rv,
        num_shards=shards,
        row_max=np.where(np.isfinite(row_max), row_max, 0.0),
    )


@SETTINGS
@given(case=cases())
@example(
    case=(
        np.array([[0.0, -1e30, 1e30, 5.0]], np.float32),
        np.array([0]),
        np.array([True]),
        2,
        [(0, 1), (1, 2), (2, 3), (3, 4)],
    )
)
def test_references_within_proven_bound_of_exact(case: Case) -> None:
    logits, targets, active, rv, bounds = case
    kw: dict[str, Any] = {"active_mask": active, "real_vocab_size": rv}
    want_sel, want_lse = exact_selected_logprob(logits, targets, **kw)
    sel, lse = reference_selected_logprob(logits, targets, **kw)
    sel_b, lse_b = _bounds(want_sel, want_lse, rv, 1, logits)
    _assert_within(lse, want_lse, lse_b, "reference lse")
    _assert_within(sel, want_sel, sel_b, "reference selected")
    shard_sel, shard_lse = reference_sharded_logprob(logits, targets, bounds, **kw)
    sel_b, lse_b = _bounds(want_sel, want_lse, rv, len(bounds), logits)
    _assert_within(shard_lse, want_lse, lse_b, "sharded lse")
    _assert_within(shard_sel, want_sel, sel_b, "sharded selected")
    # And therefore sharded == unsharded within the sum of the two bounds.
    ref_b = _bounds(want_sel, want_lse, rv, 1, logits)[1]
    _assert_within(shard_lse, lse, lse_b + ref_b + 2 * U64 * np.abs(lse), "sharded vs reference")
    assert (sel[~active] == 0.0).all() and (shard_sel[~active] == 0.0).all()


@SETTINGS
@given(case=cases())
def test_one_shard_is_the_unsharded_reference_bitwise(case: Case) -> None:
    logits, targets, active, rv, _ = case
    kw: dict[str, Any] = {"active_mask": active, "real_vocab_size": rv}
    a = reference_selected_logprob(logits, targets, **kw)
    b = reference_sharded_logprob(logits, targets, [(0, logits.shape[1])], **kw)
    assert a[0].tobytes() == b[0].tobytes() and a[1].tobytes() == b[1].tobytes()
    for row, want in zip(logits, a[1], strict=True):
        got = reference_logsumexp(row, real_vocab_size=rv)
        assert got == want or (math.isnan(got) and math.isnan(want))


@SETTINGS
@given(case=cases())
def test_reference_grad_close_to_exact(case: Case) -> None:
    logits, targets, active, rv, _ = case
    kw: dict[str, Any] = {"active_mask": active, "real_vocab_size": rv}
    want = exact_logprob_grad(logits, targets, **kw)
    got = reference_logprob_grad(logits, targets, **kw)
    _, lse = exact_selected_logprob(logits, targets, **kw)
    _, lse_b = _bounds(np.zeros_like(lse), lse, rv, 1, logits)
    # g = [v == t] - p with p = exp(z); the reference's z = fl(x - lse_ref) is off
    # by at most dz = E_lse + u (|x - lse| + E_lse), so p is off by at most
    # p (e^dz - 1)(1 + 2u) + 2u p, and the final subtraction adds u |g|.
    x = logits.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        dz = lse_b[:, None] + U64 * (np.abs(x - lse[:, None]) + lse_b[:, None])
        p = np.abs(np.where(np.arange(x.shape[1]) == targets[:, None], 1.0, 0.0) - want)
        p_err = np.where(p > 0, p * (np.expm1(dz) * (1 + 2 * U64) + 2 * U64), 0.0)
        bound = p_err + 2 * U64 * np.abs(want) + 1e-300
    special = np.isnan(want)
    assert np.array_equal(np.isnan(got), special)
    assert (np.abs(got - want)[~special] <= bound[~special]).all()


@pytest.mark.parametrize(
    ("bounds", "error", "match"),
    [
        ([(0, 2), (2, 2), (2, 4)], ValueError, r"vocab_shard_bounds\[1\]=\(2, 2\): end must be"),
        ([(0, 2), (3, 4)], ValueError, r"vocab_shard_bounds\[1\]=\(3, 4\): start must equal"),
        ([(1, 4)], ValueError, r"vocab_shard_bounds\[0\]=\(1, 4\): start must equal"),
        ([(0, 3)], ValueError, r"ends at 3; the last end must equal .* 4"),
        ([], ValueError, r"at least one"),
        ([(0, 2.5), (2.5, 4)], TypeError, r"vocab_shard_bounds\[0\]"),
        ([(0, 1, 2)], TypeError, r"vocab_shard_bounds\[0\]"),
        (4, TypeError, r"sequence of \(start, end\) pairs"),
    ],
    ids=[
        "empty shard",
        "gap",
        "not starting at 0",
        "short",
        "no shard",
        "float bound",
        "triple",
        "not a sequence",
    ],
)
def test_invalid_shard_bounds(bounds: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        reference_sharded_logprob(np.zeros((1, 4)), [0], bounds)  # type: ignore[arg-type]


def test_reference_throughput_shape() -> None:
    # Large rows are chunked; the result must not depend on the chunking.
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((5, 300_000)) * 3).astype(np.float32)
    _, lse = reference_selected_logprob(logits, [0, 1, 2, 3, 4])
    for i in range(5):
        assert lse[i] == reference_logsumexp(logits[i])
