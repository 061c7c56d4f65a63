"""Drift reports: a backend's error against the exact oracle, per dtype and TP degree.

Cases come from artifacts or are generated (small shapes, every dtype and TP
degree the backend claims, reproducible from a seed). The report is a markdown
table, a JSON document, and optionally a PNG histogram of ulp errors with the
tightest tolerance drawn in (needs matplotlib: ``pip install tp-logprob[plot]``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tp_logprob.replay.artifacts import artifact_paths, load_artifact
from tp_logprob.replay.drift import RowErrors, measure, worst_rows
from tp_logprob.strategies import LogprobCase
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.property import SuiteProperty

__all__ = [
    "ASTRONOMICAL_ULP",
    "DriftReport",
    "axis_top",
    "build_report",
    "generate_cases",
    "load_cases",
    "plot_report",
]

TP_DEGREES = (1, 2, 4, 8)
WORST_SHOWN = 5


def generate_cases(capability: Any, count: int, seed: int) -> list[LogprobCase]:
    """About ``count`` small cases spread over the dtypes and TP degrees ``capability`` claims."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from tp_logprob.strategies import cases

    dtypes = sorted(dtype.value for dtype in capability.dtypes)
    claimed = capability.tp_world_sizes
    degrees = [tp for tp in TP_DEGREES if claimed is None or tp in claimed]
    groups = [(dtype, tp) for dtype in dtypes for tp in degrees]
    per_group = max(1, math.ceil(count / max(len(groups), 1)))
    found: list[LogprobCase] = []
    for index, (dtype, tp) in enumerate(groups):
        strategy = cases(
            capability=capability,
            dtypes={dtype},
            tp_world_sizes={tp},
            min_padded_vocab_size=tp,
            max_padded_vocab_size=64,
            max_num_tokens=8,
        )

        @settings(
            max_examples=per_group,
            database=None,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @hypothesis_seed(seed * 1_000 + index)
        @given(strategy)
        def collect(case: LogprobCase) -> None:
            found.append(case)

        collect()
    return found[: max(count, len(groups))]


def load_cases(paths: Sequence[str], properties: Mapping[str, SuiteProperty]) -> list[LogprobCase]:
    """The cases of every artifact under ``paths`` (each validated against ``properties``)."""
    return [load_artifact(file, properties).case for path in paths for file in artifact_paths(path)]


@dataclass
class _Group:
    cases: int = 0
    errors: list[RowErrors] = field(default_factory=list)
    case_index: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class DriftReport:
    """The measured errors, grouped by (dtype, TP degree), and how to show them."""

    backend_id: str
    source: str
    groups: dict[tuple[str, int], _Group]

    def summary(self) -> list[dict[str, Any]]:
        """One entry per (dtype, tp, quantity): errors, tolerance, counts, worst rows."""
        entries = []
        for (dtype, tp), group in sorted(self.groups.items()):
            by_quantity: dict[str, list[tuple[int, RowErrors]]] = defaultdict(list)
            for index, item in zip(group.case_index, group.errors, strict=True):
                by_quantity[item.quantity].append((index, item))
            for quantity, items in sorted(by_quantity.items()):
                entries.append(_entry(dtype, tp, quantity, group.cases, items))
        return entries

    def ulp_errors(self) -> dict[str, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
        """Per quantity: every finite ulp error and its row's tolerance in ulps."""
        found: dict[str, list[RowErrors]] = defaultdict(list)
        for group in self.groups.values():
            for item in group.errors:
                found[item.quantity].append(item)
        result = {}
        for quantity, items in found.items():
            errors = np.concatenate([item.ulp_error for item in items])
            tolerance = np.concatenate([item.tolerance_ulp for item in items])
            finite = np.isfinite(errors) & np.isfinite(tolerance)
            result[quantity] = (errors[finite], tolerance[finite])
        return result

    def to_json(self) -> dict[str, Any]:
        """Strict JSON: non-finite numbers become the strings "inf", "-inf" or "nan"."""
        document = {"backend": self.backend_id, "source": self.source, "groups": self.summary()}
        return dict(_strict(document))

    def markdown(self) -> str:
        header = (
            "| dtype | tp | quantity | cases | values | max abs error | mean abs error "
            "| max ulp error | tolerance (ulp) at worst | max error / tolerance "
            "| out of tolerance |"
        )
        lines = [
            f"Drift of `{self.backend_id}` against the exact oracle ({self.source})",
            "",
            header,
            "|" + "---|" * 11,
        ]
        worst: list[tuple[float, str]] = []
        for entry in self.summary():
            lines.append(
                f"| {entry['dtype']} | {entry['tp']} | {entry['quantity']} | {entry['cases']} "
                f"| {entry['values']} | {entry['max_abs_error']:.3g} "
                f"| {entry['mean_abs_error']:.3g} | {entry['max_ulp_error']:.4g} "
                f"| {entry['tolerance_ulp_at_worst']:.4g} | {entry['max_used']:.3g} "
                f"| {entry['out_of_tolerance']} |"
            )
            for row in entry["worst_rows"]:
                worst.append(
                    (
                        row["used"],
                        f"- {entry['dtype']} tp={entry['tp']} {row['quantity']}: case "
                        f"{row['case']} row {row['row']}: observed {row['observed']!r}, exact "
                        f"{row['exact']!r}, {row['ulp_error']:.4g} ulp (tolerance "
                        f"{row['tolerance_ulp']:.4g}, {row['used']:.3g} of it)",
                    )
                )
        worst.sort(key=lambda item: -item[0])
        top = [line for _, line in worst[:WORST_SHOWN]]
        return "\n".join([*lines, "", f"Worst {len(top)} rows by error / tolerance:", "", *top])


def _strict(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {key: _strict(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_strict(item) for item in value]
    return value


def _entry(
    dtype: str, tp: int, quantity: str, cases: int, items: list[tuple[int, RowErrors]]
) -> dict[str, Any]:
    abs_error = np.concatenate([item.abs_error for _, item in items])
    ulps = np.concatenate([item.ulp_error for _, item in items])
    tolerance = np.concatenate([item.tolerance_ulp for _, item in items])
    used = np.concatenate([item.used for _, item in items])
    finite_abs = abs_error[np.isfinite(abs_error)]
    worst = int(np.argmax(used)) if used.size else -1
    rows = []
    for index, item in items:
        for row in worst_rows([item], count=3):
            rows.append({"case": index, **row})
    rows.sort(key=lambda row: -row["used"])
    return {
        "dtype": dtype,
        "tp": tp,
        "quantity": quantity,
        "cases": cases,
        "values": int(ulps.size),
        "max_abs_error": float(finite_abs.max(initial=0.0)),
        "mean_abs_error": float(finite_abs.mean()) if finite_abs.size else 0.0,
        "max_ulp_error": float(ulps[np.isfinite(ulps)].max(initial=0.0)),
        "tolerance_ulp_at_worst": float(tolerance[worst]) if worst >= 0 else 0.0,
        "max_used": float(used.max(initial=0.0)),
        "out_of_tolerance": int(sum(np.count_nonzero(~item.within) for _, item in items)),
        "worst_rows": rows[:3],
    }


def build_report(
    backend: BackendUnderTest, cases: Sequence[LogprobCase], source: str
) -> DriftReport:
    """Run every case on ``backend`` and measure it against the exact oracle."""
    groups: dict[tuple[str, int], _Group] = defaultdict(_Group)
    for index, case in enumerate(cases):
        if not backend.capability.supports(case.contract):
            continue
        key = (case.contract.dtype.value, case.contract.sharding.tp_world_size)
        group = groups[key]
        group.cases += 1
        for item in measure(backend, case):
            group.errors.append(item)
            group.case_index.append(index)
    return DriftReport(backend.backend_id, source, dict(groups))


ASTRONOMICAL_ULP = 2.0**24
"""A tolerance wider than this many fp32 ulps is wider than the value itself (a row whose
exact value is zero, or whose bound holds no bit of it); the plot clips it into its last bin."""


def axis_top(errors: np.ndarray[Any, Any], tolerance: np.ndarray[Any, Any]) -> float:
    """The right end of a plot's ulp axis: twice the largest error or the 90th percentile of
    the ordinary tolerances, however many rows have an astronomical one."""
    ordinary = tolerance[tolerance <= ASTRONOMICAL_ULP]
    wide = float(np.percentile(ordinary, 90)) if ordinary.size else 1.0
    return max(float(errors.max(initial=0.0)), wide, 1.0) * 2.0


def plot_report(report: DriftReport, path: str) -> None:
    """A PNG histogram of ulp errors per quantity, with the tightest tolerance as a line."""
    try:
        from matplotlib import figure as matplotlib_figure  # needs matplotlib itself
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        raise RuntimeError(
            "--plot needs matplotlib: pip install 'tp-logprob[plot]' (or matplotlib>=3.7)"
        ) from None

    data = report.ulp_errors()
    # A figure of its own on its own Agg canvas: pyplot and the caller's backend stay as
    # they were, and no figure is left registered anywhere.
    figure = matplotlib_figure.Figure(figsize=(6 * max(len(data), 1), 4))
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(data) or 1, squeeze=False)
    for axis, (quantity, (errors, tolerance)) in zip(axes[0], sorted(data.items()), strict=False):
        tightest = float(tolerance.min()) if tolerance.size else 1.0
        top = axis_top(errors, tolerance)
        tolerance = np.minimum(tolerance, top * 0.999)
        edges = np.concatenate([[0.0], np.geomspace(0.01, top, 48)])
        axis.hist(errors, bins=edges, color="tab:blue", label=f"ulp error ({errors.size} rows)")
        axis.hist(
            tolerance,
            bins=edges,
            histtype="step",
            color="tab:red",
            linewidth=1.5,
            label="each row's tolerance",
        )
        axis.axvline(
            tightest,
            color="tab:red",
            linestyle="--",
            linewidth=2,
            label=f"tightest tolerance ({tightest:.3g} ulp)",
        )
        axis.set_xscale("symlog", linthresh=0.01)
        axis.set_xlim(0.0, top)
        axis.set_xlabel(f"{quantity}: |observed - exact| in fp32 ulps (symlog)")
        axis.set_ylabel("rows")
        axis.set_title(f"{report.backend_id}: {quantity} vs the exact oracle\n{report.source}")
        axis.legend(loc="upper center")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
