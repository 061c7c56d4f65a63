"""Cross-backend agreement: on every contract two backends both serve, they agree.

Agreement means within the sum of both backends' tolerances, with identical
NaN/inf patterns. The other backends are the rest of the suite's selection plus
every built-in backend of the platform, so a third-party backend is compared
with ours even when it is the only one under test.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tp_logprob.judging.expected import exact_entropy_of, exact_outputs
from tp_logprob.judging.measuring import allowed_error, entropy_error, expect_close
from tp_logprob.strategies import LogprobCase
from tp_logprob.suite.applicability import LOGITS_INPUT, applies_to
from tp_logprob.suite.backends import BackendUnderTest, resolve_backends
from tp_logprob.suite.draws import draw_case
from tp_logprob.suite.outcomes import NotApplicable
from tp_logprob.suite.profiles import scaled
from tp_logprob.suite.property import suite_property
from tp_logprob.suite.running import execute
from tp_logprob.suite.session import Suite
from tp_logprob.suite.summary import SuiteStats


def _others(backend: BackendUnderTest, suite: Suite) -> list[Any]:
    chosen = {other.backend_id: other for other in suite.backends()}
    for builtin in resolve_backends([], backend.platform):
        chosen.setdefault(builtin.backend_id, builtin)
    chosen.pop(backend.backend_id, None)
    return [other for other in chosen.values() if other.load_failure() is None]


@suite_property("backends_agree")
def backends_agree(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
    others: Sequence[Any] | None = None,
) -> None:
    """Within both tolerances of every other backend that serves the case's contract.

    ``others`` defaults to the built-in backends of ``backend``'s platform that load.
    """
    if others is None:
        others = [
            other
            for other in resolve_backends([], backend.platform)
            if other.backend_id != backend.backend_id and other.load_failure() is None
        ]
    serving = [other for other in others if other.capability.supports(case.contract)]
    if not serving:
        return
    mine = execute(backend, case)
    selected, lse = exact_outputs(case)
    selected_error, lse_error = allowed_error(case, selected, lse)
    entropy_bound = (
        entropy_error(case, exact_entropy_of(case), lse) if mine.entropy is not None else 0.0
    )
    for other in serving:
        theirs = execute(other, case)
        expect_close(
            f"cross-backend agreement: {backend.backend_id} and {other.backend_id} disagree",
            case,
            backend.backend_id,
            mine,
            theirs.selected,
            lse if theirs.lse is None else theirs.lse,
            expected_name=other.backend_id,
            extra_selected=selected_error,
            extra_lse=lse_error,
            expected_entropy=theirs.entropy,
            extra_entropy=entropy_bound,
            count_ulps=False,
            inactive_zero=False,
        )


@applies_to(LOGITS_INPUT)
@scaled(0.4)
@given(data=st.data())
def test_backends_agree(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """Within both tolerances of every other backend that serves the same contract."""
    backend = tp_logprob_backend
    candidates = _others(backend, tp_logprob_suite)
    if not candidates:
        raise NotApplicable(
            f"no other backend on {backend.platform} to compare {backend.backend_id} with"
        )
    case = draw_case(data, backend, tp_logprob_suite, special_values=True)
    backends_agree.run(backend, case, others=candidates)
