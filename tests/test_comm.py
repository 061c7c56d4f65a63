"""Communication groups: EmulatedGroup semantics, timeouts and aborts; lazy torch import."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

import tp_logprob as tpl
from tp_logprob.comm import (
    CollectiveAbortedError,
    CollectiveError,
    CollectiveTimeoutError,
    EmulatedGroup,
    EmulatedRank,
    GroupHandle,
    TorchGroup,
)


def on_ranks(
    handles: list[EmulatedRank], body: Callable[[EmulatedRank], Any]
) -> list[tuple[Any, BaseException | None]]:
    """Run ``body(handle)`` in one thread per handle; collect (result, error) in rank order."""
    outcome: list[tuple[Any, BaseException | None]] = [(None, None)] * len(handles)

    def main(index: int, handle: EmulatedRank) -> None:
        try:
            outcome[index] = (body(handle), None)
        except BaseException as error:
            outcome[index] = (None, error)

    threads = [threading.Thread(target=main, args=item) for item in enumerate(handles)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive(), "a rank hung"
    return outcome


def test_handles_come_in_rank_order() -> None:
    group = EmulatedGroup(3, timeout=5.0)
    handles = group.handles()
    assert [h.rank for h in handles] == [0, 1, 2] == [h.rank for h in group]
    assert all(h.world_size == 3 for h in handles) and len(group) == 3
    assert group[2] is handles[2]
    assert isinstance(handles[0], GroupHandle)


def test_all_gather_returns_every_rank_in_order_over_many_rounds() -> None:
    group = EmulatedGroup(4, timeout=5.0)

    def body(handle: EmulatedRank) -> list[list[float]]:
        rounds = []
        for step in range(5):
            sent = torch.full((2,), float(10 * step + handle.rank))
            rounds.append([t[0].item() for t in handle.all_gather(sent)])
        return rounds

    outcome = on_ranks(group.handles(), body)
    for result, error in outcome:
        assert error is None
        assert result == [[10.0 * step + r for r in range(4)] for step in range(5)]


def test_all_gather_delivers_private_copies() -> None:
    group = EmulatedGroup(2, timeout=5.0)
    sent = [torch.zeros(3), torch.ones(3)]

    def body(handle: EmulatedRank) -> list[torch.Tensor]:
        received = handle.all_gather(sent[handle.rank])
        received[0].add_(100.0)  # must not reach rank 0's tensor or rank 1's copy
        return received

    (first, _), (second, _) = on_ranks(group.handles(), body)
    assert torch.equal(sent[0], torch.zeros(3))
    assert torch.equal(first[0], torch.full((3,), 100.0))
    assert torch.equal(second[0], torch.full((3,), 100.0))
    assert first[0].data_ptr() != second[0].data_ptr()


def test_missing_peer_times_out_naming_group_rank_timeout_and_missing_rank() -> None:
    group = EmulatedGroup(3, timeout=0.5, name="unit")
    started = time.monotonic()
    outcome = on_ranks(group.handles()[:2], lambda h: h.all_gather(torch.zeros(1)))
    elapsed = time.monotonic() - started
    assert 0.45 <= elapsed < 3.0
    for rank, (_, error) in enumerate(outcome):
        assert isinstance(error, CollectiveTimeoutError) and isinstance(error, TimeoutError)
        message = str(error)
        assert "'unit'" in message and "0.5 s" in message and "rank(s) [2]" in message
        assert f"rank {rank}" in message
    with pytest.raises(CollectiveTimeoutError):  # the group stays broken: no later hang
        group[2].all_gather(torch.zeros(1))


def test_abort_wakes_waiting_ranks_at_once() -> None:
    group = EmulatedGroup(2, timeout=30.0)
    timer = threading.Timer(0.2, group.abort, args=("rank 1 raised ValueError",))
    timer.start()
    started = time.monotonic()
    ((_, error),) = on_ranks(group.handles()[:1], lambda h: h.all_gather(torch.zeros(1)))
    assert time.monotonic() - started < 5.0
    assert isinstance(error, CollectiveAbortedError)
    assert "rank 1 raised ValueError" in str(error)


def test_mismatched_shapes_raise_on_every_rank() -> None:
    group = EmulatedGroup(2, timeout=5.0)
    outcome = on_ranks(group.handles(), lambda h: h.all_gather(torch.zeros(h.rank + 1)))
    for _, error in outcome:
        assert isinstance(error, CollectiveError)
        assert "rank 0: (1,)" in str(error) and "rank 1: (2,)" in str(error)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"world_size": 0}, r"world_size=0: must be >= 1"),
        ({"world_size": 2.0}, r"world_size=2.0: expected an int"),
        ({"world_size": 2, "timeout": 0}, r"timeout=0: expected a positive"),
        ({"world_size": 2, "timeout": True}, r"timeout=True: expected a positive"),
    ],
    ids=["zero-ranks", "float-ranks", "zero-timeout", "bool-timeout"],
)
def test_bad_group_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(tpl.LogprobContractError, match=message):
        EmulatedGroup(**kwargs)


def test_torch_group_needs_an_initialized_process_group() -> None:
    with pytest.raises(CollectiveError, match="init_process_group"):
        TorchGroup()


def test_importing_comm_emulate_preflight_and_cli_does_not_import_torch() -> None:
    code = (
        "import sys, tp_logprob, tp_logprob.comm, tp_logprob.emulate, tp_logprob.preflight\n"
        "import tp_logprob.__main__\n"
        "tp_logprob.comm, tp_logprob.run_tp, tp_logprob.preflight\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
