"""The op's own numerics: how far a correct fp32 logprob may be from the exact one.

A tight term, apart from the logit noise (:mod:`tp_logprob.rollout.noise`): the
bound of ``docs/tolerances.md`` for the op on the response's vocabulary and TP
degree, at each token's exact logprob and log-sum-exp. :func:`op_bound` is the one
place the check asks for it: for an op that declares how it sums a shard (an
:class:`~tp_logprob.accumulation.AccumulationOrder`, ``docs/tolerances.md``, "Declared
orders") the bound takes that order's path, as the property suite's does; for any
other op it allows any order.

Over a replayed mask a correct op sums ``exp`` of the kept columns only: every other
column is ``-inf`` and adds an exact 0, and an addition with a 0 does not round. So a
term's path of rounded additions in any order is at most the kept columns less one,
however wide the vocabulary: the bound takes the most kept columns of any token as
its shard size, or a declared order's own path where that is shorter. At a 152,064
vocabulary and top-k 50 that is 50 columns, not the vocabulary: a bound thousands of
times tighter, where the vocabulary-wide one held a one-token mask's logprob of 0 to
about 0.01.
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
    kept: int | None = None,
) -> Floats:
    """Per token: the bound on ``|computed - exact|`` of a correct fp32 op under
    ``contract`` that sums each shard in ``order`` (None: any order); ``kept`` the most
    columns any token's mask keeps (None: every live column counts)."""
    sharding = contract.sharding
    rv = sharding.real_vocab_size
    anywise = tolerance(
        contract.dtype.value,
        rv,
        num_shards=sharding.tp_world_size,
        max_shard_size=None if kept is None else max(1, min(kept, rv)),
    )
    with np.errstate(invalid="ignore", over="ignore"):
        bound = anywise.selected_bound(exact, lse)
        if order is not None and not order.is_any:
            # The declared order's path, or the kept columns', whichever is shorter.
            bound = np.minimum(bound, suite_tolerance(contract, order).selected_bound(exact, lse))
    return np.asarray(bound, dtype=np.float64)
