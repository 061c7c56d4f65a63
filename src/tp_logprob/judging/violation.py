"""What a failing property prints: a :class:`PropertyViolation` carrying a short report.

The report names the property, the backend, the contract in one line, the shapes, the
worst row and column, observed and expected values, and the error against its bound.
The plugin appends the command that replays it and prints nothing else; the asserts of
:mod:`tp_logprob.testing` raise the same report. A property handed params that do not
fit its case (a bad artifact) raises :class:`PropertyInputError` instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = [
    "LABEL_WIDTH",
    "ROWS_SHOWN",
    "PropertyInputError",
    "PropertyViolation",
    "format_value",
    "row_list",
    "violation",
]

LABEL_WIDTH = 8
"""Width of the labels down the left of a report (``observed``, ``expected``, ``replay``)."""

ROWS_SHOWN = 8
"""How many rows a report names in a list before it gives their count instead."""


class PropertyInputError(ValueError):
    """A property was given params or arrays that do not fit its case (a bad artifact)."""


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

    ``subject`` is the failing case (contract, shapes and a non-contiguous layout are shown)
    or a bare contract;
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
                f"(active rows {row_list(np.flatnonzero(case.active))}), "
                f"ignore_index {contract.mask.ignore_index}, export_lse {contract.export_lse}",
            )
        )
        form = getattr(case, "form", None)
        if form is not None and not form.contiguous:
            rows.append(("layout", f"{form.describe()} (tp_logprob.strategies.input_forms)"))
    report = "\n".join(
        f"  {label.ljust(LABEL_WIDTH)}  {text}".rstrip() for label, text in [*rows, *lines]
    )
    return PropertyViolation(prop, report, measured=measured)


def row_list(rows: Iterable[int]) -> str:
    """``rows`` as a list, or its first :data:`ROWS_SHOWN` and how many there are in all."""
    numbers = [int(row) for row in rows]
    if len(numbers) <= ROWS_SHOWN:
        return str(numbers)
    shown = ", ".join(str(row) for row in numbers[:ROWS_SHOWN])
    return f"[{shown}, ...] ({len(numbers)} rows)"
