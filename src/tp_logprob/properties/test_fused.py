"""The fused LM head (``input_kind="hidden"``): every backend that takes hidden states.

Cases come from :func:`~tp_logprob.strategies.hidden_cases`: small hidden sizes,
dot products that cancel, huge and tiny magnitudes, garbage in the weight's
padding rows, bias, NaN hidden rows that are inactive, uneven and padding-only
shards at TP 1-8. The oracle, determinism and TP-consistency checks are the
logits path's, with room for the backend's own fp32 dot products
(``docs/tolerances.md``, "Fused LM head"); the rest are the fused path's own.
Backends that take only logits skip this module, and hidden-only backends skip
the logits-path modules.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from tp_logprob.contract import DeterminismScope
from tp_logprob.properties.checks import run_check
from tp_logprob.properties.profiles import scaled
from tp_logprob.properties.test_determinism import _relayout, batch_rows
from tp_logprob.strategies import HiddenCase, hidden_cases


def draw_hidden_case(data: Any, backend: Any, suite: Any, **filters: Any) -> HiddenCase:
    """A fused case from the contracts ``backend`` claims; skips backends that take logits."""
    try:
        strategy = hidden_cases(capability=backend.capability, **filters)
    except InvalidArgument as error:
        pytest.skip(f"{backend.backend_id} claims no fused LM-head contract: {error}")
    case: HiddenCase = data.draw(strategy, label="case")
    suite.stats.example(backend.backend_id)
    return case


@given(data=st.data())
def test_fused_matches_exact_oracle(
    tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any
) -> None:
    """selected_logp, lse and entropy within the tolerance table plus the dot-product room
    of the exact values on ``fp32(hidden @ W.T + b)``."""
    backend = tp_logprob_backend
    case = draw_hidden_case(data, backend, tp_logprob_suite)
    run_check("oracle", backend, case, stats=tp_logprob_suite.stats)


@scaled(0.5)
@given(data=st.data())
def test_fused_exact_dot_products_match_logits_path(
    tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any
) -> None:
    """Small-integer operands (exact fp32 dot products): as accurate as the logits path,
    and within tolerance of torch_native run on the same logits."""
    backend = tp_logprob_backend
    case = draw_hidden_case(data, backend, tp_logprob_suite, small_integers=True)
    run_check("fused_exact_products", backend, case, stats=tp_logprob_suite.stats)


@scaled(0.5)
@given(data=st.data())
def test_fused_padding_rows_never_read(
    tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any
) -> None:
    """Other garbage (NaN, +-inf, 2^100) in the weight's and bias's padding rows: same bits."""
    backend = tp_logprob_backend
    case = draw_hidden_case(data, backend, tp_logprob_suite, padding=True)
    seed = data.draw(st.integers(0, 2**31 - 1), label="garbage seed")
    run_check("fused_padding_rows", backend, case, {"seed": seed})


@given(data=st.data())
def test_fused_gradients(tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any) -> None:
    """d hidden (rank partials summed), d weight and d bias of w * selected + v * entropy
    within their bounds; exactly 0 on inactive rows and padding rows."""
    backend = tp_logprob_backend
    case = draw_hidden_case(data, backend, tp_logprob_suite, roles={"train"})
    run_check("fused_gradients", backend, case, stats=tp_logprob_suite.stats)


@scaled(0.5)
@given(data=st.data())
def test_fused_run_to_run_and_batch_invariance(
    tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any
) -> None:
    """Two runs give the same bits, and rows run as their own batch keep their bits
    (unless the backend claims run_to_run determinism only)."""
    backend = tp_logprob_backend
    case = draw_hidden_case(data, backend, tp_logprob_suite)
    run_check("run_to_run", backend, case)
    scope = DeterminismScope.FIXED_TOPOLOGY
    if not any(offered.satisfies(scope) for offered in backend.capability.determinism_scopes):
        return
    rows = data.draw(batch_rows(case.contract.num_tokens), label="rows of the second batch")
    run_check("batch_invariance", backend, case, {"rows": rows})


@scaled(0.5)
@given(data=st.data())
def test_fused_tp_consistency(tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any) -> None:
    """Another TP degree and shard layout of the same weight: bitwise for cross_tp_bitwise,
    else within tolerance (with the dot-product room of both runs)."""
    backend = tp_logprob_backend
    capability = backend.capability
    single = capability.tp_world_sizes is not None and len(capability.tp_world_sizes) == 1
    if single and (capability.tp_world_sizes == {1} or capability.even_shards_only):
        pytest.skip(f"{backend.backend_id} serves one shard layout per vocabulary: nothing to vary")
    case = draw_hidden_case(data, backend, tp_logprob_suite)
    layout = data.draw(_relayout(case.contract.sharding, capability), label="second layout")
    run_check("tp_consistency", backend, case, layout)


@scaled(0.12)
@given(data=st.data())
def test_fused_never_materializes_the_logits(
    tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any
) -> None:
    """384 rows, forward and (train) backward: no fp32 tensor the op allocates is a
    shard's width with every row, i.e. the ``[N, local_vocab]`` logits never exist."""
    backend = tp_logprob_backend
    case = draw_hidden_case(
        data, backend, tp_logprob_suite, max_num_tokens=4, min_padded_vocab_size=32
    )
    run_check("fused_memory", backend, case)
