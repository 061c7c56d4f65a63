"""Ground truth for tp-logprob: an exact oracle and a fast float64 reference.

* ``exact_*`` (log-sum-exp, selected log-probability, entropy, their gradients):
  every float64 result is the true value correctly rounded
  (mpmath, a Ziv loop over certified intervals);
* ``reference_*``: vectorised float64 numpy, max-shifted, within a proven bound
  of the exact value (``reference_error_bounds``);
* ``ulp_distance`` and ``tolerance``: how far a backend may be from exact;
* ``exact_hidden_logits``, ``dot_product_error_bound`` and friends: the fused LM
  head (hidden states times a weight), see ``oracle/fused.py``;
* ``exact_support``, ``classify_support``, ``admissible_support`` and
  ``support_margins``: the sampling support of a processed logprob (top-k, top-p,
  min-p), exact, and what a backend within its error bound may choose;
  ``exact_processed_*`` the outputs over a given support, correctly rounded;
* ``apply_temperature``: the ``z = fp32(x) / fp32(T)`` every function takes
  through its ``temperature`` keyword;
* ``fast_path_stats`` and ``FastPathCounts``: every ``exact_*`` result (and
  ``exact_hidden_logits``) first comes from a vectorised double-double fast path
  with a proven error bound, kept only when it rounds to one float64; the counts
  say how often each quantity fell back to the Ziv loop
  (:mod:`tp_logprob.oracle.fast_path`).

Imports numpy and mpmath only (gmpy2 and ml_dtypes when installed), never torch
or triton, so it can judge any backend.

>>> from tp_logprob.oracle import exact_selected_logprob
>>> sel, lse = exact_selected_logprob([[1.0, 2.0, 3.0]], [2])
>>> float(lse[0])
3.40760596444438
"""

from __future__ import annotations

from tp_logprob.oracle.exact import (
    exact_entropy,
    exact_entropy_grad,
    exact_logprob_grad,
    exact_logsumexp,
    exact_selected_logprob,
)
from tp_logprob.oracle.fast_path import FastPathCounts, fast_path_stats
from tp_logprob.oracle.fused import (
    dot_product_error_bound,
    exact_hidden_grads,
    exact_hidden_logits,
    fused_extra_bounds,
    reference_hidden_logits,
)
from tp_logprob.oracle.processed import (
    exact_processed_entropy,
    exact_processed_entropy_grad,
    exact_processed_logprob,
    exact_processed_logprob_grad,
    support_masked_logits,
)
from tp_logprob.oracle.reference import (
    reference_error_bounds,
    reference_logprob_grad,
    reference_logsumexp,
    reference_selected_logprob,
    reference_sharded_logprob,
)
from tp_logprob.oracle.reference_entropy import (
    reference_entropy,
    reference_entropy_error_bounds,
    reference_entropy_grad,
    reference_sharded_entropy,
)
from tp_logprob.oracle.support import ExactSupport, exact_support, replayed_support_mask
from tp_logprob.oracle.support_classify import (
    SupportClassification,
    admissible_support,
    classify_support,
)
from tp_logprob.oracle.support_tolerance import SupportMargins, support_margins
from tp_logprob.oracle.temperature import apply_temperature
from tp_logprob.oracle.tolerance import LogprobTolerance, tolerance
from tp_logprob.oracle.ulp import ulp_distance

__all__ = [
    "ExactSupport",
    "FastPathCounts",
    "LogprobTolerance",
    "SupportClassification",
    "SupportMargins",
    "admissible_support",
    "apply_temperature",
    "classify_support",
    "dot_product_error_bound",
    "exact_entropy",
    "exact_entropy_grad",
    "exact_hidden_grads",
    "exact_hidden_logits",
    "exact_logprob_grad",
    "exact_logsumexp",
    "exact_processed_entropy",
    "exact_processed_entropy_grad",
    "exact_processed_logprob",
    "exact_processed_logprob_grad",
    "exact_selected_logprob",
    "exact_support",
    "fast_path_stats",
    "fused_extra_bounds",
    "reference_entropy",
    "reference_entropy_error_bounds",
    "reference_entropy_grad",
    "reference_error_bounds",
    "reference_hidden_logits",
    "reference_logprob_grad",
    "reference_logsumexp",
    "reference_selected_logprob",
    "reference_sharded_entropy",
    "reference_sharded_logprob",
    "replayed_support_mask",
    "support_margins",
    "support_masked_logits",
    "tolerance",
    "ulp_distance",
]
