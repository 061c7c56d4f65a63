"""What the asserts take in: torch tensors (any device) or numpy arrays, checked and copied.

A tensor is recognised by its type's module, so numpy inputs never import torch.
Every check raises :class:`~tp_logprob.errors.LogprobContractError` naming the
argument, before the oracle runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.errors import LogprobContractError

Floats = npt.NDArray[np.float64]

_WIDENING = ("bfloat16", "float16", "float32")


def is_tensor(value: Any) -> bool:
    """Whether ``value`` is a torch tensor (without importing torch)."""
    return type(value).__module__.split(".")[0] == "torch" and hasattr(value, "detach")


def as_numpy(value: Any, name: str) -> npt.NDArray[Any]:
    """``value`` as a numpy array: a tensor is detached, moved to the CPU and, when it is
    bf16 or fp16, widened to fp32 (exactly)."""
    if is_tensor(value):
        tensor = value.detach()
        if str(tensor.dtype) in ("torch.bfloat16", "torch.float16"):
            tensor = tensor.float()
        return np.asarray(tensor.cpu().numpy())
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as error:
        raise LogprobContractError(f"{name}: not an array or tensor ({error})") from None


def as_logits(value: Any, name: str = "logits") -> npt.NDArray[np.float32]:
    """``[N, V]`` logits as float32, exactly: bf16, fp16 and fp32 values, or float64 ones
    that are fp32 values (anything else would be judged on values the kernel never read)."""
    array = as_numpy(value, name)
    if array.ndim != 2:
        raise LogprobContractError(f"{name}: shape {array.shape}, expected 2-D [N, V]")
    if array.dtype.name in _WIDENING:
        return np.asarray(array, dtype=np.float32)
    if array.dtype == np.float64:
        with np.errstate(over="ignore", invalid="ignore"):
            narrow = array.astype(np.float32)
        if np.array_equal(narrow, array, equal_nan=True):
            return narrow
        row, column = (int(k) for k in np.argwhere(~(narrow == array) & ~np.isnan(array))[0])
        raise LogprobContractError(
            f"{name}[{row}, {column}]={float(array[row, column])!r}: not an fp32 value; pass "
            "the logits the kernel read (bf16, fp16 or fp32)"
        )
    raise LogprobContractError(
        f"{name}: dtype {array.dtype}, expected bf16, fp16 or fp32 logits (fp32 arrays or tensors)"
    )


def joined_shards(shards: Any, name: str = "tp_shards") -> tuple[npt.NDArray[np.float32], ...]:
    """Per-rank ``[N, V_r]`` logits (or gradients), checked: as many rows each, a column or
    more each."""
    if isinstance(shards, (str, bytes)) or not isinstance(shards, Sequence) or not shards:
        raise LogprobContractError(
            f"{name}={type(shards).__name__}: expected a non-empty list of per-rank [N, V_r] "
            "shards, in rank order"
        )
    arrays = tuple(as_logits(shard, f"{name}[{rank}]") for rank, shard in enumerate(shards))
    rows = arrays[0].shape[0]
    for rank, array in enumerate(arrays):
        if array.shape[0] != rows:
            raise LogprobContractError(
                f"{name}[{rank}]: {array.shape[0]} rows, {name}[0] has {rows}; every rank holds "
                "every token"
            )
        if array.shape[1] == 0:
            raise LogprobContractError(
                f"{name}[{rank}]: shape {array.shape}; a rank's shard has at least one column"
            )
    return arrays


def shard_bounds(widths: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """The contiguous ``(start, end)`` columns of shards of ``widths``, in rank order."""
    ends = np.cumsum(widths).tolist()
    return tuple(zip([0, *ends[:-1]], ends, strict=True))


def per_row(value: Any, name: str, rows: int) -> Floats:
    """An output with one float per row (``selected_logp``, ``lse``, ``entropy``) as float64."""
    array = as_numpy(value, name)
    if array.dtype.kind != "f" and array.dtype.name != "bfloat16":
        raise LogprobContractError(f"{name}: dtype {array.dtype}, expected a float dtype")
    if array.shape != (rows,):
        raise LogprobContractError(
            f"{name}: shape {array.shape}, expected ({rows},): one value per logits row"
        )
    return np.asarray(array, dtype=np.float64)


def gradient(value: Any, name: str, shape: tuple[int, int], sharded: bool) -> Floats:
    """``d sum(selected_logp) / d logits`` as float64 ``[N, V]``: the full array, or per-rank
    shards (``sharded``) joined along the vocabulary."""
    if sharded and isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        joined = np.concatenate(joined_shards(value, name), axis=1)
    else:
        joined = as_logits(value, name)
    if joined.shape != shape:
        raise LogprobContractError(
            f"{name}: shape {joined.shape}, expected {shape} (the logits' shape)"
        )
    return np.asarray(joined, dtype=np.float64)
