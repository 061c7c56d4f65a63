"""Dispatch soundness: a contract reaches a backend that serves it, or an error that says why."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tp_logprob.errors import LogprobDispatchError
from tp_logprob.judging.violation import violation
from tp_logprob.strategies import contracts
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.session import Suite


def _check_refusal(
    prop: str, contract: Any, backend_id: str, error: Exception, refused: dict[str, tuple[str, ...]]
) -> None:
    message = str(error)
    missing = []
    for candidate, reasons in refused.items():
        if candidate not in message:
            missing.append(f"{candidate} (not named)")
        missing += [f"{candidate}: {reason}" for reason in reasons if reason not in message]
    if missing:
        raise violation(
            f"{prop}: the LogprobDispatchError does not list every candidate's reasons",
            contract,
            backend_id,
            [("missing", "; ".join(missing)), ("message", message)],
        )


@given(data=st.data())
def test_dispatch_is_sound(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """By id and by ``auto``: a capable backend, or a LogprobDispatchError listing each reason."""
    backend = tp_logprob_backend
    registry, platform = backend.registry, backend.platform
    contract = data.draw(contracts(), label="contract (any valid one)")
    tp_logprob_suite.stats.example(backend.backend_id)
    reasons = backend.capability.incompatibilities(contract)
    try:
        chosen = registry.get_logprob_op(contract, backend.backend_id, platform=platform)
    except LogprobDispatchError as error:
        if not reasons:
            raise violation(
                f"dispatch soundness: {backend.backend_id} refused a contract it claims",
                contract,
                backend.backend_id,
                [("message", str(error))],
            ) from None
        _check_refusal(
            "dispatch soundness", contract, backend.backend_id, error, {backend.backend_id: reasons}
        )
    else:
        if reasons or chosen.capability != backend.capability:
            raise violation(
                f"dispatch soundness: requesting {backend.backend_id} served a contract it refuses",
                contract,
                backend.backend_id,
                [("reasons", "; ".join(reasons)), ("served", chosen.capability.backend_id)],
            )
    candidates = {
        cap.backend_id: cap.incompatibilities(contract) for cap in registry.backends(platform)
    }
    try:
        chosen = registry.get_logprob_op(contract, "auto", platform=platform, preflighted=True)
    except LogprobDispatchError as error:
        capable = [
            backend_id
            for backend_id, why in candidates.items()
            if not why and backend_id not in registry.failures(platform)
        ]
        if capable:
            raise violation(
                f"dispatch soundness: auto refused a contract that {capable} serve",
                contract,
                backend.backend_id,
                [("message", str(error))],
            ) from None
        _check_refusal("dispatch soundness (auto)", contract, backend.backend_id, error, candidates)
    else:
        served = chosen.capability.incompatibilities(contract)
        if served:
            raise violation(
                f"dispatch soundness: auto chose {chosen.capability.backend_id}, which cannot "
                "serve the contract",
                contract,
                backend.backend_id,
                [("reasons", "; ".join(served))],
            )
