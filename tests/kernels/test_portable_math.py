"""The portable exp and log: torch and the Triton interpreter give the same bits, and
both stay within the bounds of ``docs/tolerances.md`` ("Portable exp and log")."""

from __future__ import annotations

import math
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest

from tp_logprob.kernels.portable import EXP_FLOOR, EXP_NORMAL, portable_exp, portable_log

EXP_BOUND_ULPS = 2.288  # docs/tolerances.md, "Portable exp and log"
LOG_BOUND_ULPS = 5.332


def _exp_inputs() -> torch.Tensor:
    special = [0.0, -0.0, -1e-45, -1e-30, -0.3465736, -0.3465737, -1.0, -20.5, -86.99999]
    special += [EXP_NORMAL, -87.00001, -100.0, -103.279, EXP_FLOOR, -104.00001, -3.4e38]
    special += [float("-inf")]
    rng = np.random.default_rng(0)
    spread = -np.exp(rng.uniform(-30.0, math.log(110.0), 4000))
    return torch.tensor(special + spread.tolist(), dtype=torch.float32)


def _log_inputs() -> torch.Tensor:
    special = [1.0, 1.0 + 2.0**-52, 2.0 - 2.0**-52, 2.0, math.sqrt(2.0), 152064.0, 2.0**31]
    rng = np.random.default_rng(1)
    spread = np.exp(rng.uniform(0.0, 22.0, 4000))
    return torch.tensor(special + spread.tolist(), dtype=torch.float64)


def _ulps(approx: np.ndarray, exact: np.ndarray, dtype: type) -> np.ndarray:
    spacing = np.spacing(np.abs(exact).astype(dtype)).astype(np.float64)
    return np.abs(approx.astype(np.float64) - exact) / spacing


def test_exp_within_bound_and_special_values() -> None:
    d = _exp_inputs()
    out = portable_exp(d).numpy()
    exact = np.exp(d.numpy().astype(np.float64))
    normal = d.numpy() >= EXP_NORMAL
    under = ~normal & (d.numpy() >= EXP_FLOOR)
    assert (out[~normal & ~under] == 0.0).all()
    assert _ulps(out[normal], exact[normal], np.float32).max() <= EXP_BOUND_ULPS
    assert out[0] == 1.0 and out[1] == 1.0
    assert (out[normal] >= np.float32(2.0**-126)).all()
    # Below -87: the bound's relative error, then one rounding to a subnormal ulp 2^-149.
    error = np.abs(out[under].astype(np.float64) - exact[under])
    assert (error <= EXP_BOUND_ULPS * 2.0**-24 * exact[under] + 2.0**-150).all()
    assert ((out[under] > 0) & (out[under] < np.float32(2.0**-126))).any()


def test_log_within_bound() -> None:
    s = _log_inputs()
    out = portable_log(s).numpy()
    assert out[0] == 0.0
    exact = np.log(s.numpy().astype(np.longdouble))
    nonzero = exact != 0.0
    spacing = np.spacing(np.abs(exact[nonzero]).astype(np.float64)).astype(np.longdouble)
    errors = np.abs(out[nonzero].astype(np.longdouble) - exact[nonzero]) / spacing
    assert errors.max() <= LOG_BOUND_ULPS


@pytest.mark.parametrize(
    ("bad", "name"),
    [
        (lambda: portable_exp(torch.zeros(2, dtype=torch.float64)), "d.dtype"),
        (lambda: portable_log(torch.ones(2, dtype=torch.float32)), "s.dtype"),
    ],
    ids=["exp-float64", "log-float32"],
)
def test_wrong_dtype_is_named(bad, name) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError, match=name):
        bad()


triton = pytest.importorskip("triton", reason="the interpreter needs triton")
import triton.language as tl  # noqa: E402

from tp_logprob.kernels.triton.interpreted import interpreting  # noqa: E402
from tp_logprob.kernels.triton.portable_math import portable_exp as device_exp  # noqa: E402
from tp_logprob.kernels.triton.portable_math import portable_log as device_log  # noqa: E402


@triton.jit
def _apply_kernel(x_ptr, out_ptr, n, LOG: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    if LOG:
        x = tl.load(x_ptr + offsets, mask=inside, other=1.0)
        tl.store(out_ptr + offsets, device_log(x), mask=inside)
    else:
        x = tl.load(x_ptr + offsets, mask=inside, other=0.0)
        tl.store(out_ptr + offsets, device_exp(x), mask=inside)


@pytest.mark.triton
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs the interpreter")
@pytest.mark.parametrize("log", [False, True], ids=["exp", "log"])
def test_interpreter_matches_torch_bitwise(log: bool) -> None:
    x = _log_inputs() if log else _exp_inputs()
    out = torch.empty_like(x)
    block = 1024
    with interpreting():
        _apply_kernel[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), LOG=log, BLOCK=block)
    expected = portable_log(x) if log else portable_exp(x)
    bits = torch.int64 if log else torch.int32
    mismatched = (out.view(bits) != expected.view(bits)).nonzero().flatten()[:5].tolist()
    assert not mismatched, [(x[i].item(), out[i].item(), expected[i].item()) for i in mismatched]
