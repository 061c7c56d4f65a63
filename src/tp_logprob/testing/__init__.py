"""Asserts for other projects' tests: a kernel's logprobs against the exact oracle, in one line.

``assert_logprob_close`` judges ``selected_logp``, ``lse``, entropy and the gradient
within the property suite's tolerance table (``docs/tolerances.md``);
``assert_support_admissible`` an engine's kept set under top-k / top-p / min-p;
``assert_batch_invariant`` and ``assert_bitwise_across_tp`` the determinism a kernel
claims. Each raises ``AssertionError`` naming the worst row and column (or the rows
that differ), the observed and exact values and the error against its bound, as
``torch.testing.assert_close`` does for plain tensors. Numpy inputs never import
torch; the determinism asserts run an op, so they do.

>>> import numpy as np
>>> from tp_logprob.testing import assert_logprob_close
>>> logits = np.array([[0.0, 0.0], [1.0, 3.0]], np.float32)
>>> assert_logprob_close(np.array([-0.6931472, -0.126928], np.float32), logits, [1, 1])
"""

from __future__ import annotations

from tp_logprob.testing._close import assert_logprob_close
from tp_logprob.testing._determinism import assert_batch_invariant, assert_bitwise_across_tp
from tp_logprob.testing._support import assert_support_admissible

__all__ = [
    "assert_batch_invariant",
    "assert_bitwise_across_tp",
    "assert_logprob_close",
    "assert_support_admissible",
]
