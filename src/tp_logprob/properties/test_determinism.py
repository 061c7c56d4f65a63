"""Determinism claims, checked bitwise: replication, run to run, batch, and across TP degrees."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tp_logprob.contract import DeterminismScope
from tp_logprob.judging.expected import exact_entropy_of, exact_outputs
from tp_logprob.judging.measuring import (
    allowed_error,
    entropy_error,
    expect_bitwise,
    expect_close,
    input_error,
)
from tp_logprob.judging.violation import PropertyInputError
from tp_logprob.strategies import LogprobCase
from tp_logprob.suite.applicability import (
    BATCH_INVARIANT,
    LOGITS_INPUT,
    SEVERAL_LAYOUTS,
    applies_to,
)
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.case_kinds import (
    check_across_layouts,
    relaid,
)
from tp_logprob.suite.draws import (
    batch_rows,
    draw_case,
    draw_positions,
)
from tp_logprob.suite.params import ArraySpec, any_length
from tp_logprob.suite.profiles import scaled
from tp_logprob.suite.property import suite_property
from tp_logprob.suite.running import execute, select_rows, sub_batch
from tp_logprob.suite.session import Suite
from tp_logprob.suite.summary import SuiteStats


@suite_property("replicated")
def replicated(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """Every rank returns the same bits, NaN payloads and signed zeros included."""
    outputs = execute(backend, case)  # raises the violation if ranks differ
    assert len(outputs.results) == case.contract.sharding.tp_world_size


@applies_to(LOGITS_INPUT)
@given(data=st.data())
def test_outputs_replicated_across_ranks(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """Every rank returns the same bits, NaN payloads and signed zeros included."""
    backend = tp_logprob_backend
    case = draw_case(data, backend, tp_logprob_suite, special_values=True)
    replicated.run(backend, case)


@suite_property("run_to_run")
def run_to_run(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """Running the same case twice gives the same bits."""
    expect_bitwise(
        "run-to-run determinism: two runs of one case differ",
        case,
        backend.backend_id,
        execute(backend, case),
        execute(backend, case),
        labels=("first run", "second run"),
    )


@applies_to(LOGITS_INPUT)
@given(data=st.data())
def test_run_to_run_bitwise(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """Running the same case twice gives the same bits."""
    backend = tp_logprob_backend
    case = draw_case(data, backend, tp_logprob_suite)
    run_to_run.run(backend, case)


@suite_property("batch_invariance", arrays={"rows": ArraySpec("int64", any_length)})
def batch_invariance(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """Rows ``params["rows"]`` (in that order, repeats allowed) run as their own batch
    give the bits they had in the whole batch."""
    rows = np.asarray(params["rows"]).tolist()
    if not rows or not all(0 <= row < case.contract.num_tokens for row in rows):
        raise PropertyInputError(f"params.rows={rows!r}: not rows of the case")
    expect_bitwise(
        f"batch invariance: rows {rows} run as their own batch give other bits",
        case,
        backend.backend_id,
        select_rows(execute(backend, case), rows),
        execute(backend, sub_batch(case, rows)),
        labels=("in the batch", "rearranged"),
    )


@applies_to(LOGITS_INPUT, BATCH_INVARIANT)
@given(data=st.data())
def test_batch_invariance(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """A row's bits do not depend on the other rows, their order, or N."""
    backend = tp_logprob_backend
    case = draw_case(data, backend, tp_logprob_suite)
    rows = data.draw(batch_rows(case.contract.num_tokens), label="rows of the second batch")
    batch_invariance.run(backend, case, {"rows": rows})


def position_rows(row: int, length: int, num_tokens: int) -> list[int]:
    """The rows of a ``length``-row batch that holds ``row`` at every position ``i`` with
    ``i % 3 != 2`` (odd and even ones) and at the last; other rows of the case fill the rest."""
    others = [r for r in range(num_tokens) if r != row] or [row]
    return [
        row if i % 3 != 2 or i == length - 1 else others[(i // 3) % len(others)]
        for i in range(length)
    ]


@suite_property("row_positions", params={"row": "int", "length": "int"})
def row_positions(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """Row ``params["row"]`` at many positions of a ``params["length"]``-row batch
    (:func:`position_rows`): every copy has the bits of the row run alone. A BLAS matrix
    product or a tiled kernel can treat a row by its position in a register block or tile."""
    row, length = params["row"], params["length"]
    if not (0 <= row < case.contract.num_tokens and 1 <= length <= 4096):
        raise PropertyInputError(f"params: row {row} / length {length} do not fit the case")
    rows = position_rows(row, length, case.contract.num_tokens)
    copies = [i for i, chosen in enumerate(rows) if chosen == row]
    alone = execute(backend, sub_batch(case, [row]))
    placed = execute(backend, sub_batch(case, rows))
    expect_bitwise(
        f"row positions: row {row} at positions {copies} of a {length}-row batch gives "
        "other bits than alone",
        case,
        backend.backend_id,
        select_rows(alone, [0] * len(copies)),
        select_rows(placed, copies),
        labels=("alone", "in the batch"),
    )


@applies_to(LOGITS_INPUT, BATCH_INVARIANT)
@scaled(0.4)
@given(data=st.data())
def test_row_positions(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """One row at odd and even positions, inside and at the end of tiles: its own bits."""
    backend = tp_logprob_backend
    case = draw_case(data, backend, tp_logprob_suite)
    params = draw_positions(data, case, backend)
    row_positions.run(backend, case, params)


@suite_property("tp_consistency", params={"tp_rank": "int", "vocab_shard_bounds": "bounds"})
def tp_consistency(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """The layout ``params["vocab_shard_bounds"]`` (seen by ``params["tp_rank"]``):
    bitwise for cross_tp_bitwise, else within tolerance."""
    contract = case.contract
    other, layouts = relaid(case, params)
    first, second = execute(backend, case), execute(backend, other)
    if contract.reduction.determinism_scope.satisfies(DeterminismScope.CROSS_TP_BITWISE):
        expect_bitwise(
            f"cross-TP bitwise: layouts {layouts[0]} and {layouts[1]} differ",
            case,
            backend.backend_id,
            first,
            second,
            labels=layouts,
        )
        return
    selected, lse = exact_outputs(case)
    first_selected_error, first_lse_error = allowed_error(case, selected, lse)
    entropy_bound = entropy_error(case, exact_entropy_of(case), lse)
    # A fused backend's logits are off the exact ones in both runs: twice the room.
    extra_selected, extra_lse, extra_entropy = (2.0 * extra for extra in input_error(case))
    expect_close(
        f"TP consistency: layout {layouts[1]} is out of tolerance of {layouts[0]}",
        other,
        backend.backend_id,
        second,
        first.selected,
        lse if first.lse is None else first.lse,
        expected_name=layouts[0],
        extra_selected=first_selected_error + extra_selected,
        extra_lse=first_lse_error + extra_lse,
        expected_entropy=first.entropy,
        extra_entropy=entropy_bound + extra_entropy,
        count_ulps=False,
        inactive_zero=False,
    )


@applies_to(LOGITS_INPUT, SEVERAL_LAYOUTS)
@scaled(0.6)
@given(data=st.data())
def test_tp_consistency(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """Another TP degree and shard layout: bitwise for cross_tp_bitwise, else within tolerance."""
    check_across_layouts(data, tp_logprob_backend, tp_logprob_suite, "logits", tp_consistency)
