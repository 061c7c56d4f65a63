"""Temperature: the logits every oracle function works on are ``z = fp32(x) / fp32(T)``.

``docs/semantics.md``, "Temperature": one IEEE fp32 division per element, the
order a rollout engine uses before sampling. numpy's float32 division is correctly rounded, so
``z`` here is bit for bit what a conforming kernel forms; the oracle is then
exact with respect to that ``z``. ``z`` may overflow to ``+-inf`` or underflow
to zero in fp32: that is part of the semantics, not an error.

``fp32(T) == 1`` is the identity: the logits are used as given (float64 values
are not rounded to fp32), so the op without temperature is unchanged bit for
bit. Any other temperature needs logits that fp32 holds exactly (bf16, fp16 and
fp32 inputs always are); other float64 values are refused rather than rounded.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tp_logprob.oracle._inputs import FloatArray, as_exact_array


def checked_temperature(temperature: Any) -> float:
    """``fp32(temperature)`` as a float, after checking it is a usable temperature."""
    if type(temperature) is float and temperature == 1.0:  # the default, at once
        return 1.0
    if isinstance(temperature, (bool, np.bool_)) or not isinstance(temperature, numbers.Real):
        raise ValueError(
            f"temperature={temperature!r} must be a finite real number > 0 (not a bool)"
        )
    t = float(temperature)
    if not (math.isfinite(t) and t > 0.0):
        raise ValueError(
            f"temperature={temperature!r} must be a finite number > 0 "
            "(greedy decoding, T = 0, has no log-probability to compare)"
        )
    if t == 1.0:  # the common case, and exact in float32
        return t
    with np.errstate(over="ignore", under="ignore"):
        t32 = float(np.float32(t))
    if t32 == 0.0 or t32 == math.inf:
        raise ValueError(
            f"temperature={temperature!r} rounds to {t32} in float32; it must lie within "
            "float32's range [2**-149, 3.4028235e38]"
        )
    return t32


def apply_temperature(logits: ArrayLike, temperature: float) -> FloatArray:
    """The logits the oracle works on, ``fp32(logits) / fp32(temperature)``, as float64.

    Every value is one correctly rounded fp32 division, widened exactly to
    float64; overflow to ``+-inf`` and underflow to zero are kept. For
    ``fp32(temperature) == 1`` the logits are returned unchanged (as float64).
    Any shape is accepted.

    >>> apply_temperature([1.0, -3.0], 2.0).tolist()
    [0.5, -1.5]
    """
    t32 = checked_temperature(temperature)
    x = as_exact_array(logits, "logits", None)
    return divided(np.asarray(x, dtype=np.float64), t32, "logits")


def divided(x: NDArray[Any], t32: float, name: str) -> FloatArray:
    """``fp32(x) / t32`` in fp32, as a new float64 array (a float64 copy of ``x`` for 1).

    ``x`` is float64 (checked to hold fp32 values) or a narrower float dtype (exact in fp32).
    """
    if t32 == 1.0:
        return np.array(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        x32 = x if x.dtype == np.float32 else x.astype(np.float32)
        inexact = (x32.astype(np.float64) != x) & ~np.isnan(x) if x.dtype == np.float64 else None
    if inexact is not None and inexact.any():
        where = np.unravel_index(int(np.flatnonzero(inexact)[0]), x.shape)
        index = ", ".join(str(int(k)) for k in where)
        raise ValueError(
            f"{name}[{index}]={float(x[where])!r} is not exactly representable in float32; "
            f"temperature={t32!r} divides fp32 logits (z = fp32(x) / fp32(T)), so pass "
            "fp32, bf16 or fp16 values (or temperature=1.0)"
        )
    with np.errstate(over="ignore", under="ignore"):
        z = np.divide(x32, np.float32(t32))
    return np.asarray(z, dtype=np.float64)


def scaled_live(x: NDArray[Any], real_vocab_size: int, t32: float, name: str) -> NDArray[Any]:
    """``x`` with its live columns (``[..., :real_vocab_size]``) divided by ``t32``.

    Returns ``x`` itself for ``t32 == 1``; otherwise a float64 copy whose padding
    columns are copied unchecked (they are never read for a value).
    """
    if t32 == 1.0:
        return x
    out = np.array(x, dtype=np.float64)
    out[..., :real_vocab_size] = divided(out[..., :real_vocab_size], t32, name)
    return out
