"""The per-backend numbers the session summary shows: passes, failures, skips, examples,
the worst measured errors, and what each backend does not claim.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

__all__ = ["BackendStats", "NotClaimed", "SuiteStats"]


@dataclass
class BackendStats:
    """One backend's numbers for the summary table."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    examples: int = 0
    worst_ulp: float = 0.0
    worst_property: str = ""
    worst_tolerance_used: float = 0.0
    worst_tolerance_property: str = ""

    def merge(self, other: BackendStats) -> None:
        self.passed += other.passed
        self.failed += other.failed
        self.skipped += other.skipped
        self.examples += other.examples
        if other.worst_ulp > self.worst_ulp:
            self.worst_ulp, self.worst_property = other.worst_ulp, other.worst_property
        if other.worst_tolerance_used > self.worst_tolerance_used:
            self.worst_tolerance_used = other.worst_tolerance_used
            self.worst_tolerance_property = other.worst_tolerance_property


@dataclass
class SuiteStats:
    """Per-backend counters; workers ship theirs to the controller as JSON."""

    backends: dict[str, BackendStats] = field(default_factory=dict)

    def of(self, backend_id: str) -> BackendStats:
        return self.backends.setdefault(backend_id, BackendStats())

    def example(self, backend_id: str) -> None:
        """Count one Hypothesis example run against ``backend_id``."""
        self.of(backend_id).examples += 1

    def error(self, backend_id: str, prop: str, ulps: float, tolerance_used: float) -> None:
        """Record an observed error: in fp32 ulps, and as a fraction of its tolerance."""
        stats = self.of(backend_id)
        if math.isfinite(ulps) and ulps > stats.worst_ulp:
            stats.worst_ulp, stats.worst_property = float(ulps), prop
        if math.isfinite(tolerance_used) and tolerance_used > stats.worst_tolerance_used:
            stats.worst_tolerance_used, stats.worst_tolerance_property = float(tolerance_used), prop

    def failure(self, backend_id: str, prop: str, ulps: float, tolerance_used: float) -> None:
        """Record a failing example's worst error; an unbounded one (NaN against a finite
        value, say) counts as inf, so the table never reads lower than the failure."""
        stats = self.of(backend_id)
        ulps = math.inf if math.isnan(ulps) else float(ulps)
        used = math.inf if math.isnan(tolerance_used) else float(tolerance_used)
        if ulps > stats.worst_ulp or not stats.worst_property:
            stats.worst_ulp, stats.worst_property = max(ulps, stats.worst_ulp), prop
        if used > stats.worst_tolerance_used or not stats.worst_tolerance_property:
            stats.worst_tolerance_used = max(used, stats.worst_tolerance_used)
            stats.worst_tolerance_property = prop

    def outcome(self, backend_id: str, passed: bool, *, skipped: bool = False) -> None:
        """Count one finished property test: passed, failed, or skipped (did not apply)."""
        stats = self.of(backend_id)
        if skipped:
            stats.skipped += 1
        elif passed:
            stats.passed += 1
        else:
            stats.failed += 1

    def to_json(self) -> str:
        return json.dumps({name: asdict(stats) for name, stats in self.backends.items()})

    def merge_json(self, text: str) -> None:
        for name, values in json.loads(text).items():
            self.of(name).merge(BackendStats(**values))

    def table(self) -> list[str]:
        """The summary table, one line per backend."""
        header = (
            "backend",
            "properties",
            "examples",
            "max error/tolerance (property)",
            "worst ulp error (property)",
        )
        rows = [
            (
                name,
                f"{s.passed} passed, {s.failed} failed, {s.skipped} skipped",
                str(s.examples),
                f"{s.worst_tolerance_used:.3g} ({s.worst_tolerance_property})"
                if s.worst_tolerance_property
                else f"{s.worst_tolerance_used:.3g}",
                f"{s.worst_ulp:.4g} ({s.worst_property})" if s.worst_property else "-",
            )
            for name, s in sorted(self.backends.items())
        ]
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        return [
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in [header, *rows]
        ]


@dataclass
class NotClaimed:
    """The properties deselected because a backend does not claim what they need: their
    node ids, and per backend how many for each capability field (the reason)."""

    nodeids: list[str] = field(default_factory=list)
    reasons: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, backend_id: str, reason: str, nodeid: str) -> None:
        """Count one deselected property test of ``backend_id``, not claimed for ``reason``."""
        self.nodeids.append(nodeid)
        counts = self.reasons.setdefault(backend_id, {})
        counts[reason] = counts.get(reason, 0) + 1

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> NotClaimed:
        return cls(**json.loads(text))

    def lines(self) -> list[str]:
        """Once per backend, what it does not claim and how many properties that deselected."""
        if not self.nodeids:
            return []
        width = max(len(name) for name in self.reasons)
        return [
            f"not claimed, so not collected ({len(self.nodeids)} deselected):",
            *(
                f"  {name.ljust(width)}  "
                + "; ".join(f"{reason} ({count})" for reason, count in sorted(counts.items()))
                for name, counts in sorted(self.reasons.items())
            ),
        ]
