"""Exact processed outputs over a given support: bitwise the raw ones on the full
vocabulary, a brute-force mpmath evaluation on any support, and the conventions of
docs/semantics.md ("Processed logprobs", "Backward") for targets outside the
support, NaN outside it, undefined rows and inactive tokens."""

from __future__ import annotations

import math
import os

import mpmath
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tp_logprob.oracle import (
    exact_entropy,
    exact_entropy_grad,
    exact_logprob_grad,
    exact_processed_entropy,
    exact_processed_entropy_grad,
    exact_processed_logprob,
    exact_processed_logprob_grad,
    exact_selected_logprob,
    exact_support,
    reference_error_bounds,
    reference_selected_logprob,
    support_masked_logits,
)

SETTINGS = settings(
    max_examples=int(os.environ.get("TP_LOGPROB_ORACLE_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
INF = math.inf
_MP = mpmath.MPContext()
_MP.prec = 800


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit, NaN included."""
    return bool(np.array_equal(np.asarray(a).view(np.int64), np.asarray(b).view(np.int64)))


@st.composite
def batches(draw: st.DrawFn, special: bool = True) -> tuple[np.ndarray, int, float]:
    """(logits [N, V] float32, real_vocab_size, temperature)."""
    n = draw(st.integers(1, 4), label="rows")
    v = draw(st.integers(1, 12), label="columns")
    elements = st.floats(-30, 30, width=32)
    if special:
        elements = st.one_of(elements, st.sampled_from([-INF, INF, math.nan, 0.0, 1.0]))
    x = draw(hnp.arrays(np.float32, (n, v), elements=elements), label="logits")
    rv = draw(st.integers(0, v), label="real_vocab_size")
    t = draw(st.sampled_from([1.0, 0.5, 3.0]), label="temperature")
    return x, rv, t


@SETTINGS
@given(case=batches(), data=st.data())
def test_full_support_is_bitwise_the_raw_op(
    case: tuple[np.ndarray, int, float], data: st.DataObject
) -> None:
    x, rv, t = case
    n, v = x.shape
    full = np.zeros((n, v), bool)
    full[:, :rv] = True
    active = data.draw(hnp.arrays(np.bool_, n), label="active")
    targets = np.array([data.draw(st.integers(0, max(rv - 1, 0))) for _ in range(n)])
    targets = np.where(active, targets, -100) if rv else np.full(n, -100)
    active = active & (rv > 0)
    kw = {"active_mask": active, "real_vocab_size": rv, "temperature": t}
    sel, support_lse, lse = exact_processed_logprob(x, targets, full, **kw)
    want_sel, want_lse = exact_selected_logprob(x, targets, **kw)
    assert _same(sel, want_sel) and _same(lse, want_lse) and _same(support_lse, want_lse)
    assert _same(exact_processed_entropy(x, full, **kw), exact_entropy(x, **kw))
    assert _same(
        exact_processed_logprob_grad(x, targets, full, **kw), exact_logprob_grad(x, targets, **kw)
    )
    assert _same(exact_processed_entropy_grad(x, full, **kw), exact_entropy_grad(x, **kw))


def _brute_row(z: np.ndarray, kept: np.ndarray, target: int, t32: float) -> dict[str, object]:
    """Outputs over the support by plain high-precision evaluation, each rounded once."""
    values = [_MP.mpf(float(w)) for w in z[kept]]
    top = max(values)
    lse_s = top + _MP.log(_MP.fsum(_MP.exp(w - top) for w in values))
    probs = {i: _MP.exp(_MP.mpf(float(z[i])) - lse_s) for i in np.flatnonzero(kept)}
    entropy = lse_s - _MP.fsum(p * _MP.mpf(float(z[i])) for i, p in probs.items())
    grad = np.zeros(z.size)
    h_grad = np.zeros(z.size)
    for i, p in probs.items():
        grad[i] = float(((1 if i == target else 0) - p) / t32)
        term = -p * (_MP.mpf(float(z[i])) - lse_s + entropy) / t32
        # Ties make the term exactly 0 (the exact oracle returns 0.0); at 800 bits
        # the brute force leaves rounding noise near 2^-790 instead.
        h_grad[i] = 0.0 if abs(term) < _MP.mpf(2) ** -700 else float(term)
    selected = float(_MP.mpf(float(z[target])) - lse_s) if kept[target] else -INF
    return {
        "selected": selected,
        "support_lse": float(lse_s),
        "entropy": float(entropy),
        "grad": grad,
        "h_grad": h_grad,
    }


@SETTINGS
@given(case=batches(special=False), data=st.data())
def test_any_support_matches_brute_force(
    case: tuple[np.ndarray, int, float], data: st.DataObject
) -> None:
    x, rv, t = case
    if rv == 0:
        return
    n, v = x.shape
    mask = np.zeros((n, v), bool)
    mask[:, :rv] = data.draw(hnp.arrays(np.bool_, (n, rv)), label="support")
    mask[:, 0] |= ~mask.any(axis=1)  # every row keeps something
    targets = np.array([data.draw(st.integers(0, rv - 1)) for _ in range(n)])
    kw = {"real_vocab_size": rv, "temperature": t}
    sel, support_lse, _ = exact_processed_logprob(x, targets, mask, **kw)
    entropy = exact_processed_entropy(x, mask, **kw)
    grad = exact_processed_logprob_grad(x, targets, mask, **kw)
    h_grad = exact_processed_entropy_grad(x, mask, **kw)
    t32 = float(np.float32(t))
    for row in range(n):
        z = (x[row, :rv] / np.float32(t32)).astype(np.float64)
        want = _brute_row(z, mask[row, :rv], int(targets[row]), t32)
        assert sel[row] == want["selected"]
        assert support_lse[row] == want["support_lse"]
        assert entropy[row] == want["entropy"]
        assert grad[row, :rv].tolist() == want["grad"].tolist()  # type: ignore[attr-defined]
        assert h_grad[row, :rv].tolist() == want["h_grad"].tolist()  # type: ignore[attr-defined]
        assert not grad[row, rv:].any() and not h_grad[row, rv:].any()


def test_target_outside_the_support() -> None:
    x = np.array([[2.0, 1.0, 0.0, 5.0]], np.float32)
    mask = np.array([[True, True, False, False]])
    sel, support_lse, lse = exact_processed_logprob(x, [3], mask, temperature=2.0)
    assert sel[0] == -INF and support_lse[0] < lse[0]
    grad = exact_processed_logprob_grad(x, [3], mask, temperature=2.0)
    assert grad[0, 2:].tolist() == [0.0, 0.0]  # the target's column too
    assert grad[0, :2].sum() == pytest.approx(-0.5, abs=1e-15)  # -sum p^S / T


def test_nan_outside_the_support_reaches_only_lse() -> None:
    x = np.array([[1.0, np.nan, 0.0]], np.float32)
    mask = np.array([[True, False, True]])
    sel, support_lse, lse = exact_processed_logprob(x, [0], mask)
    assert np.isfinite(sel[0]) and np.isfinite(support_lse[0]) and np.isnan(lse[0])
    assert np.isfinite(exact_processed_entropy(x, mask)).all()
    assert np.isfinite(exact_processed_logprob_grad(x, [0], mask)).all()


def test_non_finite_support_lse_gives_nan_on_the_support_only() -> None:
    x = np.array([[np.nan, 1.0, 0.0], [-INF, -INF, 3.0]], np.float32)
    mask = np.array([[True, True, False], [True, True, False]])
    sel, support_lse, _ = exact_processed_logprob(x, [1, 0], mask)
    assert np.isnan(sel).all() and np.isnan(support_lse[0]) and support_lse[1] == -INF
    for grad in (
        exact_processed_logprob_grad(x, [1, 0], mask),
        exact_processed_entropy_grad(x, mask),
    ):
        assert np.isnan(grad[:, :2]).all() and grad[:, 2].tolist() == [0.0, 0.0]


def test_undefined_rows() -> None:
    x = np.array([[1.0, np.inf, 0.0, 7.0], [1.0, 0.0, -1.0, 7.0]], np.float32)
    support = exact_support(x, top_p=0.9, real_vocab_size=3)
    assert support.defined.tolist() == [False, True]
    kw = {"real_vocab_size": 3, "defined": support.defined}
    sel, support_lse, lse = exact_processed_logprob(x, [0, 0], support.mask, **kw)
    assert np.isnan(sel[0]) and np.isnan(support_lse[0]) and lse[0] == INF
    assert np.isfinite([sel[1], support_lse[1]]).all()
    assert np.isnan(exact_processed_entropy(x, support.mask, **kw)[0])
    grad = exact_processed_logprob_grad(x, [0, 0], support.mask, **kw)
    assert np.isnan(grad[0, :3]).all() and grad[0, 3] == 0.0
    inactive = {**kw, "active_mask": np.array([False, True])}
    sel, support_lse, _ = exact_processed_logprob(x, [-100, 0], support.mask, **inactive)
    assert sel[0] == 0.0 and math.copysign(1.0, sel[0]) == 1.0 and np.isnan(support_lse[0])
    assert exact_processed_entropy(x, support.mask, **inactive)[0] == 0.0
    assert not exact_processed_entropy_grad(x, support.mask, **inactive)[0].any()


def test_replayed_support_may_leave_an_inactive_row_empty() -> None:
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    mask = np.array([[False, False], [True, False]])
    sel, support_lse, _ = exact_processed_logprob(x, [-1, 0], mask, active_mask=[False, True])
    assert sel.tolist() == [0.0, 0.0] and support_lse.tolist() == [-INF, 3.0]


def test_reference_on_the_masked_logits_is_within_its_bound() -> None:
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((4, 3000)) * 4).astype(np.float32)
    mask = exact_support(x, top_p=0.95, temperature=0.8).mask
    targets = np.argmax(np.where(mask, rng.random(mask.shape), -1.0), axis=1)
    masked = support_masked_logits(x, mask)
    ref_sel, ref_lse = reference_selected_logprob(masked, targets, temperature=0.8)
    sel, support_lse, _ = exact_processed_logprob(x, targets, mask, temperature=0.8)
    bound_sel, bound_lse = reference_error_bounds(sel, support_lse, 3000)
    assert (np.abs(ref_sel - sel) <= bound_sel).all()
    assert (np.abs(ref_lse - support_lse) <= bound_lse).all()


@pytest.mark.parametrize(
    ("mask", "kwargs", "error", "match"),
    [
        (np.ones((1, 3), np.int64), {}, TypeError, "support_mask has dtype int64"),
        (np.ones((2, 3), bool), {}, ValueError, r"support_mask has shape \(2, 3\)"),
        (np.ones((1, 3), bool), {"real_vocab_size": 2}, ValueError, r"support_mask\[0, 2\]=True"),
        (np.ones((1, 3), bool), {"defined": [True, False]}, ValueError, "defined has shape"),
    ],
)
def test_bad_support_arguments(
    mask: np.ndarray, kwargs: dict[str, object], error: type, match: str
) -> None:
    x = np.zeros((1, 3), np.float32)
    with pytest.raises(error, match=match):
        exact_processed_logprob(x, [0], mask, **kwargs)  # type: ignore[arg-type]
