"""``@triton.jit`` twins of ``kernels/portable.py``: the same operations, in the same order.

``portable_exp`` (fp32, ``d <= 0``) and ``portable_log`` (fp64, positive normal) are the
torch functions' steps one for one, on the same constants (see that module for the
algorithm, ``docs/tolerances.md`` for the bounds). What keeps the bits the same on every
target is how the kernels calling them are launched and compiled:

- ``enable_fp_fusion=False`` at every launch (``LaunchConfig.fp_fusion``), so neither
  Triton nor LLVM contracts a product and a sum into an fma;
- fp32 division only through ``tl.math.div_rn`` (plain ``/`` is ``div.full.f32`` on
  NVIDIA); the log's fp64 ``/`` is ``div.rn.f64`` there and correctly rounded on AMD;
- subnormals are kept, never flushed: ``portable_exp``'s results below ``2^-126`` come
  from one correctly rounded multiplication by ``2^-64``, and subnormal logits and
  outputs pass through (every target compiles without flush-to-zero).

``PORTABLE_KERNELS`` names the kernels ``triton_portable`` launches (each with the
constexpr ``PORTABLE=True`` where it has one): the set whose compiled code must hold no
approximate ``exp``/``log``/``rcp``/``div``, no flush-to-zero and no fma.
"""

# triton ships no type hints, and Triton types kernel parameters itself:
# mypy: disable-error-code="untyped-decorator, no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl

from tp_logprob.kernels import portable

__all__ = ["PORTABLE_KERNELS", "portable_exp", "portable_log", "row_exp", "row_log"]

PORTABLE_KERNELS = (
    "exact_max_kernel",
    "exact_sum_kernel",
    "exact_merge_kernel",
    "logprob_grad_kernel",
)
"""The kernels of ``triton_portable`` by name: its forward (``exact_sum_kernels``), in
launch order, and its backward (``backward_kernels``)."""

_EXP_FLOOR = tl.constexpr(portable.EXP_FLOOR)
_EXP_NORMAL = tl.constexpr(portable.EXP_NORMAL)
_EXP_UNDER = tl.constexpr(portable.EXP_UNDER)
_EXP_UNDER_SCALE = tl.constexpr(portable.EXP_UNDER_SCALE)
_LOG2E = tl.constexpr(portable.LOG2E)
_ROUNDER = tl.constexpr(portable.ROUNDER)
_ROUNDER_BITS = tl.constexpr(portable.ROUNDER_BITS)
_LN2_HI = tl.constexpr(portable.LN2_HI)
_LN2_LO = tl.constexpr(portable.LN2_LO)
_E0, _E1, _E2, _E3, _E4, _E5 = (tl.constexpr(c) for c in portable.EXP_COEFFICIENTS)
_SQRT2 = tl.constexpr(portable.SQRT2)
_LN2_HI64 = tl.constexpr(portable.LN2_HI64)
_LN2_LO64 = tl.constexpr(portable.LN2_LO64)
_L7, _L6, _L5, _L4, _L3, _L2, _L1 = (tl.constexpr(c) for c in portable.LOG_COEFFICIENTS)


@triton.jit
def portable_exp(d):
    """``exp(d)`` for fp32 ``d <= 0`` (or ``-inf``), exactly 0 below ``-104``."""
    below = d < _EXP_FLOOR
    under = d < _EXP_NORMAL
    x = tl.where(below, 0.0, d)
    rounded = x * _LOG2E + _ROUNDER
    n = rounded.to(tl.int32, bitcast=True) - _ROUNDER_BITS
    whole = rounded - _ROUNDER
    r = (x - whole * _LN2_HI) - whole * _LN2_LO
    q = r * _E0 + _E1
    q = q * r + _E2
    q = q * r + _E3
    q = q * r + _E4
    q = q * r + _E5
    p = (q * (r * r) + r) + 1.0
    power = ((tl.where(under, n + _EXP_UNDER, n) + 127) << 23).to(tl.float32, bitcast=True)
    scaled = p * power
    y = tl.where(under, scaled * _EXP_UNDER_SCALE, scaled)
    return tl.where(below, 0.0, y)


@triton.jit
def portable_log(s):
    """``log(s)`` for fp64 ``s``, positive and normal."""
    bits = s.to(tl.int64, bitcast=True)
    exponent = (bits >> 52) - 1023
    m = ((bits & 0x000FFFFFFFFFFFFF) | 0x3FF0000000000000).to(tl.float64, bitcast=True)
    big = m > _SQRT2
    m = tl.where(big, m * 0.5, m)
    e = (exponent + big.to(tl.int64)).to(tl.float64)
    f = m - 1.0
    t = f / (f + 2.0)
    z = t * t
    h = z * _L7 + _L6
    h = h * z + _L5
    h = h * z + _L4
    h = h * z + _L3
    h = h * z + _L2
    h = h * z + _L1
    log1p = t * 2.0 + t * (h * z)
    return e * _LN2_HI64 + (e * _LN2_LO64 + log1p)


@triton.jit
def row_exp(d, PORTABLE: tl.constexpr):
    """``portable_exp(d)`` when ``PORTABLE``, else the platform's ``tl.exp``."""
    if PORTABLE:
        return portable_exp(d)
    else:
        return tl.exp(d)


@triton.jit
def row_log(s, PORTABLE: tl.constexpr):
    """``portable_log(s)`` when ``PORTABLE``, else the platform's ``tl.log``."""
    if PORTABLE:
        return portable_log(s)
    else:
        return tl.log(s)
