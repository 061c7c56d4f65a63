"""The declared accumulation order: its paths of additions, its checks, and who declares what."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tp_logprob import AccumulationOrder, LogprobContractError
from tp_logprob.accumulation import ANY_ORDER, OrderKind, fraction_bits
from tp_logprob.kernels.builtin import (
    ONLINE_BLOCKS,
    TORCH_NATIVE,
    TORCH_NATIVE_FUSED,
    TORCH_PORTABLE,
    TRITON_EXACT_SUM,
    TRITON_FUSED,
    TRITON_FUSED_EXACT_SUM,
    TRITON_ONLINE,
    TRITON_PORTABLE,
)
from tp_logprob.oracle import tolerance


@pytest.mark.parametrize(
    ("order", "width", "additions", "rescales"),
    [
        (AccumulationOrder.any(), 19008, 19007, 1),
        (AccumulationOrder.sequential(), 19008, 19007, 1),
        (AccumulationOrder.tree(), 19008, 15, 1),
        (AccumulationOrder.tree(), 16384, 14, 1),
        (AccumulationOrder.tree(4), 64, 9, 1),
        (AccumulationOrder.tree(), 3, 2, 1),
        (AccumulationOrder.blocked(1024, within="tree"), 19008, 10 + 18, 1),
        (AccumulationOrder.blocked(4096), 19008, 4095 + 4, 1),
        (AccumulationOrder.blocked(16, across="tree"), 64, 15 + 2, 1),
        (AccumulationOrder.blocked(4096), 100, 99, 1),
        (AccumulationOrder.online((2048, 4096)), 19008, 4095 + 4, 11),
        (AccumulationOrder.online(16), 64, 15 + 3, 5),
        (AccumulationOrder.fixed_point(), 19008, 0, 0),
        (AccumulationOrder.tree(), 1, 0, 1),
    ],
)
def test_paths_of_additions(
    order: AccumulationOrder, width: int, additions: int, rescales: int
) -> None:
    assert order.additions(width) == additions
    assert order.rescales(width) == rescales
    assert order.additions(width) <= max(width - 1, 0)


def test_descriptions_and_dicts() -> None:
    assert AccumulationOrder.any() == ANY_ORDER and ANY_ORDER.is_any
    assert AccumulationOrder.tree().describe() == "pairwise"
    online = AccumulationOrder.online((4096, 2048))
    assert online.block == (2048, 4096)
    assert online.describe() == (
        "online softmax over blocks of 2048 or 4096 columns, lanes summed in any order"
    )
    assert online.to_dict() == {
        "kind": "online",
        "block": [2048, 4096],
        "within": "any",
        "across": "sequential",
    }
    assert AccumulationOrder.fixed_point(44).to_dict() == {"kind": "fixed_point", "bits": 44}
    assert AccumulationOrder.fixed_point().fraction_bits(152064) == fraction_bits(152064) == 44
    assert AccumulationOrder.tree().fraction_bits(152064) is None


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: AccumulationOrder(kind="diagonal"), r"kind='diagonal'"),
        (lambda: AccumulationOrder.tree(1), r"fan_in=1: must be >= 2"),
        (lambda: AccumulationOrder.tree(2.0), r"fan_in=2.0: expected an int"),
        (lambda: AccumulationOrder.blocked(0), r"block=0: must be >= 1"),
        (lambda: AccumulationOrder.blocked([]), r"block=\[\]: expected at least one"),
        (lambda: AccumulationOrder.blocked("16"), r"block='16': expected an int"),
        (lambda: AccumulationOrder(OrderKind.BLOCKED), r"kind='blocked' needs block width"),
        (lambda: AccumulationOrder(OrderKind.TREE, block=(4,)), r"takes no block width"),
        (lambda: AccumulationOrder.blocked(16, within="online"), r"within='online'"),
        (lambda: AccumulationOrder.blocked(16, across="zigzag"), r"across='zigzag'"),
        (
            lambda: AccumulationOrder(OrderKind.ONLINE, block=(16,), across=OrderKind.TREE),
            r"across='tree': an online softmax walks its blocks in sequence",
        ),
        (lambda: AccumulationOrder(OrderKind.TREE, bits=40), r"bits=40: only a fixed_point"),
        (lambda: AccumulationOrder.fixed_point(0), r"bits=0: must be >= 1"),
        (lambda: AccumulationOrder.tree().additions(-1), r"width=-1: must be >= 0"),
    ],
)
def test_invalid_orders(build: Any, match: str) -> None:
    with pytest.raises(LogprobContractError, match=match):
        build()


def test_the_tolerance_takes_its_path_from_the_order() -> None:
    def bound(order: AccumulationOrder | None) -> float:
        tol = tolerance("bf16", 152064, num_shards=8, max_shard_size=19008, order=order)
        return float(tol.lse_bound([16.4], row_max=[13.4])[0])

    assert bound(None) == bound(AccumulationOrder.any()) == bound(AccumulationOrder.sequential())
    assert bound(AccumulationOrder.tree()) * 150 < bound(None)
    assert bound(AccumulationOrder.tree()) < bound(AccumulationOrder.blocked(1024, within="tree"))
    blocked = bound(AccumulationOrder.blocked(4096))
    assert blocked < bound(AccumulationOrder.online(4096)) < bound(None)
    fixed = tolerance("bf16", 1000, order=AccumulationOrder.fixed_point())
    assert fixed.model.fixed_point_bits == 62 - 10
    assert fixed.order == AccumulationOrder.fixed_point()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"order": "tree"}, TypeError, r"order='tree' must be an AccumulationOrder"),
        (
            {"order": AccumulationOrder.tree(), "fixed_point_bits": 40},
            ValueError,
            r"fixed_point_bits=40: the order 'pairwise' is not fixed_point",
        ),
        (
            {"order": AccumulationOrder.fixed_point(40), "fixed_point_bits": 41},
            ValueError,
            r"fixed_point_bits=41: the order .* says 40",
        ),
    ],
)
def test_tolerance_refuses_bad_orders(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        tolerance("bf16", 64, **kwargs)


@pytest.mark.parametrize(
    "order",
    [
        AccumulationOrder.any(),
        AccumulationOrder.tree(3),
        AccumulationOrder.blocked((16, 32), within="tree", across="any"),
        AccumulationOrder.online(4096, within="tree", fan_in=4),
        AccumulationOrder.fixed_point(),
        AccumulationOrder.fixed_point(40),
    ],
)
def test_an_order_round_trips_through_its_dict(order: AccumulationOrder) -> None:
    assert AccumulationOrder.from_dict(order.to_dict()) == order


def test_from_dict_refuses_what_it_cannot_read() -> None:
    with pytest.raises(LogprobContractError, match=r"expected a dict with 'kind'"):
        AccumulationOrder.from_dict({"block": [16]})
    with pytest.raises(LogprobContractError, match=r"unknown fields \['lanes'\]"):
        AccumulationOrder.from_dict({"kind": "tree", "lanes": 4})


def test_a_capability_holds_an_order() -> None:
    from tp_logprob.replay.schema import capability_from_dict

    assert TORCH_NATIVE.to_dict()["accumulation_order"] == {"kind": "tree", "fan_in": 2}
    assert capability_from_dict(TRITON_ONLINE.to_dict()) == TRITON_ONLINE
    recorded = {k: v for k, v in TORCH_NATIVE.to_dict().items() if k != "accumulation_order"}
    assert capability_from_dict(recorded).accumulation_order.is_any
    with pytest.raises(LogprobContractError, match=r"accumulation_order='tree': expected an"):
        dataclasses.replace(TORCH_NATIVE, accumulation_order="tree")


def test_builtin_declarations() -> None:
    fixed = AccumulationOrder.fixed_point()
    assert TORCH_NATIVE.accumulation_order == AccumulationOrder.tree()
    for capability in (TRITON_EXACT_SUM, TRITON_PORTABLE, TORCH_PORTABLE, TRITON_FUSED_EXACT_SUM):
        assert capability.accumulation_order == fixed, capability.backend_id
    for capability in (TORCH_NATIVE_FUSED, TRITON_FUSED):
        assert capability.accumulation_order.is_any, capability.backend_id
    assert TRITON_ONLINE.accumulation_order == AccumulationOrder.online(ONLINE_BLOCKS["cuda"])


def test_online_blocks_are_the_launch_table() -> None:
    pytest.importorskip("torch")
    from tp_logprob.kernels.triton.launch import _TABLE, KernelKind

    for platform, blocks in ONLINE_BLOCKS.items():
        block_16, block_32, _ = _TABLE[(platform, KernelKind.ROW)]
        assert blocks == tuple(sorted({block_16, block_32})), platform
