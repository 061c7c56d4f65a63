"""Running one case on a backend at its TP degree, and judging the outputs.

Every property goes through :func:`execute`: dispatch by backend id (so the
capability gate is exercised), :func:`~tp_logprob.run_tp` over emulated ranks
(which also proves the outputs are replicated), then a structural check of what
came back. :func:`check_close` compares with expected values under the
tolerance table and raises a readable :class:`PropertyViolation`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import currently_in_test_context, target
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from tp_logprob.contract import LogprobContract, MaskSpec
from tp_logprob.oracle import apply_temperature, exact_entropy, fused_extra_bounds
from tp_logprob.oracle.exact import exact_selected_logprob
from tp_logprob.oracle.tolerance import tolerance
from tp_logprob.oracle.tolerance import within_tolerance as within_bound
from tp_logprob.oracle.ulp import ulp_distance, ulp_exponent
from tp_logprob.properties._report import SuiteStats, format_value, violation
from tp_logprob.strategies import HiddenCase, LogprobCase, cases, contracts

__all__ = [
    "MIN_ONLINE_BLOCK",
    "Outputs",
    "allowed_error",
    "check_bitwise",
    "cases_for",
    "check_close",
    "draw_case",
    "entropy_error",
    "exact_entropy_of",
    "exact_outputs",
    "execute",
    "input_error",
    "row_max_of_z",
    "row_summary",
    "select_rows",
    "sub_batch",
    "suite_tolerance",
]

Floats = npt.NDArray[np.float64]

MIN_ONLINE_BLOCK = 16
"""The tolerance allows one exp-rescaling per 16 columns of a shard (an online
softmax over blocks of at least 16 columns) plus the cross-rank merge."""


@dataclass(frozen=True)
class Outputs:
    """One run's replicated outputs as float64 copies of the fp32 values.

    ``entropy`` is None unless the contract has ``export_entropy``.
    """

    selected: Floats
    lse: Floats | None
    results: Any  # the per-rank LogprobResults, for gradients
    entropy: Floats | None = None


def execute(
    backend: Any,
    case: LogprobCase,
    *,
    logits: Any = None,
    targets: Any = None,
    operands: tuple[Any, Any, Any] | None = None,
) -> Outputs:
    """Run ``case`` on every emulated rank of its contract; check replication and structure.

    ``logits`` and ``targets`` override the tensors made from ``case`` (e.g. logits
    that require grad, or tensors the caller keeps to inspect afterwards). A fused
    LM-head case (``input_kind="hidden"``) runs through
    :func:`~tp_logprob.run_tp_hidden` on its ``(hidden, weight, bias)``, or on
    ``operands`` when given.
    """
    from tp_logprob.emulate import ReplicationError, run_tp, run_tp_hidden

    contract = case.contract
    op = backend.op_for(contract)
    try:
        if targets is None:
            targets = case.torch_targets(backend.device)
        if isinstance(case, HiddenCase):
            hidden, weight, bias = (
                case.torch_inputs(backend.device) if operands is None else operands
            )
            results = run_tp_hidden(op, hidden, weight, targets, contract, bias=bias)
        else:
            full = case.torch_logits(backend.device) if logits is None else logits
            results = run_tp(op, full, targets, contract)
    except ReplicationError as error:
        raise violation(
            "replicated outputs: ranks returned different bits",
            case,
            backend.backend_id,
            [("problem", str(error))],
        ) from None
    first = results[0]
    problems = _structure_problems(first, contract)
    if problems:
        raise violation(
            "output structure: not fp32 [N] tensors as the contract requires",
            case,
            backend.backend_id,
            [("problem", "; ".join(problems))],
        )
    lse = None if first.lse is None else _numpy(first.lse)
    entropy = None if first.entropy is None else _numpy(first.entropy)
    return Outputs(_numpy(first.selected_logp), lse, results, entropy)


def _numpy(tensor: Any) -> Floats:
    return np.asarray(tensor.detach().float().cpu().numpy(), dtype=np.float64)


def _structure_problems(result: Any, contract: LogprobContract) -> list[str]:
    rows = contract.num_tokens
    problems = []
    fields = [
        ("selected_logp", result.selected_logp, True, ""),
        ("lse", result.lse, contract.export_lse, "export_lse"),
        ("entropy", result.entropy, contract.export_entropy, "export_entropy"),
    ]
    for name, value, wanted, flag in fields:
        if not wanted:
            if value is not None:
                problems.append(f"{name} should be None ({flag}=False), got {type(value).__name__}")
            continue
        shape = tuple(getattr(value, "shape", ()))
        dtype = str(getattr(value, "dtype", type(value).__name__))
        if shape != (rows,) or dtype != "torch.float32":
            problems.append(f"{name} is {dtype} {list(shape)}, expected torch.float32 [{rows}]")
    return problems


def suite_tolerance(contract: LogprobContract) -> Any:
    """The tolerance table entry for ``contract`` (see :data:`MIN_ONLINE_BLOCK`)."""
    sharding = contract.sharding
    widest = max(
        end - start
        for start, end in (sharding.live_bounds(r) for r in range(sharding.tp_world_size))
    )
    return tolerance(
        contract.dtype.value,
        sharding.real_vocab_size,
        num_shards=sharding.tp_world_size,
        rescales=math.ceil(widest / MIN_ONLINE_BLOCK) + 1,
    )


def row_max_of_z(case: LogprobCase) -> Floats:
    """Each row's max live ``z = fp32(x) / fp32(T)``: the magnitude the bounds scale with."""
    live = apply_temperature(
        case.logits[:, : case.contract.sharding.real_vocab_size], case.contract.temperature
    )
    with np.errstate(invalid="ignore"):
        return live.max(axis=1) if live.shape[1] else np.full(live.shape[0], -np.inf)


