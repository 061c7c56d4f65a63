"""The op's own numerics: how far a correct fp32 logprob may be from the exact one.

A tight term, apart from the logit noise (:mod:`tp_logprob.rollout.noise`): the
bound of ``docs/tolerances.md`` for the op on the response's vocabulary and TP
degree, at each token's exact logprob and log-sum-exp. :func:`op_bound` is the one
place the check asks for it: for an op that declares how it sums a shard (an
:class:`~tp_logprob.accumulation.AccumulationOrder`, ``docs/tolerances.md``, "Declared
orders") the bound takes that order's path, as the property suite's does; for any
other op it allows any order.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tp_logprob.accumulation import AccumulationOrder
from tp_logprob.contract import LogprobContract
from tp_logprob.judging.bounds import suite_tolerance
from tp_logprob.oracle import tolerance

__all__ = ["op_bound"]

Floats = npt.NDArray[np.float64]


def op_bound(
    contract: LogprobContract,
    exact: Floats,
    lse: Floats,
    order: AccumulationOrder | None = None,
) -> Floats:
    """Per token: the bound on ``|computed - exact|`` of a correct fp32 op under
    ``contract`` that sums each shard in ``order`` (None: any order)."""
    sharding = contract.sharding
    if order is None or order.is_any:
        table = tolerance(
            contract.dtype.value, sharding.real_vocab_size, num_shards=sharding.tp_world_size
        )
    else:
        table = suite_tolerance(contract, order)
    with np.errstate(invalid="ignore", over="ignore"):
        bound = table.selected_bound(exact, lse)
    return np.asarray(bound, dtype=np.float64)
