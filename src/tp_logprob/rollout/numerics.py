"""The op's own numerics: how far a correct fp32 logprob may be from the exact one.

A tight term, apart from the logit noise (:mod:`tp_logprob.rollout.noise`): the
bound of ``docs/tolerances.md`` for the op on the response's vocabulary and TP
degree, at each token's exact logprob and log-sum-exp. :func:`op_bound` is the one
place the check asks for it.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tp_logprob.oracle import tolerance
from tp_logprob.oracle.ulp import ulp_exponent

__all__ = ["fp32_ulp", "op_bound"]

Floats = npt.NDArray[np.float64]


def op_bound(dtype: str, vocab_size: int, tp: int, exact: Floats, lse: Floats) -> Floats:
    """Per token: the bound on ``|computed - exact|`` of a correct fp32 op."""
    with np.errstate(invalid="ignore", over="ignore"):
        bound = tolerance(dtype, vocab_size, num_shards=tp).selected_bound(exact, lse)
    return np.asarray(bound, dtype=np.float64)


def fp32_ulp(scale: Floats) -> Floats:
    """The fp32 ulp at each ``scale`` (finite; +-inf and NaN count as 0)."""
    finite = np.where(np.isfinite(scale), np.abs(scale), 0.0)
    return np.asarray(np.ldexp(1.0, ulp_exponent(finite, "fp32")), dtype=np.float64)
