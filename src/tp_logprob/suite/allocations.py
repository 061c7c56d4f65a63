"""Which tensors an op allocates, and how many of their bytes are alive at once.

:func:`track_allocations` watches aten ops through a ``TorchDispatchMode`` and
records every output that owns new storage: its shape, dtype, device and the
storage's bytes. Each recorded storage gets a ``weakref.finalize``; torch keeps
one Python object per live storage, so the finalizer runs when the storage
itself is freed (not when a view or a tensor on it dies). Live bytes go up on
allocation and down on free, which gives the peak::

    with track_allocations() as seen:
        result = torch_native_fused_logprob(hidden, targets, contract, weight=w)
    assert seen.max_rows(torch.float32, {vocab}) <= chunk_rows(contract)
    print(seen.peak_live_bytes, seen.largest)

What it sees: outputs of aten ops that pass through the dispatcher, on any
device (CPU, CUDA, ...), forward and backward alike: factory functions
(``torch.empty``, ``zeros``, ``randn``), dtype casts, matmul outputs, tensors that
autograd saves, and the ``torch.empty`` outputs a Triton launcher allocates.
Outputs that share storage with an input (views, in-place and ``out=`` ops) or
with a storage it already tracks are not new and are not counted.

What it does not see: memory an op's kernel uses internally and frees before it
returns (BLAS workspaces, temporaries a C++ kernel allocates: the mode is off
while an op runs), memory outside the dispatcher (``torch.tensor(data)``,
``from_numpy``, Triton's own scratch, cuBLAS workspaces), storages allocated
before the region (inputs are not counted in the live bytes), storage growth by
``resize_``, and the allocator itself: the CUDA caching allocator's reserved but
unused blocks and fragmentation. ``peak_live_bytes`` is therefore a lower bound
of what the device needs, comparable across two implementations of one op; on
CUDA, ``torch.cuda.max_memory_allocated`` is the figure that includes kernel
temporaries.

Threads: a dispatch mode is thread-local. Ops that another thread runs (the TP
ranks of ``run_tp`` and ``run_tp_hidden`` are threads) are not seen unless that
thread enters the tracker too: pass ``seen.wrap(op)`` instead of ``op``, or run
``with seen.watch():`` in the thread. ``backward()`` called inside a watched
thread is seen: on CPU the autograd engine runs it in the calling thread (tested);
on CUDA its device threads run under the caller's ``at::ThreadLocalState``, which
holds the dispatch modes (from torch's source; not tested here). Frees are
counted in whichever thread drops the storage, and the bookkeeping is locked, so
watchers in several threads feed one tracker.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["Allocation", "AllocationTracker", "track_allocations"]

_F = TypeVar("_F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Allocation:
    """One new storage an aten op returned: the output's shape and dtype, the storage's bytes."""

    op: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: str
    nbytes: int
    thread: str


class AllocationTracker:
    """Allocations seen by its watchers, live bytes and their peak (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._allocations: list[Allocation] = []
        self._live: dict[tuple[str, int], tuple[int, weakref.finalize[Any, Any]]] = {}
        self._live_bytes = 0
        self._peak_live_bytes = 0
        self._closed = False

    @property
    def allocations(self) -> tuple[Allocation, ...]:
        """Every new storage seen, in order of allocation."""
        with self._lock:
            return tuple(self._allocations)

    @property
    def live_bytes(self) -> int:
        """Bytes of seen storages not yet freed (frozen once the tracker is closed)."""
        return self._live_bytes

    @property
    def peak_live_bytes(self) -> int:
        """The most ``live_bytes`` there has been since the start or :meth:`reset_peak`."""
        return self._peak_live_bytes

    @property
    def total_bytes(self) -> int:
        """Bytes of all new storages seen, freed or not."""
        with self._lock:
            return sum(item.nbytes for item in self._allocations)

    @property
    def largest(self) -> Allocation | None:
        """The biggest allocation seen (the first of equals), or None."""
        with self._lock:
            return max(self._allocations, key=lambda item: item.nbytes, default=None)

    def largest_2d(self, dtype: torch.dtype, widths: Collection[int]) -> Allocation | None:
        """The 2-D ``dtype`` allocation with a width in ``widths`` and the most rows, or None."""
        with self._lock:
            matching = [
                item
                for item in self._allocations
                if item.dtype == dtype and len(item.shape) == 2 and item.shape[1] in widths
            ]
        return max(matching, key=lambda item: item.shape[0], default=None)

    def max_rows(self, dtype: torch.dtype, widths: Collection[int]) -> int:
        """Most rows of any 2-D ``dtype`` allocation whose width is in ``widths``; 0 if none.

        ``max_rows(torch.float32, {live, local_vocab}) <= k`` says that no fp32 tensor
        as wide as the vocabulary shard ever had more than ``k`` rows.
        """
        found = self.largest_2d(dtype, widths)
        return 0 if found is None else found.shape[0]

    def reset_peak(self) -> None:
        """Start a new peak from the bytes live now."""
        with self._lock:
            self._peak_live_bytes = self._live_bytes

    @contextmanager
    def watch(self) -> Iterator[AllocationTracker]:
        """Watch the ops of the calling thread (and its ``backward()`` calls) for the block."""
        with _Watcher(self):
            yield self

    def wrap(self, func: _F) -> _F:
        """``func`` run under :meth:`watch` in whichever thread calls it (a TP rank's op)."""

        @functools.wraps(func)
        def watched(*args: Any, **kwargs: Any) -> Any:
            with self.watch():
                return func(*args, **kwargs)

        return watched  # type: ignore[return-value]

    def close(self) -> None:
        """Stop counting frees: detach every pending finalizer (no state outlives the tracker)."""
        with self._lock:
            self._closed = True
            for _, finalizer in self._live.values():
                finalizer.detach()
            self._live.clear()

    def _record(self, func: Any, inputs: set[tuple[str, int]], item: torch.Tensor) -> None:
        storage = item.untyped_storage()
        nbytes = storage.nbytes()
        key = (str(item.device), storage.data_ptr())
        if nbytes == 0 or key[1] == 0 or key in inputs:
            return
        with self._lock:
            if self._closed or key in self._live:
                return
            finalizer = weakref.finalize(storage, self._freed, key)
            finalizer.atexit = False
            self._live[key] = (nbytes, finalizer)
            self._live_bytes += nbytes
            self._peak_live_bytes = max(self._peak_live_bytes, self._live_bytes)
            self._allocations.append(
                Allocation(
                    op=str(func),
                    shape=tuple(item.shape),
                    dtype=item.dtype,
                    device=str(item.device),
                    nbytes=nbytes,
                    thread=threading.current_thread().name,
                )
            )

    def _freed(self, key: tuple[str, int]) -> None:
        with self._lock:
            nbytes, _ = self._live.pop(key, (0, None))
            self._live_bytes -= nbytes


class _Watcher(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """One thread's dispatch mode; it reports new output storages to a shared tracker."""

    def __init__(self, tracker: AllocationTracker) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.tracker = tracker

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: Any = (),
        kwargs: Any = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {
            (str(value.device), value.untyped_storage().data_ptr())
            for value in tree_leaves((args, kwargs))
            if _has_storage(value)
        }
        for item in tree_leaves(out):
            if _has_storage(item):
                self.tracker._record(func, inputs, item)
        return out


def _has_storage(value: Any) -> bool:
    """A dense tensor (sparse and nested ones have no single storage to watch)."""
    return isinstance(value, torch.Tensor) and value.layout == torch.strided


@contextmanager
def track_allocations() -> Iterator[AllocationTracker]:
    """A new :class:`AllocationTracker` watching the calling thread for the block.

    Other threads join with ``tracker.wrap(op)`` or ``with tracker.watch():``.
    After the block the figures stay as they were (frees are no longer counted).
    """
    tracker = AllocationTracker()
    try:
        with tracker.watch():
            yield tracker
    finally:
        tracker.close()
