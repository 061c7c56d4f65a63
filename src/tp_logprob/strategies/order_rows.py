"""Rows built to break a declared accumulation order: every addition on one path rounds up.

A shard's maximum contributes ``exp(0) = 1`` to ``S``; a partial sum in ``[1, 2)`` has an
ulp of ``2^-23``, so adding a group of terms worth ``g = 2^-24 (1 + delta)``, just over
half an ulp, rounds up by ``(1 - delta) 2^-24``. A row whose columns form such groups along
the maximum's path of additions, in the order a kernel adds them, makes every one of those
additions round the same way (the maximum is ``1.0``, so ``lse`` is near 1 and an error
reads in ulps of 1): the error grows with the path length the tolerance counts
(``docs/tolerances.md``, "Declared orders"). :func:`order_layout` gives the groups of a
layout (the half-ulp rows of the tightness table: one column each, for a sequential sum;
powers of the fan-in, for a tree; lanes or consecutive blocks, for a blocked or online
order), :func:`order_row` their values, and :func:`order_cases` cases of one row per layout,
the maximum on one rank and the other ranks' terms worth ``g`` each at the merge.

A sum in the declared order stays within that order's bound on every layout; a sum in
another order (a sequential loop that declares a tree) exceeds it on its own layout.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from tp_logprob.accumulation import AccumulationOrder, OrderKind
from tp_logprob.capability import LogprobBackendCapability
from tp_logprob.contract import (
    DeterminismScope,
    LogprobContract,
    LogprobDType,
    LogprobRole,
    MaskMode,
    MaskSpec,
    ReductionSpec,
    ShardingSpec,
)
from tp_logprob.strategies.cases import LogprobCase
from tp_logprob.strategies.logits import round_to_dtype

__all__ = ["ORDER_LAYOUTS", "order_cases", "order_layout", "order_row"]

ORDER_LAYOUTS = ("sequential", "tree", "lanes", "blocks")
"""``sequential``: every other column its own group (the half-ulp row); ``tree``: the
groups of a bottom-up tree of the fan-in; ``lanes``: a block-wide accumulator, each lane
summed across blocks, then the lanes; ``blocks``: consecutive blocks, each summed, then
the blocks."""

HALF_ULP = 2.0**-24
"""Half an ulp of a partial sum in ``[1, 2)``: a group worth just more rounds up."""
_MARGIN = 2.0**-10  # a group's worth above HALF_ULP, beyond any exp's error


def order_layout(
    layout: str, width: int, *, block: int = 16, fan_in: int = 2, tree_inside: bool = False
) -> list[list[int]]:
    """The groups of columns added, in turn, to column 0's partial sum of a shard of
    ``width`` columns. ``block`` and ``tree_inside`` (a block's width summed by a tree)
    shape ``lanes`` and ``blocks``; ``fan_in`` every tree."""
    if layout == "sequential":
        return [[j] for j in range(1, width)]
    if layout == "tree":
        return _tree_groups(list(range(width)), fan_in)
    if layout == "lanes":
        lane_zero = [[j] for j in range(block, width, block)]
        lanes = [list(range(lane, width, block)) for lane in range(min(block, width))]
        return lane_zero + _inside(lanes, fan_in, tree_inside)
    if layout == "blocks":
        first = [[j] for j in range(min(block, width))]
        blocks = [list(range(start, min(start + block, width))) for start in range(0, width, block)]
        return _inside(first, fan_in, tree_inside) + blocks[1:]
    raise InvalidArgument(f"layout={layout!r}: expected one of {ORDER_LAYOUTS}")


def _inside(parts: list[list[int]], fan_in: int, tree: bool) -> list[list[int]]:
    """Groups that add ``parts[1:]`` to ``parts[0]``: one by one, or by a tree over them."""
    if not tree:
        return parts[1:]
    groups = _tree_groups(list(range(len(parts))), fan_in)
    return [[column for index in group for column in parts[index]] for group in groups]


def _tree_groups(items: list[int], fan_in: int) -> list[list[int]]:
    """The subtrees a bottom-up tree of ``fan_in`` adds to ``items[0]``'s, level by level."""
    groups, span = [], 1
    while span < len(items):
        for sibling in range(1, fan_in):
            group = items[sibling * span : (sibling + 1) * span]
            if group:
                groups.append(group)
        span *= fan_in
    return groups


def order_row(
    groups: list[list[int]], width: int, dtype: LogprobDType | str, *, top: float = 1.0
) -> npt.NDArray[np.float32]:
    """A shard row of ``width`` ``dtype`` values: ``top`` (the maximum, a ``dtype`` value) at
    column 0, and each group's columns worth just over :data:`HALF_ULP` together."""
    row = np.full(width, top, dtype=np.float32)
    for group in groups:
        row[group] = _log_above(HALF_ULP * (1.0 + _MARGIN) / len(group), dtype, top)
    return row


def _log_above(value: float, dtype: LogprobDType | str, top: float) -> float:
    """A ``dtype`` value ``x`` just above ``top + log(value)``: ``exp(x - top) >= value``."""
    x = float(round_to_dtype([top + math.log(value)], dtype)[0])
    while math.exp(x - top) < value:
        step = 2.0 ** (math.frexp(abs(x))[1] - 1 - _MANTISSA[LogprobDType(dtype)])
        x = float(round_to_dtype([x + step], dtype)[0])
    return x


_MANTISSA = {LogprobDType.FP32: 23, LogprobDType.BF16: 7, LogprobDType.FP16: 10}


def _fan_in(order: AccumulationOrder) -> int:
    return order.fan_in if OrderKind.TREE in (order.kind, order.within, order.across) else 2


@st.composite
def _order_cases(
    draw: Any, capability: LogprobBackendCapability, order: AccumulationOrder, max_width: int
) -> LogprobCase:
    worlds = capability.served_values("tp_world_size")
    world = draw(
        st.sampled_from(sorted(w for w in (worlds or {1, 2, 4, 8}) if w <= 8) or [1]),
        label="tp",
    )
    blocks = order.block or (16,)
    block = draw(st.sampled_from(blocks), label="block")
    fan_in = _fan_in(order)
    edges = sorted(
        {w for b in (block, fan_in**3) for w in (b - 1, b, b + 1, 2 * b + 1, 4 * b - 1)}
        | {max_width}
    )
    width = draw(
        st.sampled_from([w for w in edges if 1 <= w <= max_width]) | st.integers(1, max_width),
        label="shard width",
    )
    dtypes = sorted(capability.served_values("dtype") or (), key=lambda d: d.value)
    dtype = draw(st.sampled_from(dtypes), label="dtype")
    holder = draw(st.integers(0, world - 1), label="rank of the maximum")
    tree_inside = order.kind in (OrderKind.BLOCKED, OrderKind.ONLINE) and (
        order.within is OrderKind.TREE
    )
    rows = []
    for layout in ORDER_LAYOUTS:
        groups = order_layout(layout, width, block=block, fan_in=fan_in, tree_inside=tree_inside)
        tiny = _log_above(HALF_ULP * (1.0 + _MARGIN) / width, dtype, 1.0)
        shards = [
            order_row(groups, width, dtype) if rank == holder else np.full(width, tiny, np.float32)
            for rank in range(world)
        ]
        rows.append(np.concatenate(shards))
    logits = np.stack(rows)
    padded = world * width
    targets = [
        draw(st.sampled_from([holder * width, (holder * width + width // 2) % padded]), label=name)
        for name in ORDER_LAYOUTS
    ]
    contract = LogprobContract(
        role=LogprobRole.INFER
        if capability.serves("role", LogprobRole.INFER)
        else LogprobRole.TRAIN,
        dtype=dtype,
        mask=MaskSpec(
            len(rows),
            None if MaskMode.IGNORE_INDEX in capability.mask_modes else np.ones(len(rows), bool),
        ),
        sharding=ShardingSpec(
            0, world, tuple((r * width, (r + 1) * width) for r in range(world)), padded, padded
        ),
        reduction=ReductionSpec(
            DeterminismScope.FIXED_TOPOLOGY
            if capability.serves("determinism_scope", DeterminismScope.FIXED_TOPOLOGY)
            else DeterminismScope.RUN_TO_RUN
        ),
        export_lse=capability.serves("export_lse", True),
        export_entropy=capability.serves("export_entropy", True),
    )
    return LogprobCase(contract, logits, np.asarray(targets, dtype=np.int64))


def order_cases(
    capability: LogprobBackendCapability, *, max_width: int = 512
) -> st.SearchStrategy[LogprobCase]:
    """Cases of one row per :data:`ORDER_LAYOUTS` layout, built against ``capability``'s
    declared accumulation order: shards of ``1`` to ``max_width`` columns (widths at and
    across the declared block and the fan-in's powers drawn first), the maximum on a drawn
    rank, the other ranks worth just over half an ulp each at the merge.

    Example::

        @given(order_cases(MY_CAPABILITY))
        def test_my_order(case): ...
    """
    if not isinstance(capability, LogprobBackendCapability):
        raise InvalidArgument(f"capability={capability!r}: expected a LogprobBackendCapability")
    if isinstance(max_width, bool) or not isinstance(max_width, int) or max_width < 1:
        raise InvalidArgument(f"max_width={max_width!r}: expected an int >= 1")
    return _order_cases(capability, capability.accumulation_order, max_width)
