"""docs/semantics.md on rows that break naive code, for the exact oracle and both references.

Every case states the expected ``(selected, lse)`` exactly; the three
implementations must match it bit for bit (NaN matches NaN).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tp_logprob.oracle import (
    exact_logprob_grad,
    exact_logsumexp,
    exact_selected_logprob,
    reference_error_bounds,
    reference_logprob_grad,
    reference_logsumexp,
    reference_selected_logprob,
    reference_sharded_logprob,
)

NAN, INF = math.nan, math.inf
F32_MAX = float(np.finfo(np.float32).max)
F16_MAX = float(np.finfo(np.float16).max)
TINY = 2.0**-149  # smallest float32 subnormal

Impl = Callable[..., tuple[np.ndarray, np.ndarray]]


def _sharded(logits: Any, targets: Any, **kw: Any) -> tuple[np.ndarray, np.ndarray]:
    width = np.asarray(logits).shape[1]
    cut = max(1, width // 2)
    bounds = [(0, cut), (cut, width)] if width > 1 else [(0, 1)]
    return reference_sharded_logprob(logits, targets, bounds, **kw)


IMPLS: dict[str, Impl] = {
    "exact": exact_selected_logprob,
    "reference": reference_selected_logprob,
    "sharded": _sharded,
}


def _same(got: float, want: float) -> bool:
    return (math.isnan(got) and math.isnan(want)) or got == want


def _agrees(impl: str, got: float, want: float, bound: float) -> bool:
    """Exact must match bit for value; the references within their proven bound."""
    if impl == "exact" or not math.isfinite(want):
        return _same(got, want)
    return abs(got - want) <= bound + 2.0**-53 * abs(want)


# (id, row, target, real_vocab_size, expected selected, expected lse)
CASES: list[tuple[str, list[float], int, int | None, float, float]] = [
    ("nan live", [0.0, NAN, 1.0], 0, None, NAN, NAN),
    ("nan in padding is ignored", [0.0, 0.0, NAN], 0, 2, -math.log(2), math.log(2)),
    ("+inf live", [0.0, INF, 1.0], 0, None, NAN, INF),
    ("+inf target", [0.0, INF], 1, None, NAN, INF),
    ("+inf in padding is ignored", [1.0, INF], 0, 1, 0.0, 1.0),
    ("-inf target, finite max", [0.0, -INF, 0.0], 1, None, -INF, math.log(2)),
    ("all live -inf", [-INF, -INF, 3.0], 0, 2, NAN, -INF),
    ("one live column", [7.5, 100.0, -3.0], 0, 1, 0.0, 7.5),
    ("all but one column padding", [-2.0, 1e30, 1e30, 1e30], 0, 1, 0.0, -2.0),
    ("ties at max", [5.0, 5.0, 5.0, 5.0], 2, None, -math.log(4), 5.0 + math.log(4)),
    ("fp32 max", [F32_MAX, F32_MAX], 0, None, -math.log(2), F32_MAX),
    ("-fp32 max", [-F32_MAX, -F32_MAX], 1, None, -math.log(2), -F32_MAX),
    ("fp32 max against -fp32 max", [F32_MAX, -F32_MAX], 1, None, -2 * F32_MAX, F32_MAX),
    ("fp16 max", [F16_MAX, F16_MAX, F16_MAX], 0, None, -math.log(3), F16_MAX + math.log(3)),
    ("1e30 with -1e30", [1e30, -1e30], 0, None, -0.0, 1e30),
    ("1e30 with -1e30, target low", [1e30, -1e30], 1, None, -2e30, 1e30),
    ("subnormals", [TINY, 0.0, -TINY], 1, None, -math.log(3), math.log(3)),
    ("target halfway between floats", [-(2.0**53), 1.0], 0, None, -(2.0**53) - 2, 1.0),
    ("float64 overflow of selected", [-1.7e308, 1.7e308], 0, None, -INF, 1.7e308),
]


@pytest.mark.parametrize("impl", list(IMPLS), ids=list(IMPLS))
@pytest.mark.parametrize(
    ("row", "target", "real_vocab_size", "want_sel", "want_lse"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_special_rows(
    impl: str,
    row: list[float],
    target: int,
    real_vocab_size: int | None,
    want_sel: float,
    want_lse: float,
) -> None:
    sel, lse = IMPLS[impl](np.array([row]), [target], real_vocab_size=real_vocab_size)
    n = len(row) if real_vocab_size is None else real_vocab_size
    finite = [v if math.isfinite(v) else 0.0 for v in (want_sel, want_lse)]
    sel_bound, lse_bound = reference_error_bounds([finite[0]], [finite[1]], n, num_shards=2)
    assert _agrees(impl, float(lse[0]), want_lse, float(lse_bound[0])), (float(lse[0]), want_lse)
    assert _agrees(impl, float(sel[0]), want_sel, float(sel_bound[0])), (float(sel[0]), want_sel)


@pytest.mark.parametrize("logsumexp", [exact_logsumexp, reference_logsumexp])
@pytest.mark.parametrize(
    ("row", "real_vocab_size", "want"),
    [
        ([NAN, 0.0], None, NAN),
        ([INF, -INF], None, INF),
        ([-INF, -INF], None, -INF),
        ([1.0, 2.0], 0, -INF),
        ([3.0, NAN], 1, 3.0),
    ],
    ids=["nan", "+inf", "all -inf", "no live column", "nan in padding"],
)
def test_logsumexp_special(
    logsumexp: Callable[..., float], row: list[float], real_vocab_size: int | None, want: float
) -> None:
    assert _same(logsumexp(row, real_vocab_size=real_vocab_size), want)


def test_exact_zero_signs() -> None:
    # A true zero is +0.0; a negative value too small for float64 is -0.0.
    sel, _ = exact_selected_logprob([[3.0, -INF], [1e30, -1e30]], [0, 0])
    assert sel.tolist() == [0.0, 0.0]
    assert np.signbit(sel).tolist() == [False, True]


@pytest.mark.parametrize("impl", list(IMPLS), ids=list(IMPLS))
def test_inactive_tokens_are_zero_and_never_read(impl: str) -> None:
    logits = np.array([[0.0, 1.0, 2.0], [NAN, 0.0, 0.0], [INF, 0.0, 0.0], [0.0, 0.0, 0.0]])
    targets = np.array([-100, 2**62, -(2**40), 3])  # ignore_index, huge, negative, one past V
    active = np.array([False, False, False, False])
    sel, lse = IMPLS[impl](logits, targets, active_mask=active)
    assert sel.tolist() == [0.0, 0.0, 0.0, 0.0]
    assert np.signbit(sel).tolist() == [False] * 4
    assert _same(float(lse[1]), NAN) and _same(float(lse[2]), INF)
    ref = [exact_logsumexp(logits[0]), math.log(3)]
    assert abs(lse[0] - ref[0]) <= 4e-16 * ref[0] and abs(lse[3] - ref[1]) <= 4e-16 * ref[1]


@pytest.mark.parametrize("impl", list(IMPLS), ids=list(IMPLS))
@pytest.mark.parametrize(("target", "rv"), [(-100, None), (3, None), (2, 2), (0, 0)])
def test_active_target_out_of_range_raises(impl: str, target: int, rv: int | None) -> None:
    logits = np.zeros((3, 3))
    targets = np.array([-100, 99, target])
    with pytest.raises(ValueError, match=rf"targets\[2\]={target} "):
        IMPLS[impl](logits, targets, real_vocab_size=rv, active_mask=np.array([False, False, True]))


def test_out_of_range_message_names_the_first_bad_token_and_counts_the_rest() -> None:
    with pytest.raises(ValueError, match=r"targets\[1\]=-1 .*\(and 1 more\)"):
        exact_selected_logprob(np.zeros((3, 4)), [0, -1, 9])


@pytest.mark.parametrize("grad", [exact_logprob_grad, reference_logprob_grad])
def test_grad_special_rows(grad: Callable[..., np.ndarray]) -> None:
    logits = np.array(
        [
            [0.0, -INF, 0.0, 9.0],  # finite row, padding column 3
            [0.0, -INF, 0.0, 9.0],  # -inf target
            [NAN, 0.0, 0.0, 0.0],  # NaN row
            [INF, 0.0, 0.0, 0.0],  # +inf row
            [5.0, 5.0, 5.0, 5.0],  # inactive
        ]
    )
    active = np.array([True, True, True, True, False])
    g = grad(logits, [2, 1, 0, 0, -100], active_mask=active, real_vocab_size=3)
    assert g[0].tolist() == [-0.5, 0.0, 0.5, 0.0]
    assert g[1].tolist() == [-0.5, 1.0, -0.5, 0.0]
    assert np.isnan(g[2, :3]).all() and g[2, 3] == 0.0
    assert np.isnan(g[3, :3]).all() and g[3, 3] == 0.0
    assert g[4].tolist() == [0.0] * 4
