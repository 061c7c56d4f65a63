"""Shared builders for the torch_native tests: contracts, shard layouts, inputs, bit checks."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import tp_logprob as tpl
from tp_logprob.kernels.dtypes import TORCH_DTYPES
from tp_logprob.oracle import exact_selected_logprob

REAL = 19
PADDED = 24

# Shard layouts of the padded vocabulary [0, 24) with real vocabulary [0, 19):
# even splits, width-1 shards, shards straddling the padding boundary and shards
# made only of padding columns.
LAYOUTS: dict[str, tuple[tuple[int, int], ...]] = {
    "tp1": ((0, 24),),
    "tp2-width1": ((0, 1), (1, 24)),
    "tp2-padding-shard": ((0, 19), (19, 24)),
    "tp3-uneven": ((0, 10), (10, 11), (11, 24)),
    "tp3-padding-shard": ((0, 8), (8, 19), (19, 24)),
    "tp4-even": ((0, 6), (6, 12), (12, 18), (18, 24)),
    "tp4-width1-padding": ((0, 1), (1, 2), (2, 20), (20, 24)),
    "tp8-even": tpl.even_shard_bounds(24, 8),
    "tp8-mixed": ((0, 1), (1, 2), (2, 3), (3, 10), (10, 18), (18, 19), (19, 20), (20, 24)),
}


def make_contract(
    bounds: tuple[tuple[int, int], ...] = LAYOUTS["tp1"],
    *,
    num_tokens: int = 4,
    active_mask: Any = None,
    dtype: str = "fp32",
    role: str = "infer",
    real: int = REAL,
    padded: int | None = None,
    output_dtype: str = "fp32",
    export_lse: bool = True,
    ignore_index: int = -100,
) -> tpl.LogprobContract:
    """Rank 0's contract for ``bounds``; use ``with_rank`` for the others."""
    padded = bounds[-1][1] if padded is None else padded
    return tpl.LogprobContract(
        role=role,
        dtype=dtype,
        mask=tpl.MaskSpec(num_tokens, active_mask, ignore_index=ignore_index),
        sharding=tpl.ShardingSpec(0, len(bounds), bounds, real, padded),
        reduction=tpl.ReductionSpec("fixed_topology"),
        output=tpl.LogprobOutputSpec(output_dtype),
        export_lse=export_lse,
    )


def on_device(op: Callable[..., Any], device: torch.device) -> Callable[..., Any]:
    """``op`` run on ``device``: tensor arguments (and tensor fields of dataclass arguments) are
    moved there and tensor results come back to the CPU, so the tests' oracle checks, bit
    comparisons and gradients (through ``.to``) stay as written. Identity on the CPU."""
    if device.type == "cpu":
        return op

    def move(value: Any, where: torch.device) -> Any:
        if isinstance(value, torch.Tensor):
            return value.to(where)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            changes = {
                field.name: move(getattr(value, field.name), where)
                for field in dataclasses.fields(value)
                if field.init and isinstance(getattr(value, field.name), torch.Tensor)
            }
            return dataclasses.replace(value, **changes)
        if isinstance(value, tuple):
            items = [move(item, where) for item in value]
            return tuple(items) if type(value) is tuple else type(value)(*items)
        return value

    @functools.wraps(op)
    def run(*args: Any, **kwargs: Any) -> Any:
        moved = [move(arg, device) for arg in args]
        result = op(*moved, **{key: move(value, device) for key, value in kwargs.items()})
        return move(result, torch.device("cpu"))

    return run


