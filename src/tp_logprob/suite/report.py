"""What a failing property prints, and the per-backend numbers the session summary shows.

A property that fails raises :class:`PropertyViolation` carrying a short report:
the property, the backend, the contract in one line, the shapes, the worst row
and column, observed and expected values, and the error against its bound. The
plugin appends the command that replays it and prints nothing else.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "LABEL_WIDTH",
    "BackendStats",
    "NotClaimed",
    "PropertyViolation",
    "SuiteStats",
    "format_value",
    "violation",
]


LABEL_WIDTH = 8
"""Width of the labels down the left of a report (``observed``, ``expected``, ``replay``)."""


class PropertyViolation(AssertionError):  # noqa: N818 - reads "the property is violated"
    """A property of the suite does not hold; ``report`` says where and by how much.

    ``measured`` is the worst row's error ``(fp32 ulps, fraction of its tolerance)`` when
    the property measured one, so the session summary counts the failing example too.
    """

    def __init__(
        self, prop: str, report: str, *, measured: tuple[float, float] | None = None
    ) -> None:
        super().__init__(f"{prop}\n{report}")
        self.prop = prop
        self.report = report
        self.measured = measured


def format_value(value: Any) -> str:
    """A float with its float32 bit pattern, so a 1-ulp difference is visible."""
    if value is None:
        return "None"
    number = float(value)
    if math.isnan(number) or math.isinf(number):
        return repr(number)
    with np.errstate(over="ignore"):  # an exact value past the fp32 range shows as inf bits
        bits = int(np.array(number, dtype=np.float32).view(np.uint32))
    return f"{number!r} (f32 bits {bits:#010x})"


def violation(
    prop: str,
    subject: Any,
    backend_id: str,
    lines: Iterable[tuple[str, str]],
    *,
    measured: tuple[float, float] | None = None,
) -> PropertyViolation:
    """A :class:`PropertyViolation` with the standard header and ``(label, text)`` lines.

    ``subject`` is the failing case (contract and shapes are shown) or a bare contract;
    ``measured`` is the worst row's ``(ulps, fraction of tolerance)``, if measured.
    """
    case = subject if hasattr(subject, "logits") else None
    contract = subject.contract if case is not None else subject
    rows = [("backend", backend_id), ("contract", contract.describe())]
    if case is not None:
        rows.append(
            (
                "shapes",
                f"logits {list(case.logits.shape)} {contract.dtype.value}, targets "
                f"{list(case.targets.shape)}, mask mode {contract.mask_mode.value} "
                f"(active rows {np.flatnonzero(case.active).tolist()}), "
                f"ignore_index {contract.mask.ignore_index}, export_lse {contract.export_lse}",
            )
        )
    report = "\n".join(
        f"  {label.ljust(LABEL_WIDTH)}  {text}".rstrip() for label, text in [*rows, *lines]
    )
    return PropertyViolation(prop, report, measured=measured)


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
