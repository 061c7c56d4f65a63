"""Temperature: z = fp32(x) / fp32(T) in every oracle function, T = 1 untouched."""

from __future__ import annotations

import math
import os
import re
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
    exact_logprob_grad,
    exact_logsumexp,
    exact_selected_logprob,
    reference_entropy,
    reference_entropy_grad,
    reference_logprob_grad,
    reference_logsumexp,
    reference_selected_logprob,
    reference_sharded_entropy,
    reference_sharded_logprob,
)

SETTINGS = settings(
    max_examples=int(os.environ.get("TP_LOGPROB_ORACLE_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
INF = math.inf

# Every front that takes logits [N, V] and a temperature, as f(logits, **kw).
FRONTS: dict[str, Callable[..., Any]] = {
    "exact_selected_logprob": lambda x, **kw: exact_selected_logprob(x, [0] * len(x), **kw),
    "exact_logprob_grad": lambda x, **kw: exact_logprob_grad(x, [0] * len(x), **kw),
    "exact_entropy": exact_entropy,
    "exact_entropy_grad": exact_entropy_grad,
    "exact_logsumexp": lambda x, **kw: exact_logsumexp(x[0], **kw),
    "reference_selected_logprob": lambda x, **kw: reference_selected_logprob(x, [0] * len(x), **kw),
    "reference_sharded_logprob": lambda x, **kw: reference_sharded_logprob(
        x, [0] * len(x), [(0, np.shape(x)[1])], **kw
    ),
    "reference_logprob_grad": lambda x, **kw: reference_logprob_grad(x, [0] * len(x), **kw),
    "reference_entropy": reference_entropy,
    "reference_sharded_entropy": lambda x, **kw: reference_sharded_entropy(
        x, [(0, np.shape(x)[1])], **kw
    ),
    "reference_entropy_grad": reference_entropy_grad,
    "reference_logsumexp": lambda x, **kw: reference_logsumexp(x[0], **kw),
    "apply_temperature": lambda x, **kw: apply_temperature(x, kw.get("temperature", 1.0)),
}


def _bytes(result: Any) -> bytes:
    if isinstance(result, tuple):
        return b"".join(np.asarray(r, np.float64).tobytes() for r in result)
    return np.asarray(result, np.float64).tobytes()


@pytest.mark.parametrize("front", list(FRONTS))
def test_temperature_one_is_bitwise_the_op_without_it(front: str) -> None:
    # float64 values fp32 cannot hold: T = 1 must not round them.
    x = np.array([[0.1, -2.0 / 3.0, 1e-300, -INF], [1e300, 1e299, 0.0, 2.0**-1074]])
    f = FRONTS[front]
    assert _bytes(f(x, temperature=1.0)) == _bytes(f(x) if front != "apply_temperature" else x)


@pytest.mark.parametrize("front", list(FRONTS))
@pytest.mark.parametrize(
    "bad",
    [0.0, -1.0, math.nan, INF, -INF, True, 1e-46, 1e39, "2"],
    ids=["zero", "negative", "nan", "inf", "-inf", "bool", "fp32 zero", "fp32 inf", "str"],
)
def test_bad_temperature_raises_naming_it(front: str, bad: Any) -> None:
    with pytest.raises(ValueError, match=re.escape(f"temperature={bad!r}")):
        FRONTS[front](np.zeros((1, 2)), temperature=bad)


@pytest.mark.parametrize("front", list(FRONTS))
def test_float64_logits_fp32_cannot_hold_are_refused(front: str) -> None:
    x = np.array([[0.0, 0.1]])  # 0.1 is not a float32
    with pytest.raises(
        ValueError, match=r"(logits\[0, 1\]|row\[1\])=0.1 is not exactly representable"
    ):
        FRONTS[front](x, temperature=2.0)


@SETTINGS
@given(
    row=hnp.arrays(np.float32, st.integers(1, 12), elements=st.floats(-1e3, 1e3, width=32)),
    k=st.integers(-20, 20),
)
@example(row=np.array([1.0, -3.0, 0.0], np.float32), k=3)
def test_power_of_two_temperature_is_prescaled_logits(row: np.ndarray, k: int) -> None:
    t = 2.0**k
    scaled = row / np.float32(t)
    if not np.array_equal(scaled.astype(np.float64) * t, row.astype(np.float64)):
        return  # the division was not exact (subnormal): the identity says nothing
    x, z = row[None, :], scaled[None, :]
    target = [row.size - 1]
    assert _bytes(exact_selected_logprob(x, target, temperature=t)) == _bytes(
        exact_selected_logprob(z, target)
    )
    assert _bytes(exact_entropy(x, temperature=t)) == _bytes(exact_entropy(z))
    # Gradients are d/dx = (d/dz) / T, exact for a power of two away from subnormals.
    g = exact_logprob_grad(z, target) / t
    g_t = exact_logprob_grad(x, target, temperature=t)
    normal = (np.abs(g) >= 2.0**-1000) | (g == 0)
    assert np.array_equal(g_t[normal], g[normal])
    h = exact_entropy_grad(z) / t
    h_t = exact_entropy_grad(x, temperature=t)
    normal = (np.abs(h) >= 2.0**-1000) | (h == 0)
    assert np.array_equal(h_t[normal], h[normal])


def test_apply_temperature_is_one_fp32_division() -> None:
    x = np.array([1.0, 3.0, -7.0, 3.4028235e38, 2.0**-149, -INF], np.float32)
    z = apply_temperature(x, 0.3)
    assert z.dtype == np.float64
    with np.errstate(over="ignore"):
        want = x / np.float32(0.3)
    assert np.array_equal(z, want.astype(np.float64))
    assert z[3] == INF  # fp32 overflow is part of the semantics
    assert apply_temperature(x, 3.0)[4] == 0.0  # and so is underflow
    assert apply_temperature([[2.0]], 4).tolist() == [[0.5]]


def test_overflowing_z_follows_the_special_value_rules() -> None:
    x = np.array([[3.0e38, 0.0], [-3.0e38, 0.0]], np.float32)
    sel, lse = exact_selected_logprob(x, [1, 1], temperature=0.5)
    assert lse[0] == INF
    assert math.isnan(sel[0]) and lse[1] == 0.0
    h = exact_entropy(x, temperature=0.5)
    assert math.isnan(h[0]) and h[1] == 0.0  # -inf contributes 0: one finite value


def test_logprob_grad_with_temperature_matches_brute_force() -> None:
    ctx = mpmath.MPContext()
    ctx.prec = 400
    row = np.array([0.5, -1.25, 3.0, 2.75], np.float32)
    t = 0.7
    t32 = float(np.float32(t))
    z = [ctx.mpf(float(v)) for v in apply_temperature(row, t)]
    lse = ctx.log(ctx.fsum(ctx.exp(v) for v in z))
    want = [float(((1 if i == 2 else 0) - ctx.exp(v - lse)) / t32) for i, v in enumerate(z)]
    assert exact_logprob_grad(row[None, :], [2], temperature=t)[0].tolist() == want
    # A -inf target: the gradient there is 1 / T, correctly rounded.
    g = exact_logprob_grad(np.array([[0.0, -INF]], np.float32), [1], temperature=t)
    assert g[0, 1] == 1.0 / t32
