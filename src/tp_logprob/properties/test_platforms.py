"""Cross-platform bits: a backend claiming ``cross_platform_bitwise`` and its twin agree bit
for bit.

The twin (``kernels.builtin.PLATFORM_TWINS``) computes the same operations in another
implementation: ``triton_portable``'s kernels (compiled on a GPU, interpreted on CPU) and
``torch_portable``'s torch ops. The twin runs on CPU when it is registered there, so on a
GPU machine this compares the GPU's bits with the CPU's; on CPU alone it compares the
Triton interpreter with torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tp_logprob.contract import DeterminismScope, LogprobRole
from tp_logprob.judging.measuring import expect_bitwise
from tp_logprob.judging.violation import format_value, violation
from tp_logprob.kernels.builtin import PLATFORM_TWINS
from tp_logprob.strategies import LogprobCase
from tp_logprob.suite.applicability import LOGITS_INPUT, applies_to, claims
from tp_logprob.suite.backends import BackendUnderTest, resolve_backends
from tp_logprob.suite.draws import draw_case
from tp_logprob.suite.expect import backward
from tp_logprob.suite.outcomes import NotApplicable
from tp_logprob.suite.property import suite_property
from tp_logprob.suite.running import execute
from tp_logprob.suite.session import Suite
from tp_logprob.suite.summary import SuiteStats

CROSS_PLATFORM_BITWISE = claims("determinism_scope", DeterminismScope.CROSS_PLATFORM_BITWISE)


def platform_twin(backend: BackendUnderTest) -> BackendUnderTest | None:
    """``backend``'s twin, on CPU where it is registered there, else on ``backend``'s own
    platform; None when it has none that loads."""
    twin_id = PLATFORM_TWINS.get(backend.backend_id)
    for platform in dict.fromkeys(("cpu", backend.platform)):
        for other in resolve_backends([], platform):
            if other.backend_id == twin_id and other.load_failure() is None:
                return other
    return None


@suite_property("platform_twins")
def platform_twins(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
    twin: BackendUnderTest | None = None,
) -> None:
    """The backend and its twin give the same bits, NaN payloads and signed zeros included;
    for role ``train`` the gradient of every rank's weighted loss too."""
    twin = platform_twin(backend) if twin is None else twin
    if twin is None or not twin.capability.supports(case.contract):
        return
    prop = f"cross-platform bits: {backend.backend_id} and its twin {twin.backend_id} differ"
    labels = (
        f"{backend.backend_id} on {backend.platform}",
        f"{twin.backend_id} on {twin.platform}",
    )
    if case.contract.role is not LogprobRole.TRAIN:
        mine, theirs = execute(backend, case), execute(twin, case)
        expect_bitwise(prop, case, backend.backend_id, mine, theirs, labels=labels)
        return
    ours, their = backward(prop, case, backend), backward(prop, case, twin)
    expect_bitwise(prop, case, backend.backend_id, ours.outputs, their.outputs, labels=labels)
    differ = np.argwhere(ours.gradient.view(np.int64) != their.gradient.view(np.int64))
    if differ.size:
        row, column = (int(i) for i in differ[0])
        raise violation(
            f"{prop}: the gradients differ",
            case,
            backend.backend_id,
            [
                ("first element", f"row {row}, column {column} ({len(differ)} differ)"),
                (labels[0], format_value(ours.gradient[row, column])),
                (labels[1], format_value(their.gradient[row, column])),
            ],
        )


@applies_to(LOGITS_INPUT, CROSS_PLATFORM_BITWISE)
@given(data=st.data())
def test_platform_twins_bitwise(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """A cross-platform backend and its twin give the same bits on every contract both serve."""
    backend = tp_logprob_backend
    twin = platform_twin(backend)
    if twin is None:
        raise NotApplicable(f"{backend.backend_id}: no twin registered that loads here")
    roles = backend.capability.roles & twin.capability.roles
    case = draw_case(data, backend, tp_logprob_suite, special_values=True, roles=roles)
    platform_twins.run(backend, case, twin=twin)
