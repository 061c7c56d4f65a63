"""Communication groups for vocab-parallel ops: one interface, two transports.

A backend op receives a group *handle* as ``group``: it knows its ``rank`` and
``world_size`` and offers one collective, ``all_gather(tensor) -> list[Tensor]``
in rank order. Because that is all a backend may use, the same op runs
unchanged under :class:`EmulatedGroup` (every rank a thread of one process,
for tests and the property suite) and :class:`TorchGroup` (``torch.distributed``:
gloo on CPU, nccl on GPU).

Neither transport can hang: a peer that never arrives surfaces as a
:class:`CollectiveTimeoutError` naming the group, the rank and the timeout.

Importing this module does not import torch.
"""

from __future__ import annotations

import datetime
import itertools
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from tp_logprob._validation import check_int
from tp_logprob.errors import LogprobContractError

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "CollectiveAbortedError",
    "CollectiveError",
    "CollectiveTimeoutError",
    "EmulatedGroup",
    "EmulatedRank",
    "EmulationUnavailableError",
    "GroupHandle",
    "TorchGroup",
]

DEFAULT_TIMEOUT_S = 60.0
"""Seconds a collective waits for its peers before raising."""


class CollectiveError(RuntimeError):
    """A collective could not complete (a peer timed out, raised, or sent a mismatched tensor)."""


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """A peer did not reach the collective within the group's timeout."""


class CollectiveAbortedError(CollectiveError):
    """The group was aborted (for example because another rank raised); it cannot be reused."""


class EmulationUnavailableError(RuntimeError):
    """An op cannot run on an emulated group in this process, and says why (for example, its
    emulation would replace the real process group the process holds). The property suite
    skips what needs it, with the message, instead of failing."""


@runtime_checkable
class GroupHandle(Protocol):
    """What a backend op may rely on: its rank, the world size, and one all-gather."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]: ...


def _check_timeout(timeout: object) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise LogprobContractError(f"timeout={timeout!r}: expected a positive number of seconds")
    return float(timeout)


_GROUP_IDS = itertools.count()


class EmulatedGroup:
    """A tensor-parallel world of ``world_size`` ranks inside one process, one thread per rank.

    The group itself is shared state; each rank's thread uses its own handle.
    ``handles()`` (or iterating, or indexing) gives them in rank order::

        group = EmulatedGroup(4, timeout=5.0)
        handles = group.handles()          # handles[r].rank == r
        # in rank r's thread: op(local_logits, targets, contract.with_rank(r), group=handles[r])

    ``all_gather`` copies every tensor it delivers, as a real transport would, so
    no rank ever holds another rank's tensor (or autograd graph). A rank that
    waits longer than ``timeout`` seconds raises :class:`CollectiveTimeoutError`
    and breaks the group, so its peers raise too instead of waiting forever.
    """

    def __init__(
        self, world_size: int, *, timeout: float = DEFAULT_TIMEOUT_S, name: str | None = None
    ) -> None:
        self.world_size = check_int("world_size", world_size, min_value=1)
        self.timeout = _check_timeout(timeout)
        self.name = f"emulated#{next(_GROUP_IDS)}" if name is None else str(name)
        self._cond = threading.Condition()
        self._generation = 0
        self._slots: list[torch.Tensor | None] = [None] * self.world_size
        self._delivered: list[torch.Tensor] = []
        self._delivery_error: str | None = None
        self._broken: CollectiveError | None = None
        self._progress = time.monotonic()
        self._handles = [EmulatedRank(self, rank) for rank in range(self.world_size)]

    def handles(self) -> list[EmulatedRank]:
        """Every rank's handle, in rank order."""
        return list(self._handles)

    def __iter__(self) -> Iterator[EmulatedRank]:
        return iter(self._handles)

    def __len__(self) -> int:
        return self.world_size

    def __getitem__(self, rank: int) -> EmulatedRank:
        return self._handles[rank]

    def __repr__(self) -> str:
        return f"EmulatedGroup({self.world_size}, timeout={self.timeout}, name={self.name!r})"

    def abort(self, reason: str) -> None:
        """Break the group: every rank waiting in, or later entering, a collective raises.

        The first reason wins; later calls are no-ops.
        """
        with self._cond:
            if self._broken is None:
                self._broken = CollectiveAbortedError(f"group {self.name!r} aborted: {reason}")
            self._cond.notify_all()

    def note_progress(self) -> None:
        """Record that a rank moved on (entered or left a collective, or finished its op)."""
        with self._cond:
            self._progress = time.monotonic()

    def idle_seconds(self) -> float:
        """Seconds since a rank last entered a collective, completed one, or finished."""
        with self._cond:
            return time.monotonic() - self._progress

    def waiting_ranks(self) -> list[int]:
        """The ranks waiting in this group's all_gather right now."""
        with self._cond:
            return [r for r, slot in enumerate(self._slots) if slot is not None]

    def _all_gather(self, rank: int, tensor: torch.Tensor) -> list[torch.Tensor]:
        sent = tensor.detach().clone()
        deadline = time.monotonic() + self.timeout
        with self._cond:
            self._raise_if_broken(rank)
            self._progress = time.monotonic()
            generation = self._generation
            self._slots[rank] = sent
            arrived = [r for r, slot in enumerate(self._slots) if slot is not None]
            if len(arrived) == self.world_size:
                self._complete_round()
            else:
                while self._generation == generation and self._broken is None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        self._break_on_timeout(rank)
                        break
                    self._cond.wait(remaining)
                if self._generation == generation:
                    self._raise_if_broken(rank)
            delivered, error = self._delivered, self._delivery_error
        if error is not None:
            raise CollectiveError(f"group {self.name!r} rank {rank}: all_gather {error}")
        # One private copy per receiver: a rank may modify what it received in place.
        return [gathered.clone() for gathered in delivered]

    def _complete_round(self) -> None:
        """Called with the lock held by the last rank to arrive."""
        slots = [slot for slot in self._slots if slot is not None]
        first = slots[0]
        mismatched = [
            r
            for r, slot in enumerate(slots)
            if (slot.shape, slot.dtype, slot.device) != (first.shape, first.dtype, first.device)
        ]
        self._delivery_error = None
        if mismatched:
            described = ", ".join(
                f"rank {r}: {tuple(s.shape)} {s.dtype} {s.device}" for r, s in enumerate(slots)
            )
            self._delivery_error = f"needs equal shapes, dtypes and devices; got {described}"
        self._delivered = slots
        self._slots = [None] * self.world_size
        self._generation += 1
        self._progress = time.monotonic()
        self._cond.notify_all()

    def _break_on_timeout(self, rank: int) -> None:
        missing = [r for r, slot in enumerate(self._slots) if slot is None]
        self._broken = CollectiveTimeoutError(
            f"group {self.name!r}: all_gather timed out after {self.timeout:g} s waiting for "
            f"rank(s) {missing} of world_size={self.world_size} (first noticed by rank {rank})"
        )
        self._cond.notify_all()

    def _raise_if_broken(self, rank: int) -> None:
        broken = self._broken
        if broken is None:
            return
        kind = type(broken)  # a fresh exception per rank: threads must not share tracebacks
        raise kind(f"rank {rank}: {broken}")


