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
    ``within``, then the blocks by ``across``), ``online`` (``lanes`` with a running
    maximum, the lanes rescaled at every block) or ``fixed_point`` (``block`` fractional
    bits)."""

    kind: str
    block: int = 16
    fan_in: int = 2
    within: str = "sequential"
    across: str = "sequential"
    edge: bool = False
    """``exp`` and ``log`` at the edge of the tolerance's assumptions A3 and A5: every ``exp``
    3 ulps above the exact value, every ``log`` ``8u`` relative and ``2^-22`` absolute above."""

    @property
    def declared(self) -> AccumulationOrder:
        """The declared order this realization is one instance of."""
        if self.kind == "sequential":
            return AccumulationOrder.sequential()
        if self.kind == "tree":
            return AccumulationOrder.tree(self.fan_in)
        if self.kind == "fixed_point":
            return AccumulationOrder.fixed_point(self.block)
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


def exp32(x: Any, edge: bool) -> Any:
    """fp32 ``exp``: numpy's, or 3 ulps above the exact value (``edge``; A3 allows that)."""
    if not edge:
        return np.exp(np.asarray(x, F32))
    exact = np.exp(np.asarray(x, np.float64))
    y = exact.astype(F32)
    y = np.where(y < exact, np.nextafter(y, F32(INF)), y)
    for _ in range(2):
        y = np.nextafter(y, F32(INF))
    return np.where(exact == 0.0, F32(0), y).astype(F32)


def log32(s: Any, edge: bool) -> Any:
    """fp32 ``log``: numpy's, or at A5's edge (``edge``: ``8u`` relative and ``2^-22`` above)."""
    if not edge:
        return np.log(np.asarray(s, F32))
    exact = float(np.log(np.float64(s)))
    high = exact * (1.0 + 8.0 * 2.0**-24) + 2.0**-22
    y = F32(high)
    return np.nextafter(y, F32(-INF)) if float(y) > high else y


def _online(xs: np.ndarray, how: Realization) -> tuple[Any, Any]:
    block = how.block
    lanes = np.zeros(min(block, xs.size), F32)
    m = F32(-INF)
    for start in range(0, xs.size, block):
        chunk = xs[start : start + block]
        new_m = F32(max(m, chunk.max()))
        if new_m == -INF:
            continue
        scale = F32(0) if m == -INF else exp32(F32(m - new_m), how.edge)
        weights = np.zeros_like(lanes)
        weights[: chunk.size] = exp32(chunk - new_m, how.edge)
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
    return m, shard_sum(exp32(xs - m, how.edge), how)


def order_logprob(
    row: np.ndarray,
    target_index: int,
    real_vocab_size: int,
    bounds: list[tuple[int, int]],
    how: Realization,
) -> tuple[float, float]:
    """``(x_t - lse, lse)`` in fp32: shard partials in ``how``'s order, merged in rank order
    (``fixed_point``: every term to int64 with ``how.block`` fractional bits, summed exactly)."""
    if how.kind == "fixed_point":
        return _fixed_point(row, target_index, real_vocab_size, how)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        parts = [partial32(row[a : min(b, real_vocab_size)], how) for a, b in bounds]
        big_m = max(m for m, _ in parts)
        total = F32(0)
        for m, s in parts:
            if m != -INF:
                total = F32(total + F32(s * exp32(F32(m - big_m), how.edge)))
        lse = F32(big_m + log32(total, how.edge))
        return float(F32(row[target_index] - lse)), float(lse)


def _fixed_point(
    row: np.ndarray, t: int, real_vocab_size: int, how: Realization
) -> tuple[float, float]:
    live = row[:real_vocab_size]
    big_m = live.max()
    terms = np.floor(np.ldexp(exp32(live - big_m, how.edge).astype(np.float64), how.block))
    total = F32(int(terms.astype(np.int64).sum())) * F32(2.0**-how.block)
    lse = F32(big_m + log32(total, how.edge))
    return float(F32(row[t] - lse)), float(lse)
