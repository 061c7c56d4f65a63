"""Determinism claims, checked bitwise: replication, run to run, batch, and across TP degrees."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tp_logprob.contract import DeterminismScope, ShardingSpec
from tp_logprob.properties._harness import draw_case
from tp_logprob.properties.checks import run_check
from tp_logprob.properties.profiles import scaled
from tp_logprob.strategies import shard_bounds


@given(data=st.data())
def test_outputs_replicated_across_ranks(
    tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any
) -> None:
    """Every rank returns the same bits, NaN payloads and signed zeros included."""
    backend = tp_logprob_backend
    case = draw_case(data, backend, tp_logprob_suite, special_values=True)
    run_check("replicated", backend, case)


@given(data=st.data())
def test_run_to_run_bitwise(tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any) -> None:
    """Running the same case twice gives the same bits."""
    backend = tp_logprob_backend
    case = draw_case(data, backend, tp_logprob_suite)
    run_check("run_to_run", backend, case)


@given(data=st.data())
def test_batch_invariance(tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any) -> None:
    """A row's bits do not depend on the other rows, their order, or N."""
    backend = tp_logprob_backend
    skip_unless_batch_invariant(backend)
    case = draw_case(data, backend, tp_logprob_suite)
    rows = data.draw(batch_rows(case.contract.num_tokens), label="rows of the second batch")
    run_check("batch_invariance", backend, case, {"rows": rows})


def skip_unless_batch_invariant(backend: Any) -> None:
    """Skip a batch-invariance property for a backend that claims run-to-run bits only."""
    scope = DeterminismScope.FIXED_TOPOLOGY
    if not any(offered.satisfies(scope) for offered in backend.capability.determinism_scopes):
        pytest.skip(f"{backend.backend_id} claims run_to_run determinism only: not batch invariant")


def batch_rows(num_tokens: int) -> st.SearchStrategy[np.ndarray]:
    """Rows of a case, in any order, repeats allowed: a second batch for batch invariance."""
    return st.lists(st.sampled_from(range(num_tokens)), min_size=1, max_size=2 * num_tokens).map(
        lambda rows: np.array(rows, dtype=np.int64)
    )


@st.composite
def _relayout(draw: Any, sharding: ShardingSpec, capability: Any) -> dict[str, Any]:
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


@scaled(0.6)
@given(data=st.data())
def test_tp_consistency(tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any) -> None:
    """Another TP degree and shard layout: bitwise for cross_tp_bitwise, else within tolerance."""
    backend = tp_logprob_backend
    capability = backend.capability
    single = capability.tp_world_sizes is not None and len(capability.tp_world_sizes) == 1
    if single and (capability.tp_world_sizes == {1} or capability.even_shards_only):
        pytest.skip(f"{backend.backend_id} serves one shard layout per vocabulary: nothing to vary")
    case = draw_case(data, backend, tp_logprob_suite)
    layout = data.draw(_relayout(case.contract.sharding, capability), label="second layout")
    run_check("tp_consistency", backend, case, layout)