class EmulatedRank:
    """One rank's handle on an :class:`EmulatedGroup`; use it only from that rank's thread."""

    def __init__(self, group: EmulatedGroup, rank: int) -> None:
        self.group = group
        self.rank = rank
        self.world_size = group.world_size

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``tensor``, in rank order (copies; equal shapes and dtypes required)."""
        return self.group._all_gather(self.rank, tensor)

    def abort(self, reason: str) -> None:
        """Break the whole group (see :meth:`EmulatedGroup.abort`)."""
        self.group.abort(f"rank {self.rank}: {reason}")

    def __repr__(self) -> str:
        return f"EmulatedRank(rank={self.rank}, world_size={self.world_size}, {self.group.name!r})"


class TorchGroup:
    """This process's handle on a ``torch.distributed`` process group (default: the world).

    ``all_gather`` is ``dist.all_gather(..., async_op=True)`` followed by
    ``work.wait(timeout)``; the wait raises once ``timeout`` seconds pass even if
    the peer never calls the collective (checked for gloo by
    ``tests/test_distributed.py``). A timed-out process group is unusable
    afterwards: destroy it. For the underlying transport to give up as well, also
    pass a ``timeout`` to ``init_process_group`` / ``new_group``.
    """

    def __init__(self, process_group: Any = None, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise CollectiveError(
                "TorchGroup: torch.distributed is not initialized; call "
                "torch.distributed.init_process_group(...) first"
            )
        self.process_group = process_group
        self.timeout = _check_timeout(timeout)
        self.rank: int = dist.get_rank(process_group)
        self.world_size: int = dist.get_world_size(process_group)
        if self.rank < 0:
            raise CollectiveError("TorchGroup: this process is not a member of process_group")
        self.backend = str(dist.get_backend(process_group))

    @property
    def device(self) -> torch.device:
        """Where this group's tensors must live: the current CUDA device for nccl, else CPU."""
        import torch

        if self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``tensor``, in rank order; raises :class:`CollectiveTimeoutError`."""
        import torch
        import torch.distributed as dist

        sent = tensor.detach().contiguous()
        gathered = [torch.empty_like(sent) for _ in range(self.world_size)]
        started = time.monotonic()
        try:
            work = dist.all_gather(gathered, sent, group=self.process_group, async_op=True)
            work.wait(timeout=datetime.timedelta(seconds=self.timeout))
        except RuntimeError as error:
            elapsed = time.monotonic() - started
            where = f"TorchGroup({self.backend}) rank {self.rank} of {self.world_size}"
            if "time" in str(error).lower():
                raise CollectiveTimeoutError(
                    f"{where}: all_gather timed out (timeout={self.timeout:g} s, waited "
                    f"{elapsed:.1f} s): {error}"
                ) from error
            raise CollectiveError(f"{where}: all_gather failed: {error}") from error
        return gathered

    def __repr__(self) -> str:
        return (
            f"TorchGroup(rank={self.rank}, world_size={self.world_size}, "
            f"backend={self.backend!r}, timeout={self.timeout:g})"
        )