def random_inputs(
    seed: int,
    num_tokens: int,
    *,
    dtype: str = "fp32",
    real: int = REAL,
    padded: int = PADDED,
    scale: float = 4.0,
    active_mask: Any = None,
    ignore_index: int = -100,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Full ``[N, padded]`` logits of ``dtype`` and targets (``ignore_index`` where inactive)."""
    rng = np.random.default_rng(seed)
    logits = torch.from_numpy(rng.normal(0.0, scale, (num_tokens, padded)).astype(np.float32))
    targets = torch.from_numpy(rng.integers(0, real, num_tokens))
    if active_mask is not None:
        targets[~torch.as_tensor(np.asarray(active_mask))] = ignore_index
    return logits.to(TORCH_DTYPES[tpl.LogprobDType(dtype)]), targets


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bit pattern, so NaN payloads and signed zeros compare exactly."""
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return tensor.detach().contiguous().view(ints)


def assert_same_bits(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    same = bits(actual) == bits(expected)
    if not bool(same.all()):
        rows = torch.nonzero(~same).flatten().tolist()
        raise AssertionError(
            f"{what}: bits differ at rows {rows[:8]}: {actual[rows[:8]].tolist()} vs "
            f"{expected[rows[:8]].tolist()}"
        )


def as_float64(tensor: torch.Tensor) -> np.ndarray:
    """Exact float64 copy of a bf16/fp16/fp32 tensor, for the oracle."""
    return tensor.detach().to(torch.float64).numpy()


def oracle_report(
    result: tpl.LogprobResult,
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    active_mask: Any,
    table: Any,
    real: int = REAL,
) -> str | None:
    """None when fp32 outputs are within ``table`` (a ``tolerance(...)``), else the bad rows."""
    x = as_float64(logits)
    want_selected, want_lse = exact_selected_logprob(
        x, targets.numpy(), active_mask=active_mask, real_vocab_size=real
    )
    live = x[:, :real]
    with np.errstate(invalid="ignore"):
        row_max = np.where(np.isnan(live).any(axis=1), np.nan, live.max(axis=1))
    got_selected = result.selected_logp.double().numpy()
    got_lse = result.lse.double().numpy()
    bad = table.violations(
        got_selected, got_lse, want_selected, want_lse, row_max=row_max, active_mask=active_mask
    )
    if not bad.any():
        return None
    rows = np.flatnonzero(bad)[:5].tolist()
    lines = [f"{int(bad.sum())} of {bad.size} rows outside {table}"]
    lines += [
        f"  row {i}: selected {got_selected[i]!r} want {want_selected[i]!r}; "
        f"lse {got_lse[i]!r} want {want_lse[i]!r}"
        for i in rows
    ]
    return "\n".join(lines)


NAN, INF = float("nan"), float("inf")

# Special-value rows shared by every backend's tests: 8 live logits (the tests lay
# them out on a tp=2 layout ((0, 4), (4, 8)), padding columns holding NaN and +inf),
# the target, whether active, and the expected (selected, lse); "finite" means a
# finite value, compared with float64 torch.
SPECIAL_CASES = {
    "nan-in-live-column": ([0, 1, NAN, 2, 0, 0, 0, 0], 0, True, "nan", "nan"),
    "nan-in-target-column": ([0, 1, 2, 3, NAN, 0, 0, 0], 4, True, "nan", "nan"),
    "+inf-in-live-column": ([0, 1, 2, 3, 0, INF, 0, 0], 0, True, "nan", INF),
    "+inf-target": ([0, 1, 2, 3, 0, INF, 0, 0], 5, True, "nan", INF),
    "+inf-in-both-shards": ([INF, 1, 2, 3, 0, INF, 0, 0], 1, True, "nan", INF),
    "+inf-and-nan": ([INF, 1, 2, 3, 0, NAN, 0, 0], 1, True, "nan", "nan"),
    "-inf-target-finite-max": ([0, 1, -INF, 3, 0, 2, 0, 0], 2, True, -INF, "finite"),
    "all-live-minus-inf": ([-INF] * 8, 3, True, "nan", -INF),
    "one-shard-all-minus-inf": ([-INF] * 4 + [1, 2, 3, 4], 6, True, "finite", "finite"),
    "one-finite-column": ([-INF] * 7 + [5.0], 7, True, 0.0, 5.0),
    "huge-finite-logits": ([3e38, -3e38, 3e38, 0, 1, 2, 3, 3e38], 0, True, "finite", "finite"),
    "inactive-row-with-nan": ([0, 1, NAN, 2, 0, 0, 0, 0], -100, False, 0.0, "nan"),
    "inactive-row-all-minus-inf": ([-INF] * 8, -100, False, 0.0, -INF),
    "inactive-row-with-+inf": ([0, INF, 0, 0, 0, 0, 0, 0], -100, False, 0.0, INF),
}


PADDING_FILLS: tuple[float | str, ...] = (
    float("nan"),
    float("inf"),
    float("-inf"),
    3.0e38,
    "random",
)
"""What the padding columns of one row each hold in :func:`garbage_padding_inputs`."""


def garbage_padding_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(clean, garbage, targets)``: one row per :data:`PADDING_FILLS`, the same live
    columns, padding all zero in ``clean`` and holding that row's fill in ``garbage``."""
    garbage, targets = random_inputs(4, len(PADDING_FILLS))
    clean = garbage.clone()
    clean[:, REAL:] = 0.0
    for row, fill in enumerate(PADDING_FILLS):
        if fill == "random":
            garbage[row, REAL:] = torch.randn(PADDED - REAL) * 100
        else:
            garbage[row, REAL:] = fill
    return clean, garbage, targets
