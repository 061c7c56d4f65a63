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
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.validation import check_op_inputs
from tp_logprob.result import LogprobResult
from tp_logprob.row_groups import row_groups

__all__ = ["by_row_groups"]

LogprobOp = Callable[..., LogprobResult]


def by_row_groups(op: LogprobOp) -> LogprobOp:
    """``op`` serving heterogeneous contracts too: a contract with one set of parameters
    goes to ``op`` unchanged, one with per-row parameters group by group."""

    @functools.wraps(op)
    def grouped(
        local_logits: torch.Tensor,
        targets: torch.Tensor,
        contract: LogprobContract,
        group: Any = None,
    ) -> LogprobResult:
        if not isinstance(contract, LogprobContract) or not contract.heterogeneous:
            return op(local_logits, targets, contract, group)
        check_op_inputs(local_logits, targets, contract, group)  # the whole batch's inputs
        groups = row_groups(contract)
        results = []
        for part in groups:
            rows = torch.from_numpy(part.rows).to(local_logits.device)
            results.append(op(local_logits[rows], targets[rows], part.contract, group))
        order = np.argsort(np.concatenate([part.rows for part in groups]), kind="stable")
        inverse = torch.from_numpy(order).to(local_logits.device)
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