def _ulp(scale: Floats) -> Floats:
    """The fp32 ulp at each ``scale`` (finite; +-inf and NaN count as 0)."""
    finite = np.where(np.isfinite(scale), np.abs(scale), 0.0)
    return np.asarray(np.ldexp(1.0, ulp_exponent(finite, "fp32")), dtype=np.float64)


def _ulps(exact: Floats, value: Floats, scale: Floats | None = None) -> Floats:
    """``|value - exact|`` in fp32 ulps at ``scale`` (default: ``exact``).

    ``lse = M + log S`` and ``selected = target - lse`` can cancel to nearly 0,
    where ulps at the exact value are meaningless; :func:`check_close` measures at
    ``max(|value|, |lse|, |row max|)``, the magnitude the computation works at.
    Special values: 0 if they match, else inf.
    """
    distance = np.asarray(ulp_distance(exact, value, "fp32"), dtype=np.float64)
    if scale is None:
        return distance
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = np.abs(value - exact) / _ulp(scale)
    return np.where(np.isfinite(exact) & np.isfinite(value), scaled, distance)


def check_close(
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
    stats: SuiteStats | None = None,
    count_ulps: bool = True,
    inactive_zero: bool = True,
    finite_headline: str | None = None,
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
    """
    active = case.active
    live_max = row_max_of_z(case)
    row_max = np.where(np.isfinite(live_max), live_max, 0.0)
    exact_lse = np.asarray(expected_lse, dtype=np.float64)
    exact_sel = np.asarray(expected_selected, dtype=np.float64)
    sel_bound, lse_bound = allowed_error(case, exact_sel, exact_lse)
    fields: list[tuple[str, Floats, Floats, Floats, npt.NDArray[np.bool_]]] = [
        ("selected_logp", observed.selected, exact_sel, sel_bound + extra_selected, active)
    ]
    if observed.lse is not None:
        fields.append(("lse", observed.lse, exact_lse, lse_bound + extra_lse, np.ones_like(active)))
    if observed.entropy is not None and expected_entropy is not None:
        if isinstance(expected_entropy, str):
            expected_entropy = exact_entropy_of(case)
        exact_h = np.asarray(expected_entropy, dtype=np.float64)
        bound_h = entropy_error(case, exact_h, exact_lse) + extra_entropy
        fields.append(("entropy", observed.entropy, exact_h, bound_h, active))
    for name, value, exact, bound, rows in fields:
        with np.errstate(invalid="ignore"):
            scale = np.fmax(np.fmax(np.abs(exact), np.abs(exact_lse)), np.abs(row_max))
        errors = _ulps(exact, value, scale)
        bounds = bound / _ulp(scale)
        with np.errstate(invalid="ignore", divide="ignore"):
            used = errors / bounds
        if count_ulps:
            _record(prop, backend_id, name, errors[rows], used[rows], stats)
        with np.errstate(invalid="ignore", over="ignore"):
            bad = ~within_bound(value, exact, bound) & rows
        if name in ("selected_logp", "entropy") and inactive_zero:
            bad |= ~active & ((value != 0.0) | np.signbit(value))
        if bad.any():
            ratio = np.where(bad, np.nan_to_num(used, nan=np.inf), -1.0)
            row = int(np.argmax(ratio))
            both_finite = bool(np.isfinite(value[row]) and np.isfinite(exact[row]))
            raise violation(
                finite_headline if finite_headline and both_finite else prop,
                case,
                backend_id,
                _mismatch_lines(case, name, row, value, exact, errors, bounds, bad, expected_name),
            )


def _record(
    prop: str,
    backend_id: str,
    name: str,
    errors: Floats,
    used: Floats,
    stats: SuiteStats | None,
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
    name: str,
    row: int,
    value: Floats,
    exact: Floats,
    errors: Floats,
    bounds: Floats,
    bad: npt.NDArray[np.bool_],
    expected_name: str,
) -> list[tuple[str, str]]:
    target_id = int(case.targets[row])
    active = bool(case.active[row])
    column = (
        f"column {target_id} (target)" if active and name == "selected_logp" else "all live columns"
    )
    exact_zero = name in ("selected_logp", "entropy") and not active
    state = "active" if active else "inactive"
    tolerance = "exactly +0.0 required" if exact_zero else f"tolerance {bounds[row]:.4g} ulp"
    return [
        (
            "worst",
            f"{name}, row {row} ({state}), {column}; rows out of tolerance: "
            f"{np.flatnonzero(bad).tolist()}",
        ),
        ("observed", format_value(value[row])),
        ("expected", f"{format_value(exact[row])} [{expected_name}]"),
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


def check_bitwise(
    prop: str,
    case: LogprobCase,
    backend_id: str,
    first: Outputs,
    second: Outputs,
    *,
    labels: tuple[str, str],
) -> None:
    """Raise unless both runs' outputs have identical fp32 bits, row for row."""
    pairs = [("selected_logp", first.selected, second.selected)]
    if first.lse is not None and second.lse is not None:
        pairs.append(("lse", first.lse, second.lse))
    if first.entropy is not None and second.entropy is not None:
        pairs.append(("entropy", first.entropy, second.entropy))
    for name, a, b in pairs:
        differ = np.flatnonzero(_bits(a) != _bits(b))
        if differ.size:
            row = int(differ[0])
            ulps = float(_ulps(a[row : row + 1], b[row : row + 1])[0])
            raise violation(
                prop,
                case,
                backend_id,
                [
                    ("worst", f"{name}, row {row}; {differ.size} rows differ: {differ.tolist()}"),
                    (labels[0], format_value(a[row])),
                    (labels[1], format_value(b[row])),
                    ("error", f"{ulps:.4g} ulp; bitwise equality required"),
                ],
            )


def _bits(values: Floats) -> npt.NDArray[np.uint32]:
    return np.asarray(values, dtype=np.float32).view(np.uint32)


def select_rows(outputs: Outputs, rows: Any) -> Outputs:
    """The outputs of ``rows`` only (in that order)."""
    lse = None if outputs.lse is None else outputs.lse[rows]
    entropy = None if outputs.entropy is None else outputs.entropy[rows]
    return Outputs(outputs.selected[rows], lse, outputs.results, entropy)


def sub_batch(case: LogprobCase, rows: Any) -> LogprobCase:
    """The case made of ``rows`` only (in that order, repeats allowed)."""
    contract = case.contract
    mask = contract.mask.active_mask
    sub_mask = MaskSpec(
        len(rows), None if mask is None else mask[rows], ignore_index=contract.mask.ignore_index
    )
    sub_contract = dataclasses.replace(contract, mask=sub_mask)
    if isinstance(case, HiddenCase):
        return HiddenCase(
            sub_contract,
            case.logits[rows],
            case.targets[rows],
            hidden=case.hidden[rows],
            weight=case.weight,
            bias=case.bias,
        )
    return LogprobCase(sub_contract, case.logits[rows], case.targets[rows])


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
        temperature=case.contract.temperature,
    )
    finite = [np.nan_to_num(np.asarray(v, np.float64), nan=0.0) for v in (selected, lse, entropy)]
    return finite[0], finite[1], finite[2]


