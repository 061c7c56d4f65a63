"""Mutants that read their inputs as if they were laid out densely: right on a fresh
contiguous tensor, wrong on the views trainers pass.

A kernel launcher that hands the kernel a data pointer and the row stride only
assumes a unit column stride; one that indexes ``targets_ptr + row`` assumes dense
targets (``fused_layout_bugs``: one that flattens the hidden states assumes their
rows are ``H`` apart). Each mutant below reads its input through ``as_strided``
with the assumed strides (the storage offset kept), as such a kernel would. Only a
case whose tensors reach the op in another layout
(:mod:`tp_logprob.strategies.input_forms`) can see them.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.mutants._compose import mutant
from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.native import native_forward


def _forward_unit_column_stride(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: Any,
) -> tuple[torch.Tensor, ...]:
    # BUG: only the row stride reaches the kernel; columns are read one element apart.
    dense_columns = local_logits.as_strided(local_logits.shape, (local_logits.stride(0), 1))
    return native_forward(dense_columns, targets, active, contract, group)


def _forward_dense_targets(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: Any,
) -> tuple[torch.Tensor, ...]:
    # BUG: targets read at targets_ptr + row, whatever their stride.
    dense = targets.as_strided(targets.shape, (1,))
    return native_forward(local_logits, dense, active, contract, group)


unit_column_stride = mutant("unit_column_stride", forward=_forward_unit_column_stride)
dense_targets = mutant("dense_targets", forward=_forward_dense_targets)
