"""Agreement with the oracle: exact on small shapes, the float64 reference on larger ones."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tp_logprob.strategies import SPECIAL_KINDS, LogprobCase
from tp_logprob.suite.applicability import LOGITS_INPUT, applies_to
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.draws import draw_case
from tp_logprob.suite.expect import expect_exact, expect_reference
from tp_logprob.suite.profiles import scaled
from tp_logprob.suite.property import suite_property
from tp_logprob.suite.session import Suite
from tp_logprob.suite.summary import SuiteStats


@suite_property("oracle")
def oracle(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """selected_logp and lse within the tolerance table of the correctly rounded values."""
    expect_exact("oracle agreement: output outside the tolerance table", backend, case, stats)


@applies_to(LOGITS_INPUT)
@given(data=st.data())
def test_matches_exact_oracle(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """selected_logp and lse within the tolerance table of the correctly rounded values."""
    backend = tp_logprob_backend
    case = draw_case(data, backend, tp_logprob_suite)
    oracle.run(backend, case, stats=tp_logprob_suite.stats)


@suite_property("special_values")
def special_values(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """NaN, +inf and all -inf rows give exactly the oracle's NaN/inf pattern."""
    expect_exact(
        "special values: NaN/inf pattern differs from the oracle",
        backend,
        case,
        stats,
        finite_headline="special values: the NaN/inf pattern matches, but a finite output is "
        "outside the tolerance table",
    )


@applies_to(LOGITS_INPUT)
@given(data=st.data())
def test_special_values_match_oracle(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """NaN, +inf and all -inf rows give exactly the oracle's NaN/inf pattern."""
    backend = tp_logprob_backend
    case = draw_case(
        data, backend, tp_logprob_suite, special_values=True, logit_kinds=("random", *SPECIAL_KINDS)
    )
    special_values.run(backend, case, stats=tp_logprob_suite.stats)


@suite_property("reference")
def reference(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """Within tolerance of the float64 reference (plus its own bound)."""
    expect_reference("reference agreement", backend, case, stats)


@applies_to(LOGITS_INPUT)
@scaled(0.5)
@given(data=st.data())
def test_matches_reference_on_larger_shapes(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
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
    reference.run(backend, case, stats=tp_logprob_suite.stats)
