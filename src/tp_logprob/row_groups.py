"""A heterogeneous batch as groups of rows that share their sampling parameters.

An engine batches requests that bring their own temperature and top-k / top-p /
min-p, and greedy requests beside sampled ones. Every output of a row depends only
on that row's logits and parameters (``docs/semantics.md``, "Heterogeneous
batches"), so a batch with per-row parameters is, row for row, the union of
batches with one set each: :func:`row_groups` gives those batches, each as the
rows it holds and a contract with one temperature and one set of parameters.

A greedy row (per-row temperature 0) joins the rows at ``T = 1`` whose sampling
rules are all off: the engines divide a greedy row by 1 and sample it from the
full distribution's argmax, and return that distribution's logprob.

The oracle side judges a heterogeneous batch group by group, and a backend that
serves per-row parameters without a per-row kernel may compute it the same way;
a batch-invariant backend gives every row the same bits either way. A kernel that
reads each row's temperature from a tensor needs only :func:`rule_groups`: the rows
grouped by their sampling rules alone, each keeping its own temperature.

Pure Python and numpy: importing it never imports torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.contract import LogprobContract, MaskSpec
from tp_logprob.support import RowRules, SupportMode, SupportSpec

__all__ = ["RowGroup", "contract_rows", "row_groups", "rule_groups"]

_RULES_OFF: RowRules = (None, None, None)


@dataclass(frozen=True, eq=False)
class RowGroup:
    """The rows (int64 positions in the batch, ascending) that share one set of sampling
    parameters, and the contract of those rows alone, with one temperature and one set."""

    rows: npt.NDArray[np.int64]
    contract: LogprobContract


def row_groups(contract: LogprobContract) -> tuple[RowGroup, ...]:
    """The batch's rows grouped by ``(temperature, top_k, top_p, min_p)``, in order of
    each group's first row; a contract with one set per batch is one group of every row.

    >>> import tp_logprob as tpl
    >>> contract = tpl.LogprobContract(
    ...     role="infer", dtype="fp32", mask=tpl.MaskSpec(num_tokens=3),
    ...     sharding=tpl.ShardingSpec(0, 1, ((0, 8),), 8, 8),
    ...     reduction=tpl.ReductionSpec(), temperature=(0.7, 0.0, 0.7))
    >>> [group.rows.tolist() for group in row_groups(contract)]
    [[0, 2], [1]]
    """
    if not contract.heterogeneous:
        return (RowGroup(np.arange(contract.num_tokens, dtype=np.int64), contract),)
    if contract.num_tokens == 0:  # no row, so no row's parameters: an empty batch at T = 1
        empty = dataclasses.replace(contract, temperature=1.0)
        return (RowGroup(np.zeros(0, dtype=np.int64), empty),)
    keys = [_row_key(contract, row) for row in range(contract.num_tokens)]
    order: dict[tuple[float, RowRules], list[int]] = {}
    for row, key in enumerate(keys):
        order.setdefault(key, []).append(row)
    return tuple(
        RowGroup(np.array(rows, dtype=np.int64), _group_contract(contract, rows, key))
        for key, rows in order.items()
    )


def rule_groups(contract: LogprobContract) -> tuple[RowGroup, ...]:
    """The batch's rows grouped by ``(top_k, top_p, min_p)`` alone, in order of each group's
    first row; each group's contract keeps its rows' own temperatures (per row) and has
    one set of rules. A greedy row joins the rows whose rules are all off (its divisor is
    1, :meth:`~tp_logprob.contract.LogprobContract.row_divisors`).

    >>> import tp_logprob as tpl
    >>> contract = tpl.LogprobContract(
    ...     role="infer", dtype="fp32", mask=tpl.MaskSpec(num_tokens=3),
    ...     sharding=tpl.ShardingSpec(0, 1, ((0, 8),), 8, 8),
    ...     reduction=tpl.ReductionSpec(), temperature=(0.7, 0.0, 1.3))
    >>> [group.rows.tolist() for group in rule_groups(contract)]
    [[0, 1, 2]]
    """
    if not contract.heterogeneous or contract.num_tokens == 0:
        return row_groups(contract)
    order: dict[RowRules, list[int]] = {}
    for row in range(contract.num_tokens):
        order.setdefault(_row_key(contract, row)[1], []).append(row)
    groups = []
    for rules, rows in order.items():
        picked = np.array(rows, dtype=np.int64)
        support = _group_support(contract.support, picked, rules)
        groups.append(
            RowGroup(picked, dataclasses.replace(contract_rows(contract, picked), support=support))
        )
    return tuple(groups)


def contract_rows(contract: LogprobContract, rows: npt.ArrayLike) -> LogprobContract:
    """The contract of ``rows`` of the batch only (in that order, repeats allowed): their
    active flags, per-row temperatures and sampling parameters, replayed kept ids."""
    picked = np.asarray(rows, dtype=np.int64)
    temperature = contract.temperature
    if isinstance(temperature, tuple):
        temperature = tuple(temperature[row] for row in picked)
    return dataclasses.replace(
        contract,
        mask=_mask_rows(contract.mask, picked),
        temperature=temperature,
        support=_support_rows(contract.support, picked),
    )


def _mask_rows(mask: MaskSpec, rows: npt.NDArray[np.int64]) -> MaskSpec:
    active = None if mask.active_mask is None else mask.dense()[rows]
    return MaskSpec(num_tokens=len(rows), active_mask=active, ignore_index=mask.ignore_index)


def _support_rows(support: SupportSpec | None, rows: npt.NDArray[np.int64]) -> SupportSpec | None:
    if support is None:
        return None
    if support.mode is SupportMode.REPLAYED_MASK:
        return SupportSpec.from_kept_lists([support.kept_row(int(row)).tolist() for row in rows])
    if not support.per_row:
        return support

    def pick(value: Any) -> Any:
        return tuple(value[row] for row in rows) if isinstance(value, tuple) else value

    return SupportSpec(
        top_k=pick(support.top_k), top_p=pick(support.top_p), min_p=pick(support.min_p)
    )


def _row_key(contract: LogprobContract, row: int) -> tuple[float, RowRules]:
    """The row's ``(temperature, rules)``; a greedy row's are ``(1.0, every rule off)``."""
    temperature = contract.temperature
    value = temperature[row] if isinstance(temperature, tuple) else temperature
    support = contract.support
    if value == 0.0:
        return 1.0, _RULES_OFF
    if support is None or support.mode is SupportMode.REPLAYED_MASK:
        return value, _RULES_OFF
    return value, support.row_rules(row)


def _group_contract(
    contract: LogprobContract, rows: list[int], key: tuple[float, RowRules]
) -> LogprobContract:
    temperature, rules = key
    picked = np.array(rows, dtype=np.int64)
    return dataclasses.replace(
        contract,
        mask=_mask_rows(contract.mask, picked),
        temperature=temperature,
        support=_group_support(contract.support, picked, rules),
    )


def _group_support(
    support: SupportSpec | None, rows: npt.NDArray[np.int64], rules: RowRules
) -> SupportSpec | None:
    """The group's support: its rows of a replayed mask, or its one set of rules (a spec
    with every rule off, ``top_p=1``, where the rows sample from every live column)."""
    if support is None or support.mode is SupportMode.REPLAYED_MASK:
        return _support_rows(support, rows)
    if rules == _RULES_OFF:
        return SupportSpec(top_p=1.0)
    return SupportSpec(top_k=rules[0], top_p=rules[1], min_p=rules[2])
