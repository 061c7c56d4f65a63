"""preflight: ranks agree on contract and backend, or every rank raises naming who differs."""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Callable
from typing import Any

import pytest

import tp_logprob as tpl
from tp_logprob.comm import EmulatedGroup, EmulatedRank
from tp_logprob.kernels.builtin import TORCH_NATIVE
from tp_logprob.preflight import NO_BACKEND, preflight, resolve_and_preflight

BOUNDS = ((0, 5), (5, 6), (6, 12), (12, 16))


def contract(rank: int = 0, **mask: Any) -> tpl.LogprobContract:
    return tpl.LogprobContract(
        role="train",
        dtype="bf16",
        mask=tpl.MaskSpec(3, **mask),
        sharding=tpl.ShardingSpec(rank, 4, BOUNDS, 14, 16),
        reduction=tpl.ReductionSpec("fixed_topology"),
    )


def on_ranks(world: int, body: Callable[[EmulatedRank], Any]) -> list[Any]:
    """``body(handle)`` on every rank of a fresh group; each rank's result or exception."""
    outcome: list[Any] = [None] * world
    group = EmulatedGroup(world, timeout=10.0)

    def main(handle: EmulatedRank) -> None:
        try:
            outcome[handle.rank] = body(handle)
        except Exception as error:
            outcome[handle.rank] = error

    threads = [threading.Thread(target=main, args=(handle,)) for handle in group]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return outcome


def test_agreeing_ranks_pass() -> None:
    outcome = on_ranks(4, lambda h: preflight(contract(h.rank), "torch_native", h))
    assert outcome == [None] * 4


def test_a_rank_with_another_contract_is_named_on_every_rank() -> None:
    def body(handle: EmulatedRank) -> None:
        mask = {"active_mask": [True, False, True]} if handle.rank == 2 else {}
        preflight(contract(handle.rank, **mask), "torch_native", handle)

    outcome = on_ranks(4, body)
    for rank, error in enumerate(outcome):
        assert isinstance(error, tpl.LogprobDispatchError), error
        message = str(error)
        assert f"seen by rank {rank} of 4" in message
        assert re.search(
            r"contract fingerprint .*: \w+ on ranks \[0, 1, 3\]; \w+ on ranks \[2\]", message
        )
        assert "resolved backend" not in message


def test_a_rank_with_another_backend_is_named() -> None:
    def body(handle: EmulatedRank) -> None:
        backend = "triton_online" if handle.rank == 1 else "torch_native"
        preflight(contract(handle.rank), backend, handle)

    outcome = on_ranks(4, body)
    assert len({str(error).split("\n", 1)[1] for error in outcome}) == 1  # same error everywhere
    assert all(isinstance(error, tpl.LogprobDispatchError) for error in outcome)
    assert "resolved backend: 'torch_native' on ranks [0, 2, 3]; 'triton_online' on ranks [1]" in (
        str(outcome[0])
    )
    assert "contract fingerprint" not in str(outcome[0])


def test_a_rank_holding_another_ranks_contract_is_named() -> None:
    outcome = on_ranks(4, lambda h: preflight(contract(min(h.rank, 2)), "torch_native", h))
    assert all(isinstance(error, tpl.LogprobDispatchError) for error in outcome)
    assert "group rank 3 of 4 holds a contract for tp_rank=2 of tp_world_size=4" in str(outcome[0])


def test_no_group_means_tp1() -> None:
    single = contract()
    single = dataclasses.replace(single, sharding=tpl.ShardingSpec(0, 1, ((0, 16),), 14, 16))
    assert preflight(single, "torch_native", None) is None
    with pytest.raises(tpl.LogprobContractError, match=r"group=None.*tp_world_size=4"):
        preflight(contract(), "torch_native", None)


def registry_with(*backend_ids: str) -> tpl.KernelRegistry:
    registry = tpl.KernelRegistry()
    for backend_id in backend_ids:
        capability = dataclasses.replace(TORCH_NATIVE, backend_id=backend_id)
        registry.register_logprob_backend("cpu", lambda: lambda *a, **k: None, capability)
    return registry


def test_resolve_and_preflight_returns_the_agreed_dispatch() -> None:
    registries = [registry_with("torch_native") for _ in range(4)]
    outcome = on_ranks(
        4,
        lambda h: resolve_and_preflight(
            contract(h.rank), h, registry=registries[h.rank], platform="cpu"
        ),
    )
    assert [result.capability.backend_id for result in outcome] == ["torch_native"] * 4


def test_resolve_and_preflight_names_a_rank_whose_registry_differs() -> None:
    registries = [registry_with("torch_native") for _ in range(3)] + [registry_with("other")]
    outcome = on_ranks(
        4,
        lambda h: resolve_and_preflight(
            contract(h.rank), h, registry=registries[h.rank], platform="cpu"
        ),
    )
    assert all(isinstance(error, tpl.LogprobDispatchError) for error in outcome)
    assert "'torch_native' on ranks [0, 1, 2]; 'other' on ranks [3]" in str(outcome[0])


def test_a_rank_whose_dispatch_fails_is_reported_to_its_peers_at_once() -> None:
    registries = [registry_with("torch_native"), registry_with()]
    two = dataclasses.replace(
        contract(), sharding=tpl.ShardingSpec(0, 2, ((0, 8), (8, 16)), 14, 16)
    )
    outcome = on_ranks(
        2,
        lambda h: resolve_and_preflight(
            two.with_rank(h.rank), h, registry=registries[h.rank], platform="cpu"
        ),
    )
    assert all(isinstance(error, tpl.LogprobDispatchError) for error in outcome)
    assert f"'torch_native' on ranks [0]; {NO_BACKEND!r} on ranks [1]" in str(outcome[0])
    assert "no backend" in str(outcome[1].__context__)


def test_when_every_rank_fails_dispatch_each_raises_its_own_reason() -> None:
    outcome = on_ranks(
        4,
        lambda h: resolve_and_preflight(
            contract(h.rank), h, registry=registry_with(), platform="cpu"
        ),
    )
    assert all(isinstance(error, tpl.LogprobDispatchError) for error in outcome)
    assert all("no backend on platform='cpu'" in str(error) for error in outcome)
