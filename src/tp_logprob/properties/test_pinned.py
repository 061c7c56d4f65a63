"""Pinned cases: the ``@example`` of the data-driven properties, run on every backend.

The properties draw through ``st.data()``, which ``@example`` cannot feed, so
cases worth keeping forever (edge cases found by the suite, or that broke it)
live here as literal cases, checked against the exact oracle and, for role
``train``, the exact gradient.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tp_logprob.contract import (
    DeterminismScope,
    LogprobContract,
    LogprobDType,
    LogprobRole,
    MaskSpec,
    ReductionSpec,
    ShardingSpec,
)
from tp_logprob.strategies import DTYPE_MAX, LogprobCase
from tp_logprob.suite.applicability import LOGITS_INPUT, applies_to
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.expect import expect_exact_and_gradient
from tp_logprob.suite.property import suite_property
from tp_logprob.suite.session import Suite
from tp_logprob.suite.summary import SuiteStats
from tp_logprob.suite.variants import variants

_INF = float("inf")
_F32_MAX = DTYPE_MAX[LogprobDType.FP32]


def _case(
    rows: list[list[float]],
    targets: list[int],
    bounds: tuple[tuple[int, int], ...],
    *,
    real: int | None = None,
    active: list[bool] | None = None,
    dtype: str = "fp32",
    role: str = "infer",
    scope: str = "fixed_topology",
    temperature: float = 1.0,
    entropy: bool = False,
) -> LogprobCase:
    padded = bounds[-1][1]
    contract = LogprobContract(
        role=LogprobRole(role),
        dtype=LogprobDType(dtype),
        mask=MaskSpec(len(rows), None if active is None else np.array(active)),
        sharding=ShardingSpec(0, len(bounds), bounds, padded if real is None else real, padded),
        reduction=ReductionSpec(DeterminismScope(scope)),
        temperature=temperature,
        export_entropy=entropy,
    )
    return LogprobCase(contract, np.array(rows, dtype=np.float32), np.array(targets))


PINNED = {
    # The gradient bound once came out NaN here: 0 * expm1(huge LSE error).
    "gradient where the LSE error bound is huge": _case(
        [[1.357279e-29, 5.431321e25, 3.571237e32]], [0], ((0, 3),), role="train"
    ),
    # x_t - lse = -2 * fp32 max: finite exactly, -inf once rounded to fp32.
    "selected_logp overflows fp32 to -inf": _case(
        [[_F32_MAX, -_F32_MAX, 0.0]], [1], ((0, 1), (1, 3)), role="train"
    ),
    # Every live column -inf: lse -inf, selected NaN, no exp(-inf - -inf).
    "all live columns -inf on every rank": _case(
        [[-_INF, -_INF, 5.0], [0.0, -_INF, 1.0]], [0, 1], ((0, 1), (1, 2), (2, 3)), real=2
    ),
    # The row maximum sits in a shard made only of padding.
    "maximum in an all-padding shard": _case(
        [[0.5, -1.0, 2.0, 1e4, 3e38]], [2], ((0, 1), (1, 3), (3, 5)), real=3
    ),
    # Eight width-1 shards, the target in the last live one; an inactive garbage target.
    "eight width-1 shards": _case(
        [list(np.linspace(-3.0, 4.0, 8)), [1.0] * 8],
        [7, 2**40],
        tuple((c, c + 1) for c in range(8)),
        active=[True, False],
        role="train",
    ),
    # Entropy of a row with one finite live value is exactly 0; -inf columns add 0, not NaN.
    "entropy of one finite value among -inf columns": _case(
        [[-_INF, 2.5, -_INF, -_INF], [-_INF, -_INF, -_INF, 7.0]],
        [1, 3],
        ((0, 2), (2, 4)),
        role="train",
        entropy=True,
    ),
    # Padding holds NaN and +inf: entropy over the live columns only, at T = 0.6.
    "entropy with garbage padding at T = 0.6": _case(
        [[0.25, -1.0, 3.0, float("nan"), _INF], [1.0, 1.0, 1.0, _INF, -_INF]],
        [2, 0],
        ((0, 2), (2, 5)),
        real=3,
        role="train",
        temperature=0.6,
        entropy=True,
    ),
    # A running max that jumps from 0 to 3e38 between tiles: exp(m_old - m_new) underflows,
    # and (m_old - m_new) * s must not overflow into 0 * -inf in an online entropy.
    "entropy when the running max jumps by 3e38": _case(
        [[0.0] * 20 + [3e38] + [0.0] * 3],
        [20],
        ((0, 24),),
        role="train",
        entropy=True,
    ),
    # T = 2^-126 sends z = x / T past fp32's range: +-inf, so lse = +inf and selected_logp
    # and entropy NaN on the first row; the second stays finite; inactive rows give 0.
    "temperature so small that z overflows": _case(
        [[8.0, -8.0, 0.5], [2.0**-120, 0.0, -(2.0**-121)], [8.0, 0.0, 1.0]],
        [0, 1, 2],
        ((0, 1), (1, 3)),
        active=[True, True, False],
        temperature=2.0**-126,
        entropy=True,
    ),
    # bf16 ties at the maximum across a shard boundary.
    "bf16 tie at the maximum across shards": _case(
        [[3.0, 7.0, 7.0, -2.0]], [2], ((0, 2), (2, 4)), dtype="bf16", role="train"
    ),
}


@suite_property("pinned", params={"name": "str"})
def pinned(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """The exact oracle's values (and gradient, for train) on a pinned case."""
    name = params["name"]
    expect_exact_and_gradient(f"pinned case: {name}", f"pinned case: {name}", backend, case, stats)


def _claims_pinned_contract(backend: BackendUnderTest, params: Mapping[str, Any]) -> str | None:
    """The backend claims the pinned case's contract (its first refusal otherwise)."""
    refusals = backend.capability.incompatibilities(PINNED[params["name"]].contract)
    return f"the pinned case's contract: {refusals[0]}" if refusals else None


@applies_to(LOGITS_INPUT, _claims_pinned_contract)
@variants("name", list(PINNED))
def test_pinned_case(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, name: str
) -> None:
    """The exact oracle's values (and gradient, for train) on a case worth keeping."""
    backend = tp_logprob_backend
    case = PINNED[name]
    tp_logprob_suite.stats.example(backend.backend_id)
    pinned.run(backend, case, {"name": name}, stats=tp_logprob_suite.stats)
