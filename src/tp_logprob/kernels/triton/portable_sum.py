"""``triton_portable``: ``triton_exact_sum`` with every ``exp`` and ``log`` portable.

The same three kernels and two all-gathers as ``triton_exact_sum`` (``exact_sum.py``:
maxima, int64 fixed-point sums, merge), launched with ``PORTABLE=True``: each
``exp(z - M)`` is ``portable_exp`` and each ``log S`` is ``portable_log``
(``portable_math.py``), and every launch passes ``enable_fp_fusion=False``. The other
operations were IEEE-exact already: ``div_rn`` for temperature, max, integer sums, the
int64 -> fp64 conversion, fp64 ``+ - /`` in the merge, and round-to-nearest conversions
to the output dtype. So the outputs are the same bits on every target, and the same as
``torch_portable`` (``kernels/portable_sum.py``), the torch twin, on CPU
(``docs/semantics.md``, ``cross_platform_bitwise``). Memory traffic is
``triton_exact_sum``'s; the portable ``exp`` costs about 20 fp32 operations a column
instead of ``ex2.approx`` and a multiply.

The ``train`` role's backward is ``logprob_grad_kernel`` with ``PORTABLE=True`` (its
``p = exp(z - LSE)`` by ``portable_exp``, launched without fp fusion): the gradient's
bits are the same on every target as well, and the same as ``torch_portable``'s.
"""

from __future__ import annotations

from typing import Any

from tp_logprob.comm import GroupHandle
from tp_logprob.contract import LogprobContract
from tp_logprob.errors import LogprobContractError
from tp_logprob.kernels.heterogeneous import by_rule_groups
from tp_logprob.kernels.triton.autograd import run_op
from tp_logprob.kernels.triton.exact_sum import exact_sum_forward
from tp_logprob.kernels.triton.inputs import Outputs, RankInputs
from tp_logprob.result import LogprobResult

__all__ = ["portable_forward", "triton_portable_logprob"]


@by_rule_groups
def triton_portable_logprob(
    local_logits: Any, targets: Any, contract: Any, group: GroupHandle | None = None
) -> LogprobResult:
    """One rank's ``(selected_logp, lse[, entropy])``: the same bits on every platform and
    for every shard layout.

    >>> # result = triton_portable_logprob(local_logits, targets, contract, group=handle)
    """
    return run_op(portable_forward, local_logits, targets, contract, group, portable=True)


def portable_forward(
    inputs: RankInputs, contract: LogprobContract, group: GroupHandle | None
) -> Outputs:
    """``exact_sum_forward`` with the portable kernels; the full vocabulary only."""
    if contract.support is not None:
        raise LogprobContractError(
            f"support={contract.support!r}: triton_portable serves the full vocabulary only "
            "(a recomputed support's threshold uses the platform's exp)"
        )
    return exact_sum_forward(inputs, contract, group, portable=True)