def allowed_error(case: LogprobCase, selected: Floats, lse: Floats) -> tuple[Floats, Floats]:
    """The tolerance table's bounds ``(selected, lse)`` at the exact values of ``case``."""
    tol = suite_tolerance(case.contract)
    row_max = row_max_of_z(case)
    finite_lse = np.where(np.isfinite(lse), lse, 0.0)
    finite_sel = np.where(np.isfinite(selected), selected, 0.0)
    return (
        tol.selected_bound(finite_sel, finite_lse, row_max=row_max),
        tol.lse_bound(finite_lse, row_max=row_max),
    )


def entropy_error(case: LogprobCase, entropy: Floats, lse: Floats) -> Floats:
    """The tolerance table's entropy bound at the exact ``entropy`` and ``lse`` of ``case``."""
    finite_h = np.where(np.isfinite(entropy), entropy, 0.0)
    finite_lse = np.where(np.isfinite(lse), lse, 0.0)
    row_max = row_max_of_z(case)
    usable = np.isfinite(lse) & np.isfinite(row_max)
    bound = suite_tolerance(case.contract).entropy_bound(
        finite_h, lse=np.where(usable, finite_lse, 0.0), row_max=np.where(usable, row_max, 0.0)
    )
    return np.asarray(bound, dtype=np.float64)


