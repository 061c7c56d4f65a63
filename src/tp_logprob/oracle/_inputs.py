"""Argument checking and exact conversion, shared by every oracle front end.

Logits are widened to float64, which is exact for float16, bfloat16 and float32
values; wider or non-float inputs are refused rather than rounded. Messages echo
the argument as ``name=value`` and say what would be accepted.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

try:
    import ml_dtypes

    _BFLOAT16: np.dtype[Any] | None = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # ml_dtypes is an optional extra
    _BFLOAT16 = None

_EXACT_DTYPES: frozenset[np.dtype[Any]] = frozenset(
    np.dtype(t) for t in (np.float16, np.float32, np.float64)
) | (frozenset([_BFLOAT16]) if _BFLOAT16 is not None else frozenset())

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]


_FORMAT_ALIASES = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "fp64": "fp64",
    "float64": "fp64",
    "double": "fp64",
}


def format_name(dtype: Any, allowed: tuple[str, ...]) -> str:
    """Normalise ``dtype`` (``"bf16"``, ``np.float32``, ``ml_dtypes.bfloat16``...) to a name.

    torch dtypes are recognised by their string form, without importing torch.
    """
    if isinstance(dtype, str):
        key = dtype
    else:
        try:
            key = np.dtype(dtype).name
        except TypeError:
            key = str(dtype)
    name = _FORMAT_ALIASES.get(key.lower().removeprefix("torch."))
    if name not in allowed:
        raise ValueError(f"dtype={dtype!r} is not one of {', '.join(allowed)} (or an equivalent)")
    return name


def as_float64(value: ArrayLike, name: str, ndim: int) -> FloatArray:
    """``value`` as a C-contiguous float64 array of ``ndim`` dimensions, exactly."""
    return np.ascontiguousarray(as_exact_array(value, name, ndim), dtype=np.float64)


def as_exact_array(value: ArrayLike, name: str, ndim: int | None) -> NDArray[Any]:
    """``value`` as an array whose dtype widens exactly to float64.

    ``ndim`` is the required number of dimensions (None accepts any).
    """
    arr = np.asarray(value)
    if arr.dtype not in _EXACT_DTYPES:
        accepted = "float16, float32, float64" + (" or bfloat16" if _BFLOAT16 is not None else "")
        raise TypeError(
            f"{name} has dtype {arr.dtype}; expected {accepted} "
            "(values are taken exactly, so other dtypes are refused rather than rounded)"
        )
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {arr.shape}")
    return arr


def row_dimensions(value: ArrayLike, name: str) -> int:
    """1 for a single row, 2 for ``[N, V]`` rows; any other rank is refused, naming ``name``."""
    ndim = np.ndim(value)
    if ndim not in (1, 2):
        raise ValueError(
            f"{name} must be 1-D (one row) or 2-D [N, V] (rows along the last axis), got "
            f"shape {np.shape(value)}"
        )
    return int(ndim)


def as_real_vocab_size(real_vocab_size: int | None, padded: int) -> int:
    """The number of live columns: ``padded`` for None, else a checked int."""
    if real_vocab_size is None:
        return padded
    if isinstance(real_vocab_size, (bool, np.bool_)):
        raise TypeError(f"real_vocab_size={real_vocab_size!r} must be an int or None")
    try:
        rv = operator.index(real_vocab_size)
    except TypeError:
        raise TypeError(f"real_vocab_size={real_vocab_size!r} must be an int or None") from None
    if not 0 <= rv <= padded:
        raise ValueError(
            f"real_vocab_size={rv} must be in [0, {padded}] (the number of logits columns)"
        )
    return rv


def as_targets(targets: ArrayLike, num_tokens: int) -> NDArray[Any]:
    """``targets`` as an integer array of shape ``(num_tokens,)``, values unchecked."""
    arr = np.asarray(targets)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"targets has dtype {arr.dtype}; expected an integer dtype")
    if arr.shape != (num_tokens,):
        raise ValueError(
            f"targets has shape {arr.shape}; expected ({num_tokens},) to match logits rows"
        )
    return arr


def as_active_mask(active_mask: ArrayLike | None, num_tokens: int) -> BoolArray:
    """``active_mask`` as a bool array of shape ``(num_tokens,)``; None means all active."""
    if active_mask is None:
        return np.ones(num_tokens, dtype=np.bool_)
    arr = np.asarray(active_mask)
    if arr.dtype != np.bool_:
        raise TypeError(f"active_mask has dtype {arr.dtype}; expected bool")
    if arr.shape != (num_tokens,):
        raise ValueError(
            f"active_mask has shape {arr.shape}; expected ({num_tokens},) to match logits rows"
        )
    return arr


def checked_targets(targets: NDArray[Any], active: BoolArray, real_vocab_size: int) -> IntArray:
    """Targets as int64 with inactive entries set to 0; raise on a bad active target.

    Every active target is checked before anything is computed. Inactive targets
    are never read, so they may hold ``ignore_index`` or any garbage.
    """
    bad = active & ((targets < 0) | (targets >= real_vocab_size))
    if bad.any():
        where = np.flatnonzero(bad)
        first = int(where[0])
        more = f" (and {where.size - 1} more)" if where.size > 1 else ""
        raise ValueError(
            f"targets[{first}]={int(targets[first])} is outside "
            f"[0, real_vocab_size={real_vocab_size}) for an active token{more}; "
            "fix the target or mark the token inactive in active_mask"
        )
    return np.where(active, targets, 0).astype(np.int64)


def as_shard_bounds(bounds: Sequence[Sequence[int]], padded: int) -> list[tuple[int, int]]:
    """Check that ``bounds`` are contiguous (start, end) pairs partitioning [0, padded)."""
    try:
        pairs = list(bounds)
    except TypeError:
        raise TypeError(
            f"vocab_shard_bounds={bounds!r} must be a sequence of (start, end) pairs"
        ) from None
    if not pairs:
        raise ValueError("vocab_shard_bounds=[] must hold at least one (start, end) pair")
    out: list[tuple[int, int]] = []
    expected_start = 0
    for k, pair in enumerate(pairs):
        try:
            start, end = (operator.index(v) for v in pair)
        except (TypeError, ValueError):
            raise TypeError(
                f"vocab_shard_bounds[{k}]={pair!r} must be a pair of ints (start, end)"
            ) from None
        if start != expected_start:
            raise ValueError(
                f"vocab_shard_bounds[{k}]=({start}, {end}): start must equal the previous "
                f"end {expected_start} (shards are contiguous, in shard-index order)"
            )
        if end <= start:
            raise ValueError(
                f"vocab_shard_bounds[{k}]=({start}, {end}): end must be greater than start"
            )
        out.append((start, end))
        expected_start = end
    if expected_start != padded:
        raise ValueError(
            f"vocab_shard_bounds ends at {expected_start}; the last end must equal the "
            f"number of logits columns {padded}"
        )
    return out


def as_sampling_params(
    top_k: Any, top_p: Any, min_p: Any
) -> tuple[int | None, float | None, float | None]:
    """Checked ``(top_k, top_p, min_p)``, each None when its rule is off.

    ``top_p = 1`` and ``min_p = 0`` are off, as None is (``docs/semantics.md``,
    "Processed logprobs"). Bools, NaN and values outside the rule's range are
    refused with the argument named.
    """
    k: int | None = None
    if top_k is not None:
        if isinstance(top_k, (bool, np.bool_)) or not isinstance(top_k, (int, np.integer)):
            raise TypeError(f"top_k={top_k!r} must be an int >= 1 or None")
        k = int(top_k)
        if k < 1:
            raise ValueError(f"top_k={top_k!r} must be an int >= 1 or None (None keeps all)")
    p = _fraction("top_p", top_p, low_open=True)
    q = _fraction("min_p", min_p, low_open=False)
    return k, None if p == 1.0 else p, None if q == 0.0 else q


def _fraction(name: str, value: Any, *, low_open: bool) -> float | None:
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise TypeError(f"{name}={value!r} must be a float or None")
    number = float(value)
    low_ok = number > 0.0 if low_open else number >= 0.0
    if not (low_ok and number <= 1.0):  # NaN fails both
        interval = "(0, 1]" if low_open else "[0, 1]"
        raise ValueError(f"{name}={value!r} must lie in {interval} (None leaves the rule off)")
    return number


def as_support_mask(mask: ArrayLike, shape: tuple[int, int], real_vocab_size: int) -> BoolArray:
    """``mask`` as a bool ``[N, V]`` array with every padding column False."""
    arr = np.asarray(mask)
    if arr.dtype != np.bool_:
        raise TypeError(
            f"support_mask has dtype {arr.dtype}; expected bool (True = in the support)"
        )
    if arr.shape != shape:
        raise ValueError(f"support_mask has shape {arr.shape}; expected {shape} to match logits")
    padding = arr[:, real_vocab_size:]
    if padding.any():
        row, column = (int(k) for k in np.argwhere(padding)[0])
        raise ValueError(
            f"support_mask[{row}, {real_vocab_size + column}]=True is a padding column "
            f"(real_vocab_size={real_vocab_size}); a support holds live columns only"
        )
    return arr
