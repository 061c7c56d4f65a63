"""Role ``train``: the backward pass against the exact gradient."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tp_logprob.properties._harness import draw_case
from tp_logprob.properties.checks import run_check
from tp_logprob.properties.profiles import scaled


@scaled(0.6)
@given(data=st.data())
def test_gradients_match_exact(tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any) -> None:
    """Within bound of the exact gradient; exactly 0 on padding and inactive rows; rows sum to 0."""
    backend = tp_logprob_backend
    case = draw_case(data, backend, tp_logprob_suite, roles={"train"})
    run_check("gradients", backend, case, stats=tp_logprob_suite.stats)
