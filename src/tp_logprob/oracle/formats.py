"""The floating-point formats the package speaks of, each described once.

Every per-format constant (unit roundoff, machine epsilon, the largest finite
value, the smallest normal and subnormal, the ulp at a value) is derived here from the
three numbers IEEE 754 fixes for a binary format; the oracle, the strategies and
the suite's bounds read them from this one table instead of writing ``2**-24``.

>>> unit_roundoff("bf16"), U32 == 2.0**-24
(0.00390625, True)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "FORMATS",
    "U32",
    "U64",
    "BinaryFormat",
    "unit_roundoff",
]


@dataclass(frozen=True)
class BinaryFormat:
    """An IEEE 754 binary format: ``precision`` bits (the implicit one included), exponents
    ``emin`` (the smallest normal) to ``emax``."""

    precision: int
    emin: int
    emax: int

    @property
    def unit_roundoff(self) -> float:
        """Half an ulp of 1, ``2^-p``: the relative error of one round-to-nearest."""
        return 2.0**-self.precision

    @property
    def epsilon(self) -> float:
        """The spacing just above 1, ``2^(1-p)``."""
        return 2.0 ** (1 - self.precision)

    @property
    def max(self) -> float:
        """The largest finite value, ``(2 - 2^(1-p)) 2^emax``."""
        return (2.0 - self.epsilon) * 2.0**self.emax

    @property
    def smallest_normal(self) -> float:
        """The smallest positive normal value, ``2^emin``."""
        return 2.0**self.emin

    @property
    def smallest_subnormal(self) -> float:
        """The smallest positive value, ``2^(emin - p + 1)``."""
        return 2.0 ** (self.emin - self.precision + 1)


FORMATS: dict[str, BinaryFormat] = {
    "bf16": BinaryFormat(precision=8, emin=-126, emax=127),
    "fp16": BinaryFormat(precision=11, emin=-14, emax=15),
    "fp32": BinaryFormat(precision=24, emin=-126, emax=127),
    "fp64": BinaryFormat(precision=53, emin=-1022, emax=1023),
}
"""Every format by the name the contract's dtypes use (and ``fp64``)."""

U32 = FORMATS["fp32"].unit_roundoff
"""``2^-24``: the relative error of one fp32 rounding, which every output passes through."""

U64 = FORMATS["fp64"].unit_roundoff
"""``2^-53``: the relative error of one float64 rounding, the reference's working precision."""


def unit_roundoff(name: str) -> float:
    """The unit roundoff of ``name``: ``"bf16"``, ``"fp16"``, ``"fp32"`` or ``"fp64"``."""
    if name not in FORMATS:
        raise ValueError(f"name={name!r}: expected one of {', '.join(FORMATS)}")
    return FORMATS[name].unit_roundoff
