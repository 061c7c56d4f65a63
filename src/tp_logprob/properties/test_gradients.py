"""Role ``train``: the backward pass against the exact gradient."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tp_logprob.strategies import LogprobCase
from tp_logprob.suite.applicability import LOGITS_INPUT, TRAIN_ROLE, applies_to
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.draws import draw_case
from tp_logprob.suite.expect import expect_gradient
from tp_logprob.suite.profiles import scaled
from tp_logprob.suite.property import suite_property
from tp_logprob.suite.session import Suite
from tp_logprob.suite.summary import SuiteStats


@suite_property("gradients")
def gradients(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """Within bound of the exact gradient; exactly 0 on padding and inactive rows."""
    expect_gradient("gradients", case, backend, stats)


@applies_to(LOGITS_INPUT, TRAIN_ROLE)
@scaled(0.6)
@given(data=st.data())
def test_gradients_match_exact(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """Within bound of the exact gradient; exactly 0 on padding and inactive rows; rows sum to 0."""
    backend = tp_logprob_backend
    case = draw_case(data, backend, tp_logprob_suite, roles={"train"})
    gradients.run(backend, case, stats=tp_logprob_suite.stats)
