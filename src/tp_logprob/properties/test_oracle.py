"""Agreement with the oracle: exact on small shapes, the float64 reference on larger ones."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tp_logprob.properties._harness import draw_case
from tp_logprob.properties.checks import run_check
from tp_logprob.properties.profiles import scaled
from tp_logprob.strategies import SPECIAL_KINDS


@given(data=st.data())
def test_matches_exact_oracle(tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any) -> None:
    """selected_logp and lse within the tolerance table of the correctly rounded values."""
    backend = tp_logprob_backend
    case = draw_case(data, backend, tp_logprob_suite)
    run_check("oracle", backend, case, stats=tp_logprob_suite.stats)


@given(data=st.data())
def test_special_values_match_oracle(
    tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any
) -> None:
    """NaN, +inf and all -inf rows give exactly the oracle's NaN/inf pattern."""
    backend = tp_logprob_backend
    case = draw_case(
        data, backend, tp_logprob_suite, special_values=True, logit_kinds=("random", *SPECIAL_KINDS)
    )
    run_check("special_values", backend, case, stats=tp_logprob_suite.stats)


@scaled(0.5)
@given(data=st.data())
def test_matches_reference_on_larger_shapes(
    tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any
) -> None:
    """Within tolerance of the float64 reference (plus its own bound) on wider vocabularies."""
    backend = tp_logprob_backend
    case = draw_case(
        data,
        backend,
        tp_logprob_suite,
        min_padded_vocab_size=65,
        max_padded_vocab_size=320,
        max_num_tokens=16,
    )
    run_check("reference", backend, case, stats=tp_logprob_suite.stats)
