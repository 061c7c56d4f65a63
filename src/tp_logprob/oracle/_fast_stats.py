"""Fast-path counters and the switch that turns the fast path off (state only, no maths)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

QUANTITIES = (
    "lse",
    "selected_logp",
    "logprob_grad",
    "entropy",
    "entropy_grad",
    "hidden_logits",
    "support_min_p",
    "support_top_p",
)
"""The counted quantities: rows for the first five and the two support rules (a row
falls back when any of its decisions needed multi-precision), logits elements for
``hidden_logits``."""

_ENABLED: ContextVar[bool] = ContextVar("tp_logprob_oracle_fast_path", default=True)
_LOCK = threading.Lock()
_COUNTS = {name: [0, 0] for name in QUANTITIES}


@dataclass(frozen=True)
class FastPathCounts:
    """Results the fast path certified (``hits``) and those it left to the Ziv loop."""

    hits: int
    fallbacks: int

    @property
    def fallback_rate(self) -> float:
        """``fallbacks / (hits + fallbacks)``, 0.0 when nothing was tried."""
        total = self.hits + self.fallbacks
        return self.fallbacks / total if total else 0.0


def fast_path_stats(*, reset: bool = False) -> dict[str, FastPathCounts]:
    """Counts per quantity (:data:`QUANTITIES`) since the last reset; ``reset=True`` zeroes them.

    Rows whose value follows from special values alone (NaN, ``+inf``, no
    finite live value, a ``-inf`` target) are answered before either path and
    not counted. Counts are per process, shared by all threads.
    """
    with _LOCK:
        out = {name: FastPathCounts(*pair) for name, pair in _COUNTS.items()}
        if reset:
            for pair in _COUNTS.values():
                pair[0] = pair[1] = 0
    return out


@contextmanager
def slow_path_only() -> Iterator[None]:
    """Within this block (in this thread or task), every exact result comes from the Ziv loop.

    >>> from tp_logprob.oracle import exact_logsumexp
    >>> with slow_path_only():
    ...     exact_logsumexp([0.0, 0.0])
    0.6931471805599453
    """
    token = _ENABLED.set(False)
    try:
        yield
    finally:
        _ENABLED.reset(token)


def enabled() -> bool:
    """Whether the fast path runs here (not inside :func:`slow_path_only`)."""
    return _ENABLED.get()


def record(quantity: str, hits: int, fallbacks: int) -> None:
    """Add to one quantity's counts."""
    with _LOCK:
        pair = _COUNTS[quantity]
        pair[0] += hits
        pair[1] += fallbacks
