"""Rows and their exact outputs rounded to fp32: what a correct kernel returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.oracle import exact_entropy, exact_logprob_grad, exact_selected_logprob
from tp_logprob.strategies import round_to_dtype

F32 = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Batch:
    """Logits, targets and the exact outputs rounded to fp32 (``grad`` in the logits dtype)."""

    logits: F32
    targets: npt.NDArray[np.int64]
    selected: F32
    lse: F32
    entropy: F32
    grad: F32
    options: dict[str, Any]


def batch(
    rows: int = 6,
    width: int = 48,
    *,
    dtype: str = "fp32",
    seed: int = 0,
    **options: Any,
) -> Batch:
    """A random ``[rows, width]`` batch of ``dtype`` values; ``options`` go to the oracle
    (``temperature``, ``real_vocab_size``, ``active_mask``)."""
    rng = np.random.default_rng(seed)
    logits = round_to_dtype(rng.normal(size=(rows, width)) * 3, dtype)
    live = options.get("real_vocab_size") or width
    targets = rng.integers(0, live, rows)
    selected, lse = exact_selected_logprob(logits, targets, **options)
    entropy = exact_entropy(logits, **options)
    grad = round_to_dtype(exact_logprob_grad(logits, targets, **options), dtype)
    return Batch(
        logits,
        targets,
        selected.astype(np.float32),
        lse.astype(np.float32),
        entropy.astype(np.float32),
        grad,
        {"dtype": dtype, **options},
    )


def nudged(values: F32, index: Any, ulps: int) -> F32:
    """``values`` with ``values[index]`` moved by ``ulps`` fp32 ulps."""
    out = np.array(values, dtype=np.float32)
    flat = out.reshape(-1).view(np.int32)
    position = int(np.ravel_multi_index(index, out.shape)) if isinstance(index, tuple) else index
    sign = 1 if out.reshape(-1)[position] >= 0 else -1
    flat[position] += sign * ulps
    return out
