"""fp32 sums in a given accumulation order, and the max-shifted log-sum-exp built on them.

Each :class:`Realization` is one concrete summation order (numpy fp32 adds, in a fixed
sequence) that a declared :class:`~tp_logprob.accumulation.AccumulationOrder` allows:
``declared`` gives that order. The soundness search (``tests/oracle/
test_oracle_order_tolerance.py``) and the tightness table (``benchmarks/bench_orders.py``)
run them against the exact oracle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tp_logprob.accumulation import AccumulationOrder

F32 = np.float32
INF = math.inf


@dataclass(frozen=True)
class Realization:
    """``kind``: ``sequential``, ``tree`` (bottom-up groups of ``fan_in`` adjacent
    partials, each group left to right), ``lanes`` (a ``block``-lane accumulator: each lane
    left to right over the blocks, then the lanes by ``within``), ``blocks`` (each block by
    ``within``, then the blocks by ``across``) or ``online`` (``lanes`` with a running
    maximum, the lanes rescaled at every block)."""

    kind: str
    block: int = 16
    fan_in: int = 2
    within: str = "sequential"
    across: str = "sequential"

    @property
    def declared(self) -> AccumulationOrder:
        """The declared order this realization is one instance of."""
        if self.kind == "sequential":
            return AccumulationOrder.sequential()
        if self.kind == "tree":
            return AccumulationOrder.tree(self.fan_in)
        if self.kind == "lanes":
            return AccumulationOrder.blocked(self.block, within=self.within, fan_in=self.fan_in)
        if self.kind == "blocks":
            return AccumulationOrder.blocked(
                self.block, within=self.within, across=self.across, fan_in=self.fan_in
            )
        return AccumulationOrder.online(self.block, within=self.within, fan_in=self.fan_in)

    def label(self) -> str:
        """The realization and the order it declares, in words."""
        return f"{self.kind}: {self.declared.describe()}"


def reduce_rows(values: np.ndarray, kind: str, fan_in: int = 2) -> np.ndarray:
    """fp32 sums of each row of a 2-D array: left to right (``np.cumsum`` adds strictly in
    order) or by a bottom-up tree of ``fan_in`` adjacent partials, each group left to right.
    Zero padding adds exactly nothing."""
    values = np.asarray(values, F32)
    if values.shape[1] == 0:
        return np.zeros(values.shape[0], F32)
    if kind == "sequential":
        return np.cumsum(values, axis=1, dtype=F32)[:, -1]
    while values.shape[1] > 1:
        pad = -values.shape[1] % fan_in
        values = np.pad(values, ((0, 0), (0, pad)))
        groups = values.reshape(values.shape[0], -1, fan_in)
        values = np.cumsum(groups, axis=2, dtype=F32)[:, :, -1]
    return values[:, 0]


def flat_sum(terms: np.ndarray, kind: str, fan_in: int = 2) -> Any:
    """fp32 sum of a 1-D array, left to right or by a bottom-up tree of ``fan_in``."""
    return reduce_rows(np.asarray(terms, F32)[None, :], kind, fan_in)[0]


def _blocks(terms: np.ndarray, block: int) -> np.ndarray:
    """``terms`` as ``[blocks, block]``, the last block padded with zeros."""
    padded = np.pad(np.asarray(terms, F32), (0, -terms.size % block))
    return padded.reshape(-1, block)


def shard_sum(terms: np.ndarray, how: Realization) -> Any:
    """fp32 sum of a shard's terms ``exp(x - m)`` in ``how``'s order (not ``online``)."""
    if how.kind in ("sequential", "tree"):
        return flat_sum(terms, how.kind, how.fan_in)
    tiles = _blocks(terms, how.block)
    if how.kind == "lanes":
        lanes = reduce_rows(tiles.T, "sequential")[: min(how.block, terms.size)]
        return flat_sum(lanes, how.within, how.fan_in)
    return flat_sum(reduce_rows(tiles, how.within, how.fan_in), how.across, how.fan_in)


def _online(xs: np.ndarray, how: Realization) -> tuple[Any, Any]:
    block = how.block
    lanes = np.zeros(min(block, xs.size), F32)
    m = F32(-INF)
    for start in range(0, xs.size, block):
        chunk = xs[start : start + block]
        new_m = F32(max(m, chunk.max()))
        if new_m == -INF:
            continue
        scale = F32(0) if m == -INF else np.exp(F32(m - new_m))
        weights = np.zeros_like(lanes)
        weights[: chunk.size] = np.exp(chunk - new_m)
        lanes = ((lanes * scale).astype(F32) + weights).astype(F32)
        m = new_m
    return m, flat_sum(lanes, how.within, how.fan_in)


def partial32(xs: np.ndarray, how: Realization) -> tuple[Any, Any]:
    """Shard partial ``(m, s)`` in fp32; the identity ``(-inf, 0)`` for no finite column."""
    if xs.size == 0 or xs.max() == -INF:
        return F32(-INF), F32(0)
    if how.kind == "online":
        return _online(xs, how)
    m = xs.max()
    return m, shard_sum(np.exp(xs - m).astype(F32), how)


def order_logprob(
    row: np.ndarray,
    target_index: int,
    real_vocab_size: int,
    bounds: list[tuple[int, int]],
    how: Realization,
) -> tuple[float, float]:
    """``(x_t - lse, lse)`` in fp32: shard partials in ``how``'s order, merged in rank order."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        parts = [partial32(row[a : min(b, real_vocab_size)], how) for a, b in bounds]
        big_m = max(m for m, _ in parts)
        total = F32(0)
        for m, s in parts:
            if m != -INF:
                total = F32(total + F32(s * np.exp(F32(m - big_m))))
        lse = F32(big_m + np.log(total))
        return float(F32(row[target_index] - lse)), float(lse)
