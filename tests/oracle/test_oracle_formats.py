"""The format table against numpy's own description of each format."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tp_logprob.oracle.formats import FORMATS, U32, U64, unit_roundoff

NUMPY_TYPES = {
    "bf16": ml_dtypes.bfloat16,
    "fp16": np.float16,
    "fp32": np.float32,
    "fp64": np.float64,
}


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_each_format_matches_finfo(name: str) -> None:
    fmt, info = FORMATS[name], ml_dtypes.finfo(NUMPY_TYPES[name])
    assert fmt.max == float(info.max)
    assert fmt.epsilon == float(info.eps)
    assert fmt.smallest_subnormal == float(info.smallest_subnormal)
    assert fmt.unit_roundoff == float(info.eps) / 2
    assert fmt.smallest_normal == float(info.smallest_normal)


def test_the_named_roundoffs() -> None:
    assert (U32, U64) == (2.0**-24, 2.0**-53)
    assert unit_roundoff("bf16") == 2.0**-8


def test_an_unknown_format_is_named() -> None:
    with pytest.raises(ValueError, match=r"name='fp8': expected one of bf16, fp16, fp32, fp64"):
        unit_roundoff("fp8")
