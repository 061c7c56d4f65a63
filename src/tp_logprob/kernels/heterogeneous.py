"""A heterogeneous batch on a batch-invariant op: one call per group of rows, then the
rows put back in place.

``docs/semantics.md``, "Heterogeneous batches": each row of an engine batch may bring
its own temperature (0 for a greedy row) and sampling parameters, and every output of
a row depends on that row alone. :func:`~tp_logprob.row_groups.row_groups` splits
such a batch into groups with one set of parameters each; :func:`by_row_groups`
runs the op on each group's rows (``local_logits[rows]``, a differentiable gather, so
gradients reach the caller's tensor) and puts every output back at its rows with one
differentiable gather of the concatenated parts. An op whose rows do not depend on the
other rows (``fixed_topology`` or stronger) gives each row the bits it gives in a
batch of its own group. Collectives run once per group, in the same order on every
rank (every rank holds the same contract, so the same groups).

A Triton backend reads each row's temperature from a tensor, so it needs groups of rows
that share their sampling rules only (:func:`by_rule_groups`, with
:func:`~tp_logprob.row_groups.rule_groups`): one launch for a batch whose rows differ in
temperature alone, greedy rows included (divisor 1, and ``x / 1`` is exact, so each row
keeps the bits of its ``(T, rules)`` group run alone).

A fused LM-head op (:func:`fused_by_row_groups`, :func:`fused_by_rule_groups`) takes the
hidden states' rows the same way; its ``weight`` and ``bias`` are the rank's vocabulary
rows, shared by every group, so their gradients are the sums over the groups.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.validation import check_fused_inputs, check_op_inputs
from tp_logprob.result import LogprobResult
from tp_logprob.row_groups import RowGroup, row_groups, rule_groups

__all__ = ["by_row_groups", "by_rule_groups", "fused_by_row_groups", "fused_by_rule_groups"]

LogprobOp = Callable[..., LogprobResult]
InputsCheck = Callable[..., Any]
"""``(rows, targets, contract, group, **shared)``: checks the whole batch's inputs."""
Split = Callable[[LogprobContract], tuple[RowGroup, ...]]


def by_row_groups(op: LogprobOp) -> LogprobOp:
    """``op`` (a logits op) serving heterogeneous contracts too: a contract with one set
    of parameters goes to ``op`` unchanged, one with per-row parameters group by group."""
    return _grouped(op, check_op_inputs, row_groups)


def by_rule_groups(op: LogprobOp) -> LogprobOp:
    """:func:`by_row_groups` for a logits op that takes a per-row temperature itself: one
    call per set of sampling rules."""
    return _grouped(op, check_op_inputs, rule_groups)


def fused_by_row_groups(op: LogprobOp) -> LogprobOp:
    """:func:`by_row_groups` for a fused LM-head op: the groups split the hidden states'
    rows and share the keyword arguments ``weight`` and ``bias``."""
    return _grouped(op, _check_fused, row_groups)


def fused_by_rule_groups(op: LogprobOp) -> LogprobOp:
    """:func:`by_rule_groups` for a fused LM-head op (shared ``weight`` and ``bias``)."""
    return _grouped(op, _check_fused, rule_groups)


def _check_fused(
    hidden: Any, targets: Any, contract: Any, group: Any, *, weight: Any, bias: Any = None
) -> Any:
    return check_fused_inputs(hidden, targets, contract, group, weight, bias)


def _grouped(op: LogprobOp, check: InputsCheck, split: Split) -> LogprobOp:
    @functools.wraps(op)
    def grouped(
        local_rows: torch.Tensor,
        targets: torch.Tensor,
        contract: LogprobContract,
        group: Any = None,
        **shared: Any,
    ) -> LogprobResult:
        if not isinstance(contract, LogprobContract) or not contract.heterogeneous:
            return op(local_rows, targets, contract, group, **shared)
        check(local_rows, targets, contract, group, **shared)  # the whole batch's inputs
        groups = split(contract)
        if len(groups) == 1:  # one call serves the batch, with its one set of rules
            return op(local_rows, targets, groups[0].contract, group, **shared)
        results = []
        for part in groups:
            rows = torch.from_numpy(part.rows).to(local_rows.device)
            results.append(op(local_rows[rows], targets[rows], part.contract, group, **shared))
        order = np.argsort(np.concatenate([part.rows for part in groups]), kind="stable")
        inverse = torch.from_numpy(order).to(local_rows.device)
        return _joined(results, inverse)

    return grouped


def _joined(results: list[LogprobResult], inverse: torch.Tensor) -> LogprobResult:
    """Every output of the groups' ``results`` in batch order (None stays None)."""

    def join(values: list[Any]) -> Any:
        if values[0] is None:
            return None
        return torch.cat(values)[inverse]

    fields = {
        name: join([result.__dict__.get(name) for result in results])
        for name in LogprobResult.SUPPORT_FIELDS
    }
    return LogprobResult(
        join([result.selected_logp for result in results]),
        join([result.lse for result in results]),
        join([result.entropy for result in results]),
        **fields,
    )
