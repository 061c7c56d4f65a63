"""``exp`` and ``log`` from IEEE basic operations alone: the same bits on every platform.

``docs/semantics.md``, "Determinism scopes" (``cross_platform_bitwise``); error bounds in
``docs/tolerances.md``, "Portable exp and log". A vendor's ``exp`` and ``log`` (libm or
SLEEF on CPU, libdevice or ``ex2.approx`` on NVIDIA, ocml on AMD) give other bits on
other hardware; these are built from ``+ - *`` (and ``/`` in the log, fp64), integer and
bit operations and comparisons only, each correctly rounded or exact on every IEEE 754
unit, applied in one fixed order with no fused multiply-add. The Triton device functions
(``kernels/triton/portable_math.py``) apply the same operations in the same order, and
the constants below are the ones both use, each exactly representable in its dtype.

``portable_exp(d)``, fp32, for ``d <= 0`` or ``-inf`` (``z - M`` and ``z - LSE``):

1. ``d < EXP_FLOOR = -104`` gives exactly 0 (``exp(d) < 2^-150``, which rounds to 0).
2. ``n = rint(d * LOG2E)`` by adding and subtracting ``1.5 * 2^23`` (round to nearest
   even), ``n`` in ``[-150, 0]``, read off the sum's bits as an int32.
3. Cody-Waite: ``r = (d - n LN2_HI) - n LN2_LO``. ``LN2_HI`` has 15 significant bits,
   so ``n LN2_HI`` (at most 23 bits) and the difference are exact.
4. ``p = ((q(r) r^2) + r) + 1``, ``q`` Cephes' degree-5 polynomial by Horner.
5. ``p 2^n``, with ``2^n`` built from its exponent bits: exact, since ``p 2^n`` is normal
   for ``d >= EXP_NORMAL = -87``. Below (``exp(d) < 2^-125``), ``(p 2^(n + 64)) 2^-64``:
   the first product is exact and the second is one correctly rounded multiplication
   into the subnormal range, kept (never flushed) on every target.

``portable_log(s)``, fp64, for a positive normal ``s`` (the merge's ``S >= 1``): ``s = 2^e m``
from the bits, ``m`` in ``[sqrt(1/2), sqrt(2))``, ``f = m - 1`` (exact), ``t = f / (2 + f)``,
``log(1 + f) = 2t + t R(t^2)`` with fdlibm's degree-7 ``R`` by Horner, and
``log s = e LN2_HI64 + (e LN2_LO64 + log(1 + f))``; ``e LN2_HI64`` is exact for ``|e| < 2^11``.
"""

from __future__ import annotations

import struct

import torch

__all__ = [
    "EXP_COEFFICIENTS",
    "EXP_FLOOR",
    "EXP_NORMAL",
    "EXP_UNDER",
    "EXP_UNDER_SCALE",
    "LN2_HI",
    "LN2_HI64",
    "LN2_LO",
    "LN2_LO64",
    "LOG2E",
    "LOG_COEFFICIENTS",
    "ROUNDER",
    "ROUNDER_BITS",
    "SQRT2",
    "portable_cast",
    "portable_exp",
    "portable_log",
]


