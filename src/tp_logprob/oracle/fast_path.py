"""How often the exact oracle's fast path certifies a result, and a switch to turn it off.

Every ``exact_*`` function first tries a vectorised double-double evaluation
whose error is bounded by construction (``docs/tolerances.md``, "The oracle's
fast path"; ``lse`` and ``selected_logp`` try a cheaper binned float64
enclosure, F10, before it); it returns a float64 only when the whole enclosure
rounds to that one value, and otherwise hands the row to the Ziv loop, which
gives the same bits. :func:`fast_path_stats` counts both outcomes per quantity, so a
benchmark can report the fallback rate; :func:`slow_path_only` runs a block of
code on the Ziv loop alone (for tests and benchmarks that compare the two).

>>> from tp_logprob.oracle import exact_logsumexp, fast_path_stats
>>> _ = fast_path_stats(reset=True)
>>> exact_logsumexp([0.0, 1.0, 2.0])
2.40760596444438
>>> fast_path_stats()["lse"]
FastPathCounts(hits=1, fallbacks=0)
"""

from __future__ import annotations

from tp_logprob.oracle._fast_stats import (
    QUANTITIES,
    FastPathCounts,
    fast_path_stats,
    slow_path_only,
)

__all__ = ["QUANTITIES", "FastPathCounts", "fast_path_stats", "slow_path_only"]