def exact_outputs(case: LogprobCase) -> tuple[Floats, Floats]:
    """The exact oracle's ``(selected_logp, lse)`` for ``case`` (on ``z = x / T``)."""
    return exact_selected_logprob(
        case.logits,
        case.targets,
        active_mask=case.active,
        real_vocab_size=case.contract.sharding.real_vocab_size,
        temperature=case.contract.temperature,
    )


def exact_entropy_of(case: LogprobCase) -> Floats:
    """The exact oracle's entropy of every row of ``case`` (0.0 on inactive rows)."""
    return exact_entropy(
        case.logits,
        active_mask=case.active,
        real_vocab_size=case.contract.sharding.real_vocab_size,
        temperature=case.contract.temperature,
    )


def cases_for(backend: Any, **filters: Any) -> st.SearchStrategy[LogprobCase]:
    """Cases from the contracts ``backend`` claims; skips the test if it claims none such."""
    special_values = filters.pop("special_values", False)
    logit_kinds = filters.pop("logit_kinds", None)
    try:
        contract_strategy = contracts(capability=backend.capability, **filters)
    except InvalidArgument as error:
        pytest.skip(f"{backend.backend_id} claims no contract of this kind: {error}")
    return cases(contract_strategy, special_values=special_values, logit_kinds=logit_kinds)


def draw_case(data: Any, backend: Any, suite: Any, **filters: Any) -> LogprobCase:
    """Draw one case for ``backend`` (labelled ``case``) and count the example."""
    case: LogprobCase = data.draw(cases_for(backend, **filters), label="case")
    suite.stats.example(backend.backend_id)
    return case
