"""Measuring a backend's error against its bound, and failing with a readable report.

:func:`expect_close` compares outputs with expected values under the tolerance
table (``docs/tolerances.md``), row by row, and raises a
:class:`~tp_logprob.judging.violation.PropertyViolation` naming the worst row;
:func:`expect_bitwise` demands identical fp32 bits. The bounds come from
:func:`suite_tolerance` at the case's exact values (:func:`allowed_error`,
:func:`entropy_error`), widened by :func:`input_error` for a fused LM head's own
dot products; :func:`ulps` measures an error in fp32 ulps. :func:`judge_exact` and
:func:`judge_reference` hold a run's outputs to the exact oracle and to the float64
reference. Judging runs nothing: the harness runs the case
(:mod:`tp_logprob.suite.expect`), an assert of :mod:`tp_logprob.testing` is handed the
outputs, and both judge them here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt
from hypothesis import currently_in_test_context, target

from tp_logprob.accumulation import AccumulationOrder
from tp_logprob.judging.bounds import fp32_ulp, order_note, suite_tolerance
from tp_logprob.judging.expected import exact_entropy_of, exact_outputs, row_max_of_z
from tp_logprob.judging.outputs import Floats, Outputs
from tp_logprob.judging.violation import format_value, row_list, violation
from tp_logprob.oracle import fused_extra_bounds
from tp_logprob.oracle.reference import reference_error_bounds, reference_selected_logprob
from tp_logprob.oracle.reference_entropy import reference_entropy, reference_entropy_error_bounds
from tp_logprob.oracle.tolerance import LogprobTolerance
from tp_logprob.oracle.tolerance import within_tolerance as within_bound
from tp_logprob.oracle.ulp import ulp_distance
from tp_logprob.strategies import HiddenCase, LogprobCase

__all__ = [
    "Compared",
    "ErrorTally",
    "allowed_error",
    "entropy_error",
    "entropy_room",
    "expect_bitwise",
    "expect_close",
    "expect_within",
    "input_error",
    "judge_exact",
    "judge_reference",
    "row_summary",
    "ulps",
    "working_scale",
]


class ErrorTally(Protocol):
    """Where measured errors are counted (the session's
    :class:`~tp_logprob.suite.summary.SuiteStats`, for its summary table)."""

    def error(self, backend_id: str, prop: str, ulps: float, tolerance_used: float) -> None:
        """Count an observed error: in fp32 ulps, and as a fraction of its tolerance."""


def ulps(exact: Floats, value: Floats, scale: Floats | None = None) -> Floats:
    """``|value - exact|`` in fp32 ulps at ``scale`` (default: ``exact``).

    ``lse = M + log S`` and ``selected = target - lse`` can cancel to nearly 0,
    where ulps at the exact value are meaningless; :func:`expect_close` measures at
    ``max(|value|, |lse|, |row max|)``, the magnitude the computation works at.
    Special values: 0 if they match, else inf.
    """
    distance = np.asarray(ulp_distance(exact, value, "fp32"), dtype=np.float64)
    if scale is None:
        return distance
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = np.abs(value - exact) / fp32_ulp(scale)
    return np.where(np.isfinite(exact) & np.isfinite(value), scaled, distance)


@dataclass(frozen=True)
class Compared:
    """One output compared row by row: what came back, the expected values, the allowed
    absolute error, which rows count, and the magnitude its ulps are measured at.

    ``zero_inactive`` outputs (``selected_logp``, entropy) must be exactly +0.0 on
    inactive rows.
    """

    name: str
    value: Floats
    exact: Floats
    bound: Floats
    rows: npt.NDArray[np.bool_]
    scale: Floats
    zero_inactive: bool = False


def expect_close(
    prop: str,
    case: LogprobCase,
    backend_id: str,
    observed: Outputs,
    expected_selected: Floats,
    expected_lse: Floats,
    *,
    expected_name: str = "exact",
    extra_selected: Floats | float = 0.0,
    extra_lse: Floats | float = 0.0,
    expected_entropy: Floats | str | None = "exact",
    extra_entropy: Floats | float = 0.0,
    stats: ErrorTally | None = None,
    count_ulps: bool = True,
    inactive_zero: bool = True,
    finite_headline: str | None = None,
    order: AccumulationOrder | None = None,
    shard_partials: bool = False,
) -> None:
    """Raise unless ``observed`` is within tolerance of the expected values, row by row.

    NaN and infinities must match exactly. With ``inactive_zero`` inactive rows
    must be exactly +0.0 (``selected_logp`` and ``entropy``); without it
    (comparing two runs) they are not compared, since that rule has its own
    property. ``extra_*`` widen the bound (for an expected value that is itself
    inexact). When the run returned entropy it is compared with
    ``expected_entropy``: ``"exact"`` (the oracle's, for ``case``), an array, or
    None to skip it. With ``count_ulps`` the ulp errors feed
    ``hypothesis.target`` and ``stats``. ``finite_headline`` replaces ``prop`` when
    the worst violation is a finite value against a finite expectation (so a
    special-values property does not blame the NaN/inf pattern for a rounding error).
    ``order`` and ``shard_partials`` choose the bound (:func:`suite_tolerance`); with an
    ``order`` the report names it.
    """
    active = case.active
    exact_lse = np.asarray(expected_lse, dtype=np.float64)
    exact_sel = np.asarray(expected_selected, dtype=np.float64)
    scale = working_scale(case, exact_lse)
    tol = suite_tolerance(case.contract, order, shard_partials=shard_partials)
    sel_bound, lse_bound = allowed_error(case, exact_sel, exact_lse, tol)
    fields = [
        Compared(
            "selected_logp",
            observed.selected,
            exact_sel,
            sel_bound + extra_selected,
            active,
            _with(scale, exact_sel),
            zero_inactive=True,
        )
    ]
    if observed.lse is not None:
        fields.append(
            Compared(
                "lse", observed.lse, exact_lse, lse_bound + extra_lse, np.ones_like(active), scale
            )
        )
    if observed.entropy is not None and expected_entropy is not None:
        if isinstance(expected_entropy, str):
            expected_entropy = exact_entropy_of(case)
        exact_h = np.asarray(expected_entropy, dtype=np.float64)
        bound_h = entropy_error(case, exact_h, exact_lse, tol) + extra_entropy
        fields.append(
            Compared(
                "entropy",
                observed.entropy,
                exact_h,
                bound_h,
                active,
                _with(scale, exact_h),
                zero_inactive=True,
            )
        )
    expect_within(
        prop,
        case,
        backend_id,
        fields,
        expected_name=expected_name,
        stats=stats,
        count_ulps=count_ulps,
        inactive_zero=inactive_zero,
        finite_headline=finite_headline,
        notes=None if order is None else (lambda row: [order_note(order)]),
    )


def working_scale(case: LogprobCase, lse: Floats) -> Floats:
    """``max(|lse|, |row max of z|)`` per row: the magnitude a row's computation works at
    (NaN where both are; a non-finite row max counts as 0)."""
    live_max = row_max_of_z(case)
    row_max = np.where(np.isfinite(live_max), live_max, 0.0)
    with np.errstate(invalid="ignore"):
        return np.asarray(np.fmax(np.abs(np.asarray(lse, np.float64)), np.abs(row_max)))


def _with(scale: Floats, values: Floats) -> Floats:
    with np.errstate(invalid="ignore"):
        return np.asarray(np.fmax(np.abs(values), scale))


def expect_within(
    prop: str,
    case: LogprobCase,
    backend_id: str,
    fields: list[Compared],
    *,
    expected_name: str = "exact",
    stats: ErrorTally | None = None,
    count_ulps: bool = True,
    inactive_zero: bool = True,
    finite_headline: str | None = None,
    notes: Callable[[int], list[tuple[str, str]]] | None = None,
) -> None:
    """Raise unless every field is within its bound on its rows; the report names the
    worst row of the first field out of bounds, with ``notes(row)`` added to it.

    The rules are :func:`expect_close`'s (NaN and infinities must match exactly; with
    ``inactive_zero`` a ``zero_inactive`` field must be +0.0 on inactive rows).
    """
    active = case.active
    for field in fields:
        name, value, exact, rows = field.name, field.value, field.exact, field.rows
        errors = ulps(exact, value, field.scale)
        bounds = field.bound / fp32_ulp(field.scale)
        with np.errstate(invalid="ignore", divide="ignore"):
            used = errors / bounds
        if count_ulps:
            _record(prop, backend_id, name, errors[rows], used[rows], stats)
        with np.errstate(invalid="ignore", over="ignore"):
            bad = ~within_bound(value, exact, field.bound) & rows
        if field.zero_inactive and inactive_zero:
            bad |= ~active & ((value != 0.0) | np.signbit(value))
        if bad.any():
            ratio = np.where(bad, np.nan_to_num(used, nan=np.inf), -1.0)
            row = int(np.argmax(ratio))
            both_finite = bool(np.isfinite(value[row]) and np.isfinite(exact[row]))
            lines = _mismatch_lines(
                case, field, row, errors, bounds, bad, expected_name, inactive_zero
            )
            raise violation(
                finite_headline if finite_headline and both_finite else prop,
                case,
                backend_id,
                lines + ([] if notes is None else notes(row)),
                measured=(float(errors[row]), float(used[row])),
            )


def _record(
    prop: str,
    backend_id: str,
    name: str,
    errors: Floats,
    used: Floats,
    stats: ErrorTally | None,
) -> None:
    """Feed the worst error to ``hypothesis.target`` (which must see finite values) and stats."""
    finite = np.isfinite(errors)
    worst = float(np.max(errors[finite], initial=0.0))
    worst_used = float(np.max(used[finite & np.isfinite(used)], initial=0.0))
    if currently_in_test_context():  # pinned cases run outside Hypothesis
        target(min(worst, 1e30), label=f"{name} ulp error")
        target(min(worst_used, 1e30), label=f"{name} error / tolerance")
    if stats is not None:
        stats.error(backend_id, prop.split(":")[0], worst, worst_used)


def _mismatch_lines(
    case: LogprobCase,
    field: Compared,
    row: int,
    errors: Floats,
    bounds: Floats,
    bad: npt.NDArray[np.bool_],
    expected_name: str,
    inactive_zero: bool,
) -> list[tuple[str, str]]:
    name = field.name
    target_id = int(case.targets[row])
    active = bool(case.active[row])
    column = (
        f"column {target_id} (target)" if active and name == "selected_logp" else "all live columns"
    )
    exact_zero = field.zero_inactive and inactive_zero and not active
    state = "active" if active else "inactive"
    tolerance = "exactly +0.0 required" if exact_zero else f"tolerance {bounds[row]:.4g} ulp"
    return [
        (
            "worst",
            f"{name}, row {row} ({state}), {column}; rows out of tolerance: "
            f"{row_list(np.flatnonzero(bad))}",
        ),
        ("observed", format_value(field.value[row])),
        ("expected", f"{format_value(field.exact[row])} [{expected_name}]"),
        ("error", f"{errors[row]:.4g} ulp (of max(|expected|, |lse|, |row max|)); {tolerance}"),
        ("row", row_summary(case, row)),
    ]


def row_summary(case: LogprobCase, row: int) -> str:
    values = case.logits[row]
    real = case.contract.sharding.real_vocab_size
    live, pad = values[:real], values[real:]
    text = f"live {np.array2string(live, precision=6, threshold=12, max_line_width=1000)}"
    if pad.size:
        text += f", padding {np.array2string(pad, precision=6, threshold=6, max_line_width=1000)}"
    return text


def expect_bitwise(
    prop: str,
    case: LogprobCase,
    backend_id: str,
    first: Outputs,
    second: Outputs,
    *,
    labels: tuple[str, str],
) -> None:
    """Raise unless both runs' outputs have identical fp32 bits, row for row (a processed
    op's ``support_lse``, ``support_threshold`` and ``support_size`` too, where both
    runs returned them)."""
    pairs = [("selected_logp", first.selected, second.selected)]
    for name in ("lse", "entropy", "support_lse", "support_threshold", "support_size"):
        a, b = getattr(first, name), getattr(second, name)
        if a is not None and b is not None:
            pairs.append((name, a, b))
    for name, a, b in pairs:
        sizes = name == "support_size"
        differ = np.flatnonzero(a != b if sizes else _bits(a) != _bits(b))
        if differ.size:
            row = int(differ[0])
            distance = math.inf  # a count that differs is no ulp distance
            if sizes:
                shown, error = (str(int(a[row])), str(int(b[row]))), "equality required"
            else:
                distance = float(ulps(a[row : row + 1], b[row : row + 1])[0])
                shown = (format_value(a[row]), format_value(b[row]))
                error = f"{distance:.4g} ulp; bitwise equality required"
            raise violation(
                prop,
                case,
                backend_id,
                [
                    ("worst", f"{name}, row {row}; {differ.size} rows differ: {row_list(differ)}"),
                    (labels[0], shown[0]),
                    (labels[1], shown[1]),
                    ("error", error),
                ],
                measured=(distance, math.inf),  # any difference is past a tolerance of 0
            )


def _bits(values: Floats) -> npt.NDArray[np.uint32]:
    return np.asarray(values, dtype=np.float32).view(np.uint32)


def input_error(case: LogprobCase) -> tuple[Floats, Floats, Floats]:
    """Extra ``(selected_logp, lse, entropy)`` room, ``[N]`` each, for a backend's own logits.

    Zero for a logits case (the backend reads ``case.logits``). A fused LM-head
    case's backend forms ``x`` with fp32 dot products, off the oracle's
    ``fp32(exact x)`` by up to :func:`~tp_logprob.oracle.dot_product_error_bound`;
    :func:`~tp_logprob.oracle.fused_extra_bounds` turns that into output room.
    Rows where the bound is not finite (NaN in an inactive row) get no room.
    """
    rows = case.contract.num_tokens
    if not isinstance(case, HiddenCase):
        zero = np.zeros(rows)
        return zero, zero, zero
    lse, selected, entropy = fused_extra_bounds(
        case.exact_logits,
        case.dot_bound,
        case.targets,
        temperature=case.contract.batch_temperature,
    )
    finite = [np.nan_to_num(np.asarray(v, np.float64), nan=0.0) for v in (selected, lse, entropy)]
    return finite[0], finite[1], finite[2]


def allowed_error(
    case: LogprobCase, selected: Floats, lse: Floats, tol: LogprobTolerance | None = None
) -> tuple[Floats, Floats]:
    """The tolerance table's bounds ``(selected, lse)`` at the exact values of ``case``
    (``tol``: a :func:`suite_tolerance` entry; default the any-order one)."""
    tol = suite_tolerance(case.contract) if tol is None else tol
    row_max = row_max_of_z(case)
    finite_lse = np.where(np.isfinite(lse), lse, 0.0)
    finite_sel = np.where(np.isfinite(selected), selected, 0.0)
    return (
        tol.selected_bound(finite_sel, finite_lse, row_max=row_max),
        tol.lse_bound(finite_lse, row_max=row_max),
    )


def entropy_error(
    case: LogprobCase, entropy: Floats, lse: Floats, tol: LogprobTolerance | None = None
) -> Floats:
    """The tolerance table's entropy bound at the exact ``entropy`` and ``lse`` of ``case``
    (``tol``: a :func:`suite_tolerance` entry; default the any-order one)."""
    tol = suite_tolerance(case.contract) if tol is None else tol
    finite_h = np.where(np.isfinite(entropy), entropy, 0.0)
    finite_lse = np.where(np.isfinite(lse), lse, 0.0)
    row_max = row_max_of_z(case)
    usable = np.isfinite(lse) & np.isfinite(row_max)
    bound = tol.entropy_bound(
        finite_h, lse=np.where(usable, finite_lse, 0.0), row_max=np.where(usable, row_max, 0.0)
    )
    return np.asarray(bound, dtype=np.float64)


def judge_exact(
    prop: str,
    case: LogprobCase,
    backend_id: str,
    outputs: Outputs,
    stats: ErrorTally | None = None,
    *,
    finite_headline: str | None = None,
    count_ulps: bool = True,
    order: AccumulationOrder | None = None,
) -> None:
    """:func:`expect_close` of a run's ``outputs`` to the exact oracle, with a fused head's
    room, under the bound of ``order``, the backend's declared accumulation order (None:
    sums in any order)."""
    selected, lse = exact_outputs(case)
    extra_selected, extra_lse, extra_entropy = input_error(case)
    expect_close(
        prop,
        case,
        backend_id,
        outputs,
        selected,
        lse,
        extra_selected=extra_selected,
        extra_lse=extra_lse,
        extra_entropy=extra_entropy,
        stats=stats,
        finite_headline=finite_headline,
        count_ulps=count_ulps,
        order=None if order is None or order.is_any else order,
    )


def judge_reference(
    prop: str,
    case: LogprobCase,
    backend_id: str,
    outputs: Outputs,
    stats: ErrorTally | None = None,
) -> None:
    """:func:`expect_close` of a run's ``outputs`` to the float64 reference plus its own
    bound."""
    real = case.contract.sharding.real_vocab_size
    temperature = case.contract.batch_temperature
    selected, lse = reference_selected_logprob(
        case.logits,
        case.targets,
        active_mask=case.active,
        real_vocab_size=real,
        temperature=temperature,
    )
    extra_selected, extra_lse = reference_error_bounds(selected, lse, real)
    entropy = reference_entropy(
        case.logits, active_mask=case.active, real_vocab_size=real, temperature=temperature
    )
    # Without lse and row_max the bound takes log S <= min(H, log n): sound with
    # reference (not exact) values.
    extra_entropy = reference_entropy_error_bounds(
        np.where(np.isfinite(entropy), entropy, 0.0), real
    )
    expect_close(
        f"{prop}: output outside the tolerance table",
        case,
        backend_id,
        outputs,
        selected,
        lse,
        expected_name="reference",
        extra_selected=extra_selected,
        extra_lse=extra_lse,
        expected_entropy=entropy,
        extra_entropy=extra_entropy,
        stats=stats,
    )


def entropy_room(case: LogprobCase, run: Outputs, lse: Floats) -> Floats | float:
    """The entropy tolerance at ``case``'s exact values, when ``run`` returned entropy."""
    return 0.0 if run.entropy is None else entropy_error(case, exact_entropy_of(case), lse)
