"""Judging a processed logprob (a contract with a support): the backend's own support,
whether it may hold it, and the exact outputs on it.

``docs/semantics.md``, "Processed logprobs". Min-p and top-p compare masses, and
any fp32 computation of them may move a token that lies within its rounding error
of a boundary, so the suite does not demand the exact support. It rebuilds the
support the backend used from what the op returned (:func:`backend_support`):
every live column with ``z >= support_threshold``, ``z = fp32(x) / fp32(T)``
formed as numpy forms it, or the replayed mask's kept ids. :func:`judge_support`
requires that support to be admissible under the error model of
:func:`support_margins_of` (the model valid for sums in any order, so a
third-party backend is held to what any fp32 implementation may do): every
certainly-in token kept, no certainly-out token, an upper set of ``z`` closed under
ties, ``support_size = |S|`` and the threshold the least kept ``z``. Every output
is then judged exactly on that support (:func:`expect_processed_close`,
:func:`judge_processed_gradient`): the tolerance table of the problem whose
columns outside ``S`` are ``-inf`` for ``selected_logp``, ``support_lse`` and the
entropy, the table of the whole row for ``lse``.

A fused LM-head backend forms its own ``x``, within the dot-product bound of the
oracle's: a replayed mask adds that room on ``S``; a recomputed support is judged
on operands whose products are exact (the threshold is then read on the same
``x``), since an error in ``x`` moves tokens across a boundary that no margin of
the support covers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.contract import LogprobContract
from tp_logprob.judging.bounds import MIN_ONLINE_BLOCK
from tp_logprob.judging.gradients import Backward, gradient_bound, judge_gradient
from tp_logprob.judging.measuring import (
    Compared,
    ErrorTally,
    allowed_error,
    entropy_error,
    expect_within,
    input_error,
    working_scale,
)
from tp_logprob.judging.outputs import Floats, Outputs, select_rows
from tp_logprob.judging.violation import format_value, row_list, violation
from tp_logprob.oracle import (
    SupportClassification,
    SupportMargins,
    admissible_support,
    apply_temperature,
    classify_support,
    exact_processed_entropy,
    exact_processed_entropy_grad,
    exact_processed_logprob,
    exact_processed_logprob_grad,
    fused_extra_bounds,
    support_margins,
    support_masked_logits,
)
from tp_logprob.row_groups import RowGroup, row_groups
from tp_logprob.strategies import HiddenCase, LogprobCase
from tp_logprob.support import SupportMode, SupportSpec

__all__ = [
    "BackendSupport",
    "ProcessedExpected",
    "backend_support",
    "expect_processed_close",
    "group_case",
    "judge_processed",
    "judge_processed_backward",
    "judge_processed_gradient",
    "judge_support",
    "masked_case",
    "processed_comparisons",
    "processed_expected",
    "row_cases",
    "support_margins_of",
    "support_notes",
]

Bools = npt.NDArray[np.bool_]
Notes = Callable[[int], list[tuple[str, str]]]

_SHOWN_IDS = 8


def support_margins_of(contract: LogprobContract) -> SupportMargins:
    """The support's error bounds for ``contract``: its dtype, live vocabulary, shard count
    and widest live shard, sums in any order, and the rescalings the tolerance table
    allows (:data:`~tp_logprob.judging.bounds.MIN_ONLINE_BLOCK`)."""
    sharding = contract.sharding
    widest = max(
        end - start
        for start, end in (sharding.live_bounds(r) for r in range(sharding.tp_world_size))
    )
    return support_margins(
        contract.dtype.value,
        sharding.real_vocab_size,
        num_shards=sharding.tp_world_size,
        max_shard_size=max(widest, 1),
        rescales=math.ceil(widest / MIN_ONLINE_BLOCK) + 1,
    )


@dataclass(frozen=True)
class BackendSupport:
    """The support a backend used: bool ``mask [N, padded]`` (padding always False) and
    ``defined [N]`` (False where a recomputed support is undefined: a NaN or ``+inf``
    live ``z``, or no finite one). ``classification`` is the oracle's for a recomputed
    support once :func:`judge_support` has judged it."""

    mask: Bools
    defined: Bools
    classification: SupportClassification | None = None


def _live_z(case: LogprobCase) -> Floats:
    """``z`` of the live columns, each row at its own temperature (a greedy row's is 1)."""
    contract = case.contract
    real = contract.sharding.real_vocab_size
    if not contract.heterogeneous:
        return apply_temperature(case.logits[:, :real], contract.batch_temperature)
    z = np.empty((contract.num_tokens, real))
    for group in row_groups(contract):
        rows = group.rows
        z[rows] = apply_temperature(case.logits[rows, :real], group.contract.batch_temperature)
    return z


def backend_support(case: LogprobCase, outputs: Outputs) -> BackendSupport:
    """The support of ``outputs`` (a run of ``case``): the replayed mask, or every live column
    with ``z >= support_threshold``."""
    contract = case.contract
    support = _spec(contract)
    rows, padded = contract.num_tokens, contract.sharding.padded_vocab_size
    if support.mode is SupportMode.REPLAYED_MASK:
        return BackendSupport(support.dense(padded), np.ones(rows, dtype=np.bool_))
    if outputs.support_threshold is None:
        raise AssertionError("a recomputed support's run without support_threshold")
    z = _live_z(case)
    mask = np.zeros((rows, padded), dtype=np.bool_)
    with np.errstate(invalid="ignore"):
        mask[:, : z.shape[1]] = z >= outputs.support_threshold[:, None]
        defined = ~np.isnan(z).any(axis=1) & ~np.isposinf(z).any(axis=1)
        defined &= np.isfinite(z).any(axis=1)
    return BackendSupport(mask, np.asarray(defined, dtype=np.bool_))


def _spec(contract: LogprobContract) -> SupportSpec:
    if contract.support is None:
        raise AssertionError(f"contract without a support: {contract.describe()}")
    return contract.support


def judge_support(
    prop: str, case: LogprobCase, backend_id: str, outputs: Outputs
) -> BackendSupport:
    """The backend's support, after checking it on every row (inactive ones too): admissible
    (recomputed), the threshold the least kept ``z`` (NaN exactly where the support is
    undefined) and ``support_size`` its size."""
    contract = case.contract
    spec = _spec(contract)
    found = backend_support(case, outputs)
    if spec.mode is SupportMode.SAMPLING_PARAMS:
        top_k, top_p, min_p = spec.batch_rules()
        classification = classify_support(
            case.logits,
            margins=support_margins_of(contract),
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            real_vocab_size=contract.sharding.real_vocab_size,
            temperature=contract.batch_temperature,
        )
        found = dataclasses.replace(found, classification=classification)
        _check_admissible(prop, case, backend_id, outputs, found)
        _check_threshold(prop, case, backend_id, outputs, found)
    size = found.mask.sum(axis=1)
    assert outputs.support_size is not None
    wrong = np.flatnonzero(outputs.support_size != size)
    if wrong.size:
        row = int(wrong[0])
        raise violation(
            f"{prop}: support_size is not the size of the support",
            case,
            backend_id,
            [
                ("worst", f"row {row}; rows {row_list(wrong)}"),
                ("observed", f"support_size {int(outputs.support_size[row])}"),
                ("expected", f"{int(size[row])} (|S| of the support the backend used)"),
                *support_notes(case, found, outputs)(row),
            ],
        )
    return found


def _check_admissible(
    prop: str, case: LogprobCase, backend_id: str, outputs: Outputs, found: BackendSupport
) -> None:
    classification = found.classification
    assert classification is not None
    problems = admissible_support(classification, found.mask)
    if not problems:
        return
    rows = case.contract.num_tokens
    first = next(
        row
        for row in range(rows)
        if admissible_support(classification, found.mask, active_mask=np.arange(rows) == row)
    )
    raise violation(
        f"{prop}: the backend's support is not admissible",
        case,
        backend_id,
        [
            *(("problem", problem) for problem in problems[:3]),
            *support_notes(case, found, outputs)(first),
        ],
    )


def _check_threshold(
    prop: str, case: LogprobCase, backend_id: str, outputs: Outputs, found: BackendSupport
) -> None:
    tau = outputs.support_threshold
    assert tau is not None
    z = _live_z(case)
    kept = found.mask[:, : z.shape[1]]
    least = np.where(kept, z, np.inf).min(axis=1, initial=np.inf)
    with np.errstate(invalid="ignore"):
        wrong = (~found.defined & ~np.isnan(tau)) | (found.defined & np.isnan(tau))
        wrong |= found.defined & kept.any(axis=1) & (tau != least)
    if not wrong.any():
        return
    row = int(np.flatnonzero(wrong)[0])
    undefined = "NaN (the support is undefined)"
    expected = undefined if not found.defined[row] else f"{float(least[row])!r} (the least kept z)"
    raise violation(
        f"{prop}: support_threshold is not the least kept z",
        case,
        backend_id,
        [
            ("worst", f"row {row}; rows {row_list(np.flatnonzero(wrong))}"),
            ("observed", f"support_threshold {float(tau[row])!r}"),
            ("expected", expected),
            *support_notes(case, found, outputs)(row),
        ],
    )


def support_notes(case: LogprobCase, found: BackendSupport, outputs: Outputs) -> Notes:
    """Lines for a report on ``row``: the support's rule, what the backend kept, and the token
    that decided it (the least kept and the largest dropped)."""
    spec = _spec(case.contract)
    z = _live_z(case)

    def notes(row: int) -> list[tuple[str, str]]:
        kept = found.mask[row, : z.shape[1]]
        if spec.mode is SupportMode.REPLAYED_MASK:
            ids = spec.kept_row(row).tolist()
            shown = ids if len(ids) <= _SHOWN_IDS else [*ids[:_SHOWN_IDS], "..."]
            return [("support", f"replayed mask: row {row} keeps {len(ids)} ids {shown}")]
        if not found.defined[row]:
            return [("support", f"{spec.rules()}: undefined for row {row} (NaN/+inf live z)")]
        tau = None if outputs.support_threshold is None else float(outputs.support_threshold[row])
        text = f"{spec.rules()}: the backend kept |S| = {int(kept.sum())} (z >= {tau!r})"
        if found.classification is not None:
            exact = found.classification.exact
            border = int(found.classification.borderline[row].sum())
            text += (
                f"; the exact rules |S| = {int(exact.size[row])} "
                f"(z >= {float(exact.threshold[row])!r}), "
                f"{border} borderline"
            )
        return [("support", text), ("boundary", _boundary(z[row], kept))]

    return notes


def _boundary(z: Floats, kept: Bools) -> str:
    """The least kept token and the largest dropped one: where the support was decided."""
    parts = []
    with np.errstate(invalid="ignore"):
        if kept.any():
            v = int(np.flatnonzero(kept)[np.argmin(z[kept])])
            parts.append(f"least kept token {v} (z={float(z[v])!r})")
        dropped = ~kept & ~np.isnan(z)
        if dropped.any():
            u = int(np.flatnonzero(dropped)[np.argmax(z[dropped])])
            parts.append(f"largest dropped token {u} (z={float(z[u])!r})")
    return "; ".join(parts) or "no live column"


def masked_case(case: LogprobCase, found: BackendSupport) -> LogprobCase:
    """The problem the backend solves on ``S``: the case's logits with every live column
    outside ``S`` at ``-inf`` and no support (what the tolerance table is read on)."""
    real = case.contract.sharding.real_vocab_size
    logits = support_masked_logits(case.logits, found.mask, real_vocab_size=real)
    contract = dataclasses.replace(case.contract, support=None)
    return LogprobCase(contract, logits, case.targets)


@dataclass(frozen=True)
class ProcessedExpected:
    """The exact outputs on a support, correctly rounded (``entropy`` None unless exported)."""

    selected: Floats
    support_lse: Floats
    lse: Floats
    entropy: Floats | None


def processed_expected(case: LogprobCase, found: BackendSupport) -> ProcessedExpected:
    """The exact oracle's outputs of ``case`` on the support ``found``."""
    contract = case.contract
    common: dict[str, Any] = {
        "active_mask": case.active,
        "real_vocab_size": contract.sharding.real_vocab_size,
        "temperature": contract.batch_temperature,
        "defined": found.defined,
    }
    selected, support_lse, lse = exact_processed_logprob(
        case.logits, case.targets, found.mask, **common
    )
    entropy = None
    if contract.export_entropy:
        entropy = exact_processed_entropy(case.logits, found.mask, **common)
    return ProcessedExpected(selected, support_lse, lse, entropy)


def _support_room(case: LogprobCase, found: BackendSupport) -> tuple[Floats, Floats, Floats]:
    """Extra ``(selected_logp, support_lse, entropy)`` room for a fused backend's own ``x``
    on ``S`` (:func:`~tp_logprob.judging.measuring.input_error` on the support's columns)."""
    rows = case.contract.num_tokens
    if not isinstance(case, HiddenCase):
        zero = np.zeros(rows)
        return zero, zero, zero
    live = found.mask[:, : case.contract.sharding.real_vocab_size]
    lse, selected, entropy = fused_extra_bounds(
        np.where(live, case.exact_logits, 0.0),
        np.where(live, case.dot_bound, 0.0),
        case.targets,
        temperature=case.contract.batch_temperature,
    )
    rooms = [np.nan_to_num(np.asarray(v, np.float64), nan=0.0) for v in (selected, lse, entropy)]
    return rooms[0], rooms[1], rooms[2]


def expect_processed_close(
    prop: str,
    case: LogprobCase,
    backend_id: str,
    outputs: Outputs,
    found: BackendSupport,
    stats: ErrorTally | None = None,
    *,
    count_ulps: bool = True,
) -> None:
    """Raise unless ``selected_logp``, ``support_lse``, ``lse`` and entropy are within the
    tolerance table of the exact values on the support ``found`` (``support_lse``, ``lse``
    and entropy where ``outputs`` holds them)."""
    expect_within(
        prop,
        case,
        backend_id,
        processed_comparisons(case, outputs, found),
        expected_name="exact on the backend's support",
        stats=stats,
        count_ulps=count_ulps,
        notes=support_notes(case, found, outputs),
    )


def processed_comparisons(
    case: LogprobCase, outputs: Outputs, found: BackendSupport
) -> list[Compared]:
    """The outputs of ``case`` (one set of sampling parameters) beside their exact values on
    the support ``found`` and the tolerance table's bounds, field by field."""
    expected = processed_expected(case, found)
    masked = masked_case(case, found)
    active = case.active
    sel_bound, s_lse_bound = allowed_error(masked, expected.selected, expected.support_lse)
    sel_room, s_lse_room, entropy_room = _support_room(case, found)
    s_scale = working_scale(masked, expected.support_lse)
    with np.errstate(invalid="ignore"):
        sel_scale = np.fmax(np.abs(expected.selected), s_scale)
    fields = [
        Compared(
            "selected_logp",
            outputs.selected,
            expected.selected,
            sel_bound + sel_room,
            active,
            sel_scale,
            zero_inactive=True,
        )
    ]
    if outputs.support_lse is not None:
        fields.append(
            Compared(
                "support_lse",
                outputs.support_lse,
                expected.support_lse,
                s_lse_bound + s_lse_room,
                np.ones_like(active),
                s_scale,
            )
        )
    if outputs.lse is not None:
        _, lse_bound = allowed_error(case, np.zeros_like(expected.lse), expected.lse)
        fields.append(
            Compared(
                "lse",
                outputs.lse,
                expected.lse,
                lse_bound + input_error(case)[1],
                np.ones_like(active),
                working_scale(case, expected.lse),
            )
        )
    if outputs.entropy is not None and expected.entropy is not None:
        bound = entropy_error(masked, expected.entropy, expected.support_lse) + entropy_room
        with np.errstate(invalid="ignore"):
            scale = np.fmax(np.abs(expected.entropy), s_scale)
        fields.append(
            Compared(
                "entropy",
                outputs.entropy,
                expected.entropy,
                bound,
                active,
                scale,
                zero_inactive=True,
            )
        )
    return fields


def judge_processed(
    prop: str,
    case: LogprobCase,
    backend_id: str,
    outputs: Outputs,
    stats: ErrorTally | None = None,
    *,
    count_ulps: bool = True,
) -> None:
    """A run's support must be admissible and every output of it exact on that support
    within the tolerance table.

    A heterogeneous batch (the backend ran the engine's mixed batch whole) is judged group
    by group of rows that share their parameters (:func:`row_cases`), every output once."""
    headline = "output outside the tolerance table of the exact values on the backend's support"
    parts = row_cases(prop, case)
    if len(parts) == 1 and parts[0][2] is None:
        found = judge_support(f"{prop}: support", case, backend_id, outputs)
        expect_processed_close(
            f"{prop}: {headline}", case, backend_id, outputs, found, stats,
            count_ulps=count_ulps,
        )  # fmt: skip
        return
    compared: list[tuple[npt.NDArray[np.int64], list[Compared], Notes]] = []
    for label, part, rows in parts:
        assert rows is not None
        part_outputs = select_rows(outputs, rows)
        found = judge_support(f"{label}: support", part, backend_id, part_outputs)
        compared.append(
            (
                rows,
                processed_comparisons(part, part_outputs, found),
                support_notes(part, found, part_outputs),
            )
        )
    fields, notes = _in_batch_order(compared, case.contract.num_tokens)
    expect_within(
        f"{prop}: {headline}",
        case,
        backend_id,
        fields,
        expected_name="exact on the backend's support",
        stats=stats,
        count_ulps=count_ulps,
        notes=notes,
    )


def _in_batch_order(
    compared: list[tuple[npt.NDArray[np.int64], list[Compared], Notes]], num_tokens: int
) -> tuple[list[Compared], Notes]:
    """The row groups' comparisons joined into one per field, rows in batch order, and notes
    that read a batch row's group's: each output is judged once, on the whole batch."""
    group_of = np.zeros(num_tokens, dtype=np.int64)
    local = np.zeros(num_tokens, dtype=np.int64)
    for index, (rows, _, _) in enumerate(compared):
        group_of[rows] = index
        local[rows] = np.arange(rows.size)
    order = np.concatenate([rows for rows, _, _ in compared])

    def placed(position: int, name: str) -> Any:
        values = np.concatenate(
            [np.asarray(getattr(part[position], name)) for _, part, _ in compared]
        )
        out = np.empty_like(values)
        out[order] = values
        return out

    def joined(position: int) -> Compared:
        first = compared[0][1][position]
        return Compared(
            first.name,
            placed(position, "value"),
            placed(position, "exact"),
            placed(position, "bound"),
            placed(position, "rows"),
            placed(position, "scale"),
            zero_inactive=first.zero_inactive,
        )

    def notes(row: int) -> list[tuple[str, str]]:
        rows, _, group_notes = compared[int(group_of[row])]
        return [("row group", f"rows {rows.tolist()}"), *group_notes(int(local[row]))]

    return [joined(position) for position in range(len(compared[0][1]))], notes


def row_cases(
    prop: str, case: LogprobCase
) -> list[tuple[str, LogprobCase, npt.NDArray[np.int64] | None]]:
    """``(label, case, rows)`` to judge: the case itself (rows None) when it has one set of
    sampling parameters, else one case per group of rows that share theirs
    (:func:`~tp_logprob.row_groups.row_groups`), labelled with the group's rows of the batch.
    Every output of a row depends on that row alone (``docs/semantics.md``, "Heterogeneous
    batches"), so each group is judged as a batch of its own."""
    contract = case.contract
    if not contract.heterogeneous:
        return [(prop, case, None)]
    parts: list[tuple[str, LogprobCase, npt.NDArray[np.int64] | None]] = []
    for group in row_groups(contract):
        rows = group.rows
        part = group_case(case, group)
        parts.append((f"{prop} (rows {rows.tolist()}: {group.contract.describe()})", part, rows))
    return parts


def group_case(case: LogprobCase, group: RowGroup) -> LogprobCase:
    """``case``'s rows of ``group`` under the group's contract; a fused case stays one (its
    hidden rows, its weight, so its dot-product error bound)."""
    rows = group.rows
    changes: dict[str, Any] = {
        "contract": group.contract,
        "logits": case.logits[rows],
        "targets": case.targets[rows],
    }
    if isinstance(case, HiddenCase):
        changes["hidden"] = case.hidden[rows]
    return case.replace(**changes)


def judge_processed_backward(
    prop: str,
    case: LogprobCase,
    backend_id: str,
    run: Backward,
    stats: ErrorTally | None = None,
) -> None:
    """:func:`judge_processed_gradient` of ``run`` on the support the run used, group by group
    of rows for a heterogeneous batch (:func:`row_cases`)."""
    for label, part, rows in row_cases(prop, case):
        part_run = run if rows is None else _run_rows(run, rows)
        found = backend_support(part, part_run.outputs)
        judge_processed_gradient(label, part, backend_id, part_run, found, stats)


def _run_rows(run: Backward, rows: npt.NDArray[np.int64]) -> Backward:
    """``run`` restricted to ``rows``: their outputs, gradient rows and upstream weights."""
    return Backward(
        select_rows(run.outputs, rows),
        run.gradient[rows],
        run.weights[rows],
        run.entropy_weights[rows],
    )


def judge_processed_gradient(
    prop: str,
    case: LogprobCase,
    backend_id: str,
    run: Backward,
    found: BackendSupport,
    stats: ErrorTally | None = None,
) -> None:
    """Raise unless ``run``'s gradient is exactly 0 outside the support ``found`` and within
    the gradient bounds of the exact one on it (see
    :func:`~tp_logprob.suite.expect.expect_processed_gradient`)."""
    contract = case.contract
    common: dict[str, Any] = {
        "active_mask": case.active,
        "real_vocab_size": contract.sharding.real_vocab_size,
        "temperature": contract.batch_temperature,
        "defined": found.defined,
    }
    exact = exact_processed_logprob_grad(case.logits, case.targets, found.mask, **common)
    entropy_grad = None
    if contract.export_entropy:
        entropy_grad = exact_processed_entropy_grad(case.logits, found.mask, **common)
    outside = ~found.mask & found.defined[:, None]
    notes = support_notes(case, found, run.outputs)
    _expect_zero_outside(prop, case, backend_id, run.gradient, outside, notes)
    masked = masked_case(case, found)
    bound = gradient_bound(masked, exact, entropy_grad, (run.weights, run.entropy_weights))
    judge_gradient(
        prop,
        case,
        backend_id,
        run,
        exact,
        entropy_grad,
        np.where(outside, 0.0, bound),
        stats,
        notes=notes,
    )


def _expect_zero_outside(
    prop: str, case: LogprobCase, backend_id: str, gradient: Floats, outside: Bools, notes: Notes
) -> None:
    """Every column outside ``S`` of an active row (the target's, padding) has gradient 0."""
    leak = outside & case.active[:, None] & (gradient != 0.0)
    if not leak.any():
        return
    row, column = (int(k) for k in np.argwhere(leak)[0])
    real = case.contract.sharding.real_vocab_size
    what = (
        "padding column"
        if column >= real
        else "the target's column"
        if column == int(case.targets[row])
        else "a live column"
    )
    raise violation(
        f"{prop}: the gradient is not 0 outside the support",
        case,
        backend_id,
        [
            ("worst", f"row {row}, column {column} ({what}, outside S); {int(leak.sum())} in all"),
            ("observed", format_value(gradient[row, column])),
            ("expected", "0.0 exactly (S is held fixed)"),
            *notes(row),
        ],
    )
