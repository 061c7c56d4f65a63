"""The declared accumulation order, checked: rows built to break it stay within its bound.

A backend's ``capability.accumulation_order`` tightens the bound every value property
holds it to (``docs/tolerances.md``, "Declared orders"). This property does not take the
declaration on trust: :func:`tp_logprob.strategies.order_rows.order_cases` builds rows
whose terms make every addition of a sequential sum, a tree, a blocked sum and an online
softmax round the same way, at shard widths at and across the declared block and the
tree's levels, with the maximum on any rank, and the backend must stay within its
declared order's bound on all of them. A sequential sum that declares a tree errs by the
whole shard's path on the half-ulp row, far beyond a tree's ``log2(w)`` additions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tp_logprob.strategies import LogprobCase, order_cases
from tp_logprob.suite.applicability import LOGITS_INPUT, applies_to
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.draws import drawing_capability, interpreted
from tp_logprob.suite.expect import expect_exact
from tp_logprob.suite.profiles import scaled
from tp_logprob.suite.property import suite_property
from tp_logprob.suite.session import Suite
from tp_logprob.suite.summary import SuiteStats

MAX_WIDTH = 512
"""The widest shard drawn (at least): past a tree's ninth level and 32 blocks of 16; for a
declared block wider than 128, four blocks and one more column."""
INTERPRETED_MAX_WIDTH = 64
"""Under the Triton interpreter (16-column tiles on CPU): four tiles a shard and more."""


@suite_property("declared_order")
def declared_order(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """Rows adversarial for the declared order within that order's bound of the exact oracle."""
    expect_exact(
        "declared order: output outside its bound on rows built against it",
        backend,
        case,
        stats,
    )


@applies_to(LOGITS_INPUT)
@scaled(0.4)
@given(data=st.data())
def test_declared_order(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """Half-ulp rows laid out for a sequential sum, a tree, lanes and blocks, across the
    declared block and the shards: within the declared order's bound."""
    backend = tp_logprob_backend
    blocks = backend.capability.accumulation_order.block
    width = max(MAX_WIDTH, 4 * max(blocks, default=0) + 1)
    if interpreted(backend):
        width = INTERPRETED_MAX_WIDTH
    case = data.draw(order_cases(drawing_capability(backend), max_width=width), label="case")
    tp_logprob_suite.stats.example(backend.backend_id)
    declared_order.run(backend, case, stats=tp_logprob_suite.stats)
