"""The exact values a case is judged against: the oracle on the case's ``z = x / T``."""

from __future__ import annotations

import numpy as np

from tp_logprob.oracle import apply_temperature, exact_entropy
from tp_logprob.oracle.exact import exact_selected_logprob
from tp_logprob.properties.running import Floats
from tp_logprob.strategies import LogprobCase

__all__ = ["exact_entropy_of", "exact_outputs", "row_max_of_z"]


def exact_outputs(case: LogprobCase) -> tuple[Floats, Floats]:
    """The exact oracle's ``(selected_logp, lse)`` for ``case`` (on ``z = x / T``)."""
    return exact_selected_logprob(
        case.logits,
        case.targets,
        active_mask=case.active,
        real_vocab_size=case.contract.sharding.real_vocab_size,
        temperature=case.contract.temperature,
    )


def exact_entropy_of(case: LogprobCase) -> Floats:
    """The exact oracle's entropy of every row of ``case`` (0.0 on inactive rows)."""
    return exact_entropy(
        case.logits,
        active_mask=case.active,
        real_vocab_size=case.contract.sharding.real_vocab_size,
        temperature=case.contract.temperature,
    )


def row_max_of_z(case: LogprobCase) -> Floats:
    """Each row's max live ``z = fp32(x) / fp32(T)``: the magnitude the bounds scale with."""
    live = apply_temperature(
        case.logits[:, : case.contract.sharding.real_vocab_size], case.contract.temperature
    )
    with np.errstate(invalid="ignore"):
        return live.max(axis=1) if live.shape[1] else np.full(live.shape[0], -np.inf)
