"""Case-level determinism checks, bitwise: replication, run to run, batch, across TP degrees."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from tp_logprob.contract import DeterminismScope, ShardingSpec
from tp_logprob.errors import LogprobContractError
from tp_logprob.properties._harness import (
    allowed_error,
    check_bitwise,
    check_close,
    entropy_error,
    exact_entropy_of,
    exact_outputs,
    execute,
    input_error,
    select_rows,
    sub_batch,
)
from tp_logprob.properties._params import CheckInputError
from tp_logprob.properties._report import SuiteStats
from tp_logprob.strategies import LogprobCase


def check_replicated(
    backend: Any, case: LogprobCase, params: Mapping[str, Any], *, stats: SuiteStats | None = None
) -> None:
    """Every rank returns the same bits, NaN payloads and signed zeros included."""
    outputs = execute(backend, case)  # raises the violation if ranks differ
    assert len(outputs.results) == case.contract.sharding.tp_world_size


def check_run_to_run(
    backend: Any, case: LogprobCase, params: Mapping[str, Any], *, stats: SuiteStats | None = None
) -> None:
    """Running the same case twice gives the same bits."""
    check_bitwise(
        "run-to-run determinism: two runs of one case differ",
        case,
        backend.backend_id,
        execute(backend, case),
        execute(backend, case),
        labels=("first run", "second run"),
    )


def check_batch_invariance(
    backend: Any, case: LogprobCase, params: Mapping[str, Any], *, stats: SuiteStats | None = None
) -> None:
    """Rows ``params["rows"]`` (in that order, repeats allowed) run as their own batch
    give the bits they had in the whole batch."""
    rows = np.asarray(params["rows"]).tolist()
    if not rows or not all(0 <= row < case.contract.num_tokens for row in rows):
        raise CheckInputError(f"params.rows={rows!r}: not rows of the case")
    check_bitwise(
        f"batch invariance: rows {rows} run as their own batch give other bits",
        case,
        backend.backend_id,
        select_rows(execute(backend, case), rows),
        execute(backend, sub_batch(case, rows)),
        labels=("in the batch", "rearranged"),
    )


def check_tp_consistency(
    backend: Any, case: LogprobCase, params: Mapping[str, Any], *, stats: SuiteStats | None = None
) -> None:
    """The layout ``params["vocab_shard_bounds"]`` (seen by ``params["tp_rank"]``):
    bitwise for cross_tp_bitwise, else within tolerance."""
    contract = case.contract
    sharding = contract.sharding
    bounds = tuple(tuple(pair) for pair in params["vocab_shard_bounds"])
    try:
        relaid = ShardingSpec(
            params["tp_rank"],
            len(bounds),
            bounds,
            sharding.real_vocab_size,
            sharding.padded_vocab_size,
        )
    except LogprobContractError as error:
        raise CheckInputError(f"params: not a layout of the case's vocabulary: {error}") from None
    other_contract = dataclasses.replace(contract, sharding=relaid)
    other = case.replace(contract=other_contract)
    first, second = execute(backend, case), execute(backend, other)
    layouts = (
        f"tp={sharding.tp_world_size} {list(sharding.vocab_shard_bounds)}",
        f"tp={relaid.tp_world_size} {list(relaid.vocab_shard_bounds)}",
    )
    if contract.reduction.determinism_scope is DeterminismScope.CROSS_TP_BITWISE:
        check_bitwise(
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
    check_close(
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
