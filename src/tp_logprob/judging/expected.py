"""The exact values a case is judged against: the oracle on the case's ``z = x / T``."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tp_logprob.judging.outputs import Floats
from tp_logprob.oracle import apply_temperature, exact_entropy
from tp_logprob.oracle.exact import exact_selected_logprob
from tp_logprob.strategies import LogprobCase

__all__ = ["exact_entropy_of", "exact_outputs", "row_max_of_z"]


def exact_outputs(case: LogprobCase) -> tuple[Floats, Floats]:
    """The exact oracle's ``(selected_logp, lse)`` for ``case`` (on ``z = x / T``)."""
    return exact_selected_logprob(
        case.logits,
        case.targets,
        active_mask=case.active,
        real_vocab_size=case.contract.sharding.real_vocab_size,
        temperature=case.contract.batch_temperature,
    )


def exact_entropy_of(case: LogprobCase) -> Floats:
    """The exact oracle's entropy of every row of ``case`` (0.0 on inactive rows)."""
    return exact_entropy(
        case.logits,
        active_mask=case.active,
        real_vocab_size=case.contract.sharding.real_vocab_size,
        temperature=case.contract.batch_temperature,
    )


def row_max_of_z(case: LogprobCase) -> Floats:
    """Each row's max live ``z = fp32(x) / fp32(T)``: the magnitude the bounds scale with.

    For ``fp32(T) = 1``, ``z`` is the fp32 logits themselves: their maximum needs no
    float64 copy of the batch."""
    live: npt.NDArray[np.floating] = case.logits[:, : case.contract.sharding.real_vocab_size]
    if case.contract.temperature_fp32 != 1.0:
        live = apply_temperature(live, case.contract.batch_temperature)
    if not live.shape[1]:
        return np.full(live.shape[0], -np.inf)
    with np.errstate(invalid="ignore"):
        return np.asarray(live.max(axis=1), dtype=np.float64)
