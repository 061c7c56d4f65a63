"""What the properties draw for a backend: cases from the contracts it claims.

A property that needs a kind of contract the backend does not claim is skipped
with the reason, never failed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from tp_logprob.contract import DeterminismScope, ShardingSpec
from tp_logprob.strategies import (
    HiddenCase,
    LogprobCase,
    cases,
    contracts,
    hidden_cases,
    shard_bounds,
)

__all__ = [
    "batch_rows",
    "cases_for",
    "claims_batch_invariance",
    "draw_case",
    "draw_hidden_case",
    "relayouts",
    "skip_unless_batch_invariant",
]


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


def draw_hidden_case(data: Any, backend: Any, suite: Any, **filters: Any) -> HiddenCase:
    """A fused case from the contracts ``backend`` claims; skips backends that take logits."""
    try:
        strategy = hidden_cases(capability=backend.capability, **filters)
    except InvalidArgument as error:
        pytest.skip(f"{backend.backend_id} claims no fused LM-head contract: {error}")
    case: HiddenCase = data.draw(strategy, label="case")
    suite.stats.example(backend.backend_id)
    return case


def claims_batch_invariance(backend: Any) -> bool:
    """Whether ``backend`` claims a scope with batch invariance (more than run-to-run bits)."""
    scope = DeterminismScope.FIXED_TOPOLOGY
    return any(offered.satisfies(scope) for offered in backend.capability.determinism_scopes)


def skip_unless_batch_invariant(backend: Any) -> None:
    """Skip a batch-invariance property for a backend that claims run-to-run bits only."""
    if not claims_batch_invariance(backend):
        pytest.skip(f"{backend.backend_id} claims run_to_run determinism only: not batch invariant")


def batch_rows(num_tokens: int) -> st.SearchStrategy[np.ndarray]:
    """Rows of a case, in any order, repeats allowed: a second batch for batch invariance."""
    return st.lists(st.sampled_from(range(num_tokens)), min_size=1, max_size=2 * num_tokens).map(
        lambda rows: np.array(rows, dtype=np.int64)
    )


@st.composite
def relayouts(draw: Any, sharding: ShardingSpec, capability: Any) -> dict[str, Any]:
    """Another layout of ``sharding``'s vocabulary that ``capability`` serves: the
    ``tp_rank`` and ``vocab_shard_bounds`` params of a TP-consistency property."""
    padded = sharding.padded_vocab_size
    worlds = [w for w in range(1, 9) if w <= padded]
    if capability.tp_world_sizes is not None:
        worlds = [w for w in worlds if w in capability.tp_world_sizes]
    if capability.even_shards_only:
        worlds = [w for w in worlds if padded % w == 0]  # equal shards only
    world = draw(st.sampled_from(worlds))
    layouts = {"even"} if capability.even_shards_only else None
    bounds = draw(
        shard_bounds(padded, world, real_vocab_size=sharding.real_vocab_size, layouts=layouts)
    )
    return {
        "tp_rank": draw(st.integers(0, world - 1)),
        "vocab_shard_bounds": [list(pair) for pair in bounds],
    }
