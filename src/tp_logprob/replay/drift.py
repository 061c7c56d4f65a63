"""Row-level drift of a backend from the exact oracle: absolute and ulp errors vs the tolerance.

Errors are measured the way the property suite measures them: in fp32 ulps at
``max(|exact|, |lse|, |row max|)`` (the magnitude the computation works at), and
the tolerance is the suite's tolerance table converted to the same ulps. A
processed case (a contract with a support) is measured on the support the backend
used (``judging/processed.py``), ``support_lse`` included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.judging.bounds import fp32_ulp, suite_tolerance
from tp_logprob.judging.expected import exact_outputs
from tp_logprob.judging.measuring import allowed_error, ulps, working_scale
from tp_logprob.judging.processed import backend_support, masked_case, processed_expected
from tp_logprob.oracle.tolerance import within_tolerance as within_bound
from tp_logprob.strategies import LogprobCase
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.running import execute as execute_case

__all__ = ["RowErrors", "measure"]

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True)
class RowErrors:
    """One quantity's per-row errors for one case (only the rows that are compared)."""

    quantity: str
    rows: npt.NDArray[np.int64]
    observed: Floats
    exact: Floats
    abs_error: Floats
    ulp_error: Floats
    tolerance_ulp: Floats
    within: npt.NDArray[np.bool_]

    @property
    def used(self) -> Floats:
        """Error as a fraction of the tolerance; inf for a row out of tolerance with an
        infinite error, 0 for an fp32 overflow the tolerance accepts."""
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = self.ulp_error / self.tolerance_ulp
        ratio = np.where(self.ulp_error == 0, 0.0, np.where(np.isnan(ratio), np.inf, ratio))
        return np.where(self.within & ~np.isfinite(ratio), 0.0, ratio)


def measure(backend: BackendUnderTest, case: LogprobCase) -> list[RowErrors]:
    """Run ``case`` on ``backend`` (every emulated rank) and measure each row against exact.

    ``selected_logp`` is measured on active rows, ``lse`` (when exported) on every row; a
    processed case's ``selected_logp`` and ``support_lse`` (every row) on the backend's
    support. A case over the full vocabulary is held to the bound of the backend's declared
    accumulation order, as the suite's oracle property holds it.
    """
    outputs = execute_case(backend, case)
    active = case.active
    everywhere = np.ones_like(active)
    fields: list[tuple[str, Any, Floats, Floats, npt.NDArray[np.bool_], Floats]]
    if case.contract.support is None:
        exact_selected, exact_lse = exact_outputs(case)
        declared = suite_tolerance(case.contract, backend.capability.accumulation_order)
        selected_bound, lse_bound = allowed_error(case, exact_selected, exact_lse, declared)
        fields = [
            (
                "selected_logp",
                outputs.selected,
                exact_selected,
                selected_bound,
                active,
                working_scale(case, exact_lse),
            )
        ]
    else:
        support = backend_support(case, outputs)
        expected = processed_expected(case, support)
        masked = masked_case(case, support)
        exact_lse = expected.lse
        _, lse_bound = allowed_error(case, np.zeros_like(exact_lse), exact_lse)
        selected_bound, support_bound = allowed_error(
            masked, expected.selected, expected.support_lse
        )
        on_support = working_scale(masked, expected.support_lse)
        fields = [
            (
                "selected_logp",
                outputs.selected,
                expected.selected,
                selected_bound,
                active,
                on_support,
            ),
            (
                "support_lse",
                outputs.support_lse,
                expected.support_lse,
                support_bound,
                everywhere,
                on_support,
            ),
        ]
    if outputs.lse is not None:
        full = working_scale(case, exact_lse)
        fields.append(("lse", outputs.lse, exact_lse, lse_bound, everywhere, full))
    found = []
    for name, value, exact, bound, keep, working in fields:
        with np.errstate(invalid="ignore", over="ignore"):
            scale = np.fmax(np.abs(exact), working)
            abs_error = np.where(
                np.isfinite(exact) & np.isfinite(value), np.abs(value - exact), np.nan
            )
            within = within_bound(np.asarray(value, dtype=np.float64), exact, bound)
        rows = np.flatnonzero(keep)
        found.append(
            RowErrors(
                quantity=name,
                rows=rows,
                observed=np.asarray(value, dtype=np.float64)[rows],
                exact=exact[rows],
                abs_error=abs_error[rows],
                ulp_error=ulps(exact, value, scale)[rows],
                tolerance_ulp=(bound / fp32_ulp(scale))[rows],
                within=within[rows],
            )
        )
    return found


def worst_rows(errors: list[RowErrors], count: int = 3) -> list[dict[str, Any]]:
    """The ``count`` rows with the largest error / tolerance, as plain dicts."""
    entries: list[dict[str, Any]] = []
    for item in errors:
        used = item.used
        for index in range(item.rows.size):
            entries.append(
                {
                    "quantity": item.quantity,
                    "row": int(item.rows[index]),
                    "observed": float(item.observed[index]),
                    "exact": float(item.exact[index]),
                    "ulp_error": float(item.ulp_error[index]),
                    "tolerance_ulp": float(item.tolerance_ulp[index]),
                    "used": float(used[index]),
                }
            )
    entries.sort(key=lambda entry: -entry["used"])
    return entries[:count]


def format_rows(entries: list[dict[str, Any]]) -> list[str]:
    """A small aligned table of :func:`worst_rows` output."""
    header = ("quantity", "row", "observed", "exact", "ulp error", "tolerance ulp")
    table = [header] + [
        (
            entry["quantity"],
            str(entry["row"]),
            repr(entry["observed"]),
            repr(entry["exact"]),
            f"{entry['ulp_error']:.4g}",
            f"{entry['tolerance_ulp']:.4g}",
        )
        for entry in entries
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in table]
