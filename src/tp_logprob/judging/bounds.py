"""The bounds a backend is held to: the tolerance table's entry for a contract and the
accumulation order its capability declares (``docs/tolerances.md``, "Declared orders").

Apart from :mod:`.measuring` (which compares and fails under Hypothesis) so that what
only needs a bound, the rollout check above all, imports neither Hypothesis nor the
comparisons.
"""

from __future__ import annotations

import math

import numpy as np

from tp_logprob.accumulation import AccumulationOrder
from tp_logprob.contract import LogprobContract
from tp_logprob.judging.outputs import Floats
from tp_logprob.oracle.tolerance import LogprobTolerance, tolerance
from tp_logprob.oracle.ulp import ulp_exponent

__all__ = ["MIN_ONLINE_BLOCK", "fp32_ulp", "order_note", "suite_tolerance"]


MIN_ONLINE_BLOCK = 16
"""The tolerance allows one exp-rescaling per 16 columns of a shard (an online
softmax over blocks of at least 16 columns) plus the cross-rank merge."""


def suite_tolerance(
    contract: LogprobContract,
    order: AccumulationOrder | None = None,
    *,
    shard_partials: bool = False,
) -> LogprobTolerance:
    """The tolerance table entry for ``contract`` when each rank sums its shard in ``order``.

    Without an order (or with the any order) the bound allows any summation order, an
    online softmax over blocks of :data:`MIN_ONLINE_BLOCK` columns or more, and a sum
    over the whole row (``shard_partials``: over each rank's live columns, merged across
    ranks). A declared order is a promise about each rank's shard: its path of additions
    (and rescalings) on the widest shard, its fixed-point bits from the padded vocabulary,
    then the merge (``docs/tolerances.md``, "Declared orders"). The rollout check's
    numerics verdict calls this with the trainer backend's
    ``capability.accumulation_order``.
    """
    sharding = contract.sharding
    widest = max(
        end - start
        for start, end in (sharding.live_bounds(r) for r in range(sharding.tp_world_size))
    )
    if order is None or order.is_any:
        return tolerance(
            contract.dtype.value,
            sharding.real_vocab_size,
            num_shards=sharding.tp_world_size,
            max_shard_size=max(widest, 1) if shard_partials else None,
            rescales=math.ceil(widest / MIN_ONLINE_BLOCK) + 1,
        )
    bits = order.fraction_bits(sharding.padded_vocab_size)
    return tolerance(
        contract.dtype.value,
        sharding.real_vocab_size,
        num_shards=sharding.tp_world_size,
        max_shard_size=max(widest, 1),
        order=order if bits is None else AccumulationOrder.fixed_point(bits),
    )


def order_note(order: AccumulationOrder) -> tuple[str, str]:
    """The report line that names the accumulation order a bound assumed."""
    if order.is_any:
        return ("bound", "assumes sums in any order (declare order= for a tighter bound)")
    return ("bound", f"assumes the declared order: {order.describe()}")


def fp32_ulp(scale: Floats) -> Floats:
    """The fp32 ulp at each ``scale`` (finite; +-inf and NaN count as 0)."""
    finite = np.where(np.isfinite(scale), np.abs(scale), 0.0)
    return np.asarray(np.ldexp(1.0, ulp_exponent(finite, "fp32")), dtype=np.float64)
