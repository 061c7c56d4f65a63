"""Cross-backend agreement: on every contract two backends both serve, they agree.

Agreement means within the sum of both backends' tolerances, with identical
NaN/inf patterns. The other backends are the rest of the suite's selection plus
every built-in backend of the platform, so a third-party backend is compared
with ours even when it is the only one under test.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tp_logprob.properties._backends import resolve_backends
from tp_logprob.properties._harness import draw_case
from tp_logprob.properties.checks import run_check
from tp_logprob.properties.profiles import scaled


def _others(backend: Any, suite: Any) -> list[Any]:
    chosen = {other.backend_id: other for other in suite.backends()}
    for builtin in resolve_backends([], backend.platform):
        chosen.setdefault(builtin.backend_id, builtin)
    chosen.pop(backend.backend_id, None)
    return [other for other in chosen.values() if other.load_failure() is None]


@scaled(0.4)
@given(data=st.data())
def test_backends_agree(tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any) -> None:
    """Within both tolerances of every other backend that serves the same contract."""
    backend = tp_logprob_backend
    candidates = _others(backend, tp_logprob_suite)
    if not candidates:
        pytest.skip(f"no other backend on {backend.platform} to compare {backend.backend_id} with")
    case = draw_case(data, backend, tp_logprob_suite, special_values=True)
    run_check("backends_agree", backend, case, others=candidates)
