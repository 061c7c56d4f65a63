"""ulp_distance: definition at binade edges, subnormals, the top binade and special values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tp_logprob.oracle import ulp_distance

INF, NAN = math.inf, math.nan


@pytest.mark.parametrize(
    ("a", "b", "dtype", "want"),
    [
        (1.0, 1.0 + 2.0**-23, "fp32", 1.0),
        (1.0, 1.0 - 2.0**-24, "fp32", 0.5),  # below a binade edge the spacing halves
        (1.0, 1.0 + 2.0**-52, np.float64, 1.0),
        (1.0, 1.0 + 2.0**-7, "bf16", 1.0),
        (1.0, 1.0 + 2.0**-10, np.float16, 1.0),
        (-3.0, -3.0 - 2.0**-22, np.float32, 1.0),
        (0.0, 2.0**-149, "fp32", 1.0),  # ulp(0) is the smallest subnormal
        (2.0**-140, 2.0**-140 + 2.0**-149, "float32", 1.0),
        (0.0, 2.0**-24, "fp16", 1.0),
        (float(np.finfo(np.float32).max), 2.0**128, "fp32", 1.0),
        (1e300, 1e300, "fp32", 0.0),
        (0.0, -0.0, "fp32", 0.0),
        (NAN, NAN, "fp32", 0.0),
        (INF, INF, "fp32", 0.0),
        (-INF, -INF, "fp64", 0.0),
        (INF, -INF, "fp32", INF),
        (NAN, 1.0, "fp32", INF),
        (1.0, NAN, "fp32", INF),
        (1.0, INF, "fp32", INF),
        (0.0, 1e300, "fp64", INF),  # beyond the float64 range
    ],
)
def test_known_distances(a: float, b: float, dtype: object, want: float) -> None:
    assert ulp_distance(a, b, dtype) == want


def test_bfloat16_dtype_object() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert ulp_distance(1.0, 1.0 + 2.0**-7, ml_dtypes.bfloat16) == 1.0


def test_broadcasts_and_returns_float64() -> None:
    got = ulp_distance(np.array([1.0, 2.0]), 1.0 + 2.0**-23, "fp32")
    assert got.dtype == np.float64 and got.tolist() == [1.0, 2.0**22 - 0.5]


@settings(max_examples=50, deadline=None)
@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
@example(a=float(np.finfo(np.float32).max))  # steps up to +inf
def test_next_float_up_is_one_ulp(a: float) -> None:
    with np.errstate(over="ignore"):  # fp32 max steps up to +inf, which is the point
        up = float(np.nextafter(np.float32(a), np.float32(INF)))
    # Up from a negative normal power of two lands in the binade below, where
    # the spacing is half of ulp(a).
    edge = a < -(2.0**-126) and math.frexp(a)[0] == -0.5
    want = INF if math.isinf(up) else 0.5 if edge else 1.0
    assert ulp_distance(a, up, "fp32") == want


@pytest.mark.parametrize("dtype", ["int8", "fp8", np.int32, object()])
def test_unknown_dtype(dtype: object) -> None:
    with pytest.raises(ValueError, match="dtype="):
        ulp_distance(1.0, 1.0, dtype)
