"""Heterogeneous engine batches: a case's rows with their own sampling parameters.

A rollout engine's scheduler batches requests that each bring their own
temperature and top-k / top-p / min-p, greedy requests (temperature 0) beside
sampled ones (``docs/semantics.md``, "Heterogeneous batches").
:func:`engine_batches` turns a case with a sampling support into such a batch:
it gives each row one of a few requests, so groups of several rows sit beside
single rows, and draws each request's parameter set (a temperature, or 0 for a
greedy request, and rules aimed at a boundary of one of the rows it serves, as
:func:`~tp_logprob.strategies.supports` aims them). A replayed mask keeps its
kept ids (the engine's) and takes per-row temperatures only. A greedy request
keeps the rules it was drawn with: the semantics turn them off, and a backend that
applies them anyway shows it.

Everything shrinks toward two identical requests at ``T = 1``: one set of
parameters in the per-row form.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import strategies as st

from tp_logprob.row_groups import contract_rows
from tp_logprob.strategies.cases import LogprobCase
from tp_logprob.strategies.contracts import temperatures
from tp_logprob.strategies.supports import supports
from tp_logprob.support import RowRules, SupportMode, SupportSpec

__all__ = ["MAX_REQUESTS", "engine_batches"]

MAX_REQUESTS = 3
"""At most this many distinct requests' parameter sets in one drawn batch."""


@st.composite
def engine_batches(draw: Any, case: LogprobCase) -> LogprobCase:
    """``case`` (whose contract has a sampling support) with per-row temperatures and, for
    sampling parameters, per-row rules: a heterogeneous engine batch.

    Example::

        case = data.draw(engine_batches(case), label="engine batch")
    """
    contract = case.contract
    if contract.support is None:
        raise ValueError("engine_batches: the case needs a sampling support")
    rows = contract.num_tokens
    if rows == 0:
        return case
    # One request for the batch is the scalar case, drawn on its own: two at least here.
    count = draw(st.integers(min(2, rows), min(MAX_REQUESTS, rows)), label="requests")
    chosen = [draw(st.integers(0, count - 1), label=f"row {row} request") for row in range(rows)]
    requests: list[tuple[float, RowRules]] = []
    for request in range(count):
        greedy = draw(st.booleans(), label=f"request {request} greedy")
        temperature = 0.0 if greedy else draw(temperatures(), label=f"request {request} T")
        own = [row for row, pick in enumerate(chosen) if pick == request] or list(range(rows))
        requests.append((temperature, draw(_rules(case, temperature, request, own))))
    per_row = dataclasses.replace(contract, temperature=tuple(requests[pick][0] for pick in chosen))
    if contract.support.mode is SupportMode.SAMPLING_PARAMS:
        per_row = dataclasses.replace(
            per_row,
            support=SupportSpec(
                top_k=[requests[pick][1][0] for pick in chosen],
                top_p=[requests[pick][1][1] for pick in chosen],
                min_p=[requests[pick][1][2] for pick in chosen],
            ),
        )
    return case.replace(contract=per_row)


@st.composite
def _rules(
    draw: Any, case: LogprobCase, temperature: float, request: int, own: list[int]
) -> RowRules:
    """One request's ``(top_k, top_p, min_p)``, aimed at a boundary of the logits of one of the
    rows ``own`` that take them, at the request's temperature (every rule off for a replayed
    mask): a value aimed at a row that another request serves would test nothing there."""
    contract = case.contract
    if contract.support is None or contract.support.mode is SupportMode.REPLAYED_MASK:
        return None, None, None
    row = draw(st.sampled_from(own), label=f"request {request} row")
    one_row = dataclasses.replace(
        contract_rows(contract, [row]), temperature=temperature or 1.0, support=None
    )
    spec: SupportSpec = draw(
        supports(one_row, modes=(SupportMode.SAMPLING_PARAMS,), logits=case.logits[[row]]),
        label=f"request {request} rules",
    )
    return spec.row_rules(0)