def _f32(bits: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


def _f64(bits: int) -> float:
    return float(struct.unpack("<d", struct.pack("<Q", bits))[0])


EXP_FLOOR = _f32(0xC2D00000)  # -104.0: exp(d) < 2^-150 below, which rounds to 0
EXP_NORMAL = _f32(0xC2AE0000)  # -87.0: exp(d) > 2^-126 from here up
EXP_UNDER = 64  # below EXP_NORMAL, scale by 2^(n + 64), then by the exact 2^-64
EXP_UNDER_SCALE = _f32(0x1F800000)  # 2^-64
LOG2E = _f32(0x3FB8AA3B)  # log2(e) rounded to fp32
ROUNDER = _f32(0x4B400000)  # 1.5 * 2^23: adding it rounds to an integer, its bits hold n
ROUNDER_BITS = 0x4B400000
LN2_HI = _f32(0x3F317200)  # 0.693145751953125, 15 significant bits
LN2_LO = _f32(0x35BFBE8E)  # ln 2 - LN2_HI rounded to fp32
EXP_COEFFICIENTS = (  # Cephes expf, highest degree first: exp(r) ~ 1 + r + r^2 q(r)
    _f32(0x39506967),
    _f32(0x3AB743CE),
    _f32(0x3C088908),
    _f32(0x3D2AA9C1),
    _f32(0x3E2AAAAA),
    _f32(0x3F000000),
)

SQRT2 = _f64(0x3FF6A09E667F3BCD)
LN2_HI64 = _f64(0x3FE62E42FEE00000)  # fdlibm ln2_hi: 32 trailing zero bits
LN2_LO64 = _f64(0x3DEA39EF35793C76)
LOG_COEFFICIENTS = (  # fdlibm Lg7 .. Lg1: log(1+f) ~ 2t + t R(t^2), R(z) = z (Lg1 + z (...))
    _f64(0x3FC2F112DF3E5244),
    _f64(0x3FC39A09D078C69F),
    _f64(0x3FC7466496CB03DE),
    _f64(0x3FCC71C51D8E78AF),
    _f64(0x3FD2492494229359),
    _f64(0x3FD999999997FA04),
    _f64(0x3FE5555555555593),
)
_MANTISSA = 0x000FFFFFFFFFFFFF
_ONE_EXPONENT = 0x3FF0000000000000


def portable_exp(d: torch.Tensor) -> torch.Tensor:
    """``exp(d)`` for fp32 ``d <= 0`` (or ``-inf``), 0 below ``-104``: the Triton twin's bits.

    >>> portable_exp(torch.tensor([0.0, -1.0, float("-inf")]))
    tensor([1.0000, 0.3679, 0.0000])
    """
    if d.dtype != torch.float32:
        raise TypeError(f"d.dtype={d.dtype}: portable_exp takes float32")
    below = d < EXP_FLOOR
    under = d < EXP_NORMAL
    x = torch.where(below, 0.0, d)
    rounded = x * LOG2E + ROUNDER
    n = rounded.view(torch.int32) - ROUNDER_BITS
    whole = rounded - ROUNDER
    r = (x - whole * LN2_HI) - whole * LN2_LO
    q = torch.full_like(r, EXP_COEFFICIENTS[0])
    for coefficient in EXP_COEFFICIENTS[1:]:
        q = q * r + coefficient
    p = (q * (r * r) + r) + 1.0
    power = ((torch.where(under, n + EXP_UNDER, n) + 127) << 23).view(torch.float32)
    scaled = p * power
    y = torch.where(under, scaled * EXP_UNDER_SCALE, scaled)
    return torch.where(below, 0.0, y)


def portable_log(s: torch.Tensor) -> torch.Tensor:
    """``log(s)`` for float64 ``s``, positive and normal: the Triton twin's bits.

    >>> portable_log(torch.tensor([1.0, 2.0], dtype=torch.float64))
    tensor([0.0000, 0.6931], dtype=torch.float64)
    """
    if s.dtype != torch.float64:
        raise TypeError(f"s.dtype={s.dtype}: portable_log takes float64")
    bits = s.view(torch.int64)
    exponent = (bits >> 52) - 1023
    m = ((bits & _MANTISSA) | _ONE_EXPONENT).view(torch.float64)
    big = m > SQRT2
    m = torch.where(big, m * 0.5, m)
    e = (exponent + big.to(torch.int64)).to(torch.float64)
    f = m - 1.0
    t = f / (f + 2.0)
    z = t * t
    h = torch.full_like(z, LOG_COEFFICIENTS[0])
    for coefficient in LOG_COEFFICIENTS[1:]:
        h = h * z + coefficient
    log1p = t * 2.0 + t * (h * z)
    return e * LN2_HI64 + (e * LN2_LO64 + log1p)


_QUIET_NAN = {torch.float32: 0x7FC00000, torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}


def portable_cast(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 ``values`` rounded to ``dtype`` (to nearest even), every NaN as ``dtype``'s one
    quiet NaN: the kernels' ``stored``. (torch's own bf16 cast makes a NaN ``0x7FC0`` on one
    code path and ``0xFFFF`` on its vectorised one.)

    >>> portable_cast(torch.tensor([float("nan")]), torch.bfloat16).view(torch.int16).item()
    32704
    """
    if dtype not in _QUIET_NAN:
        raise TypeError(f"dtype={dtype}: portable_cast rounds to float32, bfloat16 or float16")
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    nan = torch.tensor(_QUIET_NAN[dtype], dtype=bits, device=values.device).view(dtype)
    return torch.where(torch.isnan(values), nan, values.to(dtype))
