"""The case kind as a parameter: one claim, drawn for the logits path, a fused LM head or
a processed logprob.

A property that relates two runs of one case (run to run, batch invariance, another
TP layout) says the same of every kind of case: only the draw differs
(:func:`draw_of_kind`). :func:`check_across_layouts` and
:func:`check_run_to_run_and_batch_invariance` are those claims' test bodies for any
kind; :func:`relaid` is the second layout a layout property's body runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from tp_logprob.contract import ShardingSpec
from tp_logprob.errors import LogprobContractError
from tp_logprob.judging.violation import PropertyInputError
from tp_logprob.strategies import LogprobCase
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.draws import (
    batch_rows,
    claims_batch_invariance,
    draw_case,
    draw_fused_case,
    draw_processed_case,
    relayouts,
)
from tp_logprob.suite.property import SuiteProperty
from tp_logprob.suite.session import Suite

__all__ = [
    "CaseKind",
    "check_across_layouts",
    "check_run_to_run_and_batch_invariance",
    "draw_of_kind",
    "relaid",
]

CaseKind = Literal["logits", "fused", "processed"]
"""``logits``: the logits path; ``fused``: a fused LM head (hidden states in);
``processed``: a contract with a sampling support, of the input kind the backend takes."""


def draw_of_kind(
    data: Any, backend: BackendUnderTest, suite: Suite, kind: CaseKind, **filters: Any
) -> LogprobCase:
    """A case of ``kind`` for ``backend``, drawn as that kind's properties draw it."""
    if kind == "fused":
        return draw_fused_case(data, backend, suite, **filters)
    if kind == "processed":
        return draw_processed_case(data, backend, suite, **filters)
    return draw_case(data, backend, suite, **filters)


def check_across_layouts(
    data: Any, backend: BackendUnderTest, suite: Suite, kind: CaseKind, prop: SuiteProperty
) -> None:
    """Property ``prop`` on a case of ``kind`` and a second TP degree and shard layout of its
    vocabulary (the layout drawn as ``prop``'s params)."""
    case = draw_of_kind(data, backend, suite, kind)
    layout = data.draw(relayouts(case.contract.sharding, backend.capability), label="second layout")
    prop.run(backend, case, layout)


def check_run_to_run_and_batch_invariance(
    data: Any,
    backend: BackendUnderTest,
    suite: Suite,
    kind: CaseKind,
    run_to_run: SuiteProperty,
    batch_invariance: SuiteProperty,
) -> None:
    """Two runs of a case of ``kind`` give the same bits (``run_to_run``), and (unless the
    backend claims run_to_run only) rows run as their own batch keep their bits
    (``batch_invariance``, the rows drawn as its params)."""
    case = draw_of_kind(data, backend, suite, kind)
    run_to_run.run(backend, case)
    if not claims_batch_invariance(backend):
        return
    rows = data.draw(batch_rows(case.contract.num_tokens), label="rows of the second batch")
    batch_invariance.run(backend, case, {"rows": rows})


def relaid(case: LogprobCase, params: Mapping[str, Any]) -> tuple[LogprobCase, tuple[str, str]]:
    """``case`` on the layout ``params["vocab_shard_bounds"]`` (seen by ``params["tp_rank"]``),
    and both layouts' labels; a :class:`PropertyInputError` when it is no layout of the
    case's vocabulary."""
    contract = case.contract
    sharding = contract.sharding
    bounds = tuple(tuple(pair) for pair in params["vocab_shard_bounds"])
    try:
        other = ShardingSpec(
            params["tp_rank"],
            len(bounds),
            bounds,
            sharding.real_vocab_size,
            sharding.padded_vocab_size,
        )
    except LogprobContractError as error:
        raise PropertyInputError(
            f"params: not a layout of the case's vocabulary: {error}"
        ) from None
    layouts = (
        f"tp={sharding.tp_world_size} {list(sharding.vocab_shard_bounds)}",
        f"tp={other.tp_world_size} {list(other.vocab_shard_bounds)}",
    )
    return case.replace(contract=dataclasses.replace(contract, sharding=other)), layouts
