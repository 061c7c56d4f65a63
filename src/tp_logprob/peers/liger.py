"""Liger-Kernel's Triton cross entropy as a tp-logprob backend (TP=1).

Wraps ``liger_kernel.ops.cross_entropy.LigerCrossEntropyFunction`` with
``reduction="none"`` and no weight, smoothing, z-loss or softcap: the per-token
loss is ``lse - x[target]``, computed by one Triton program per row (online
softmax over blocks of ``min(32768, next_pow2(V))`` columns on CUDA) in fp32.
On CPU the kernel runs through the Triton interpreter (``TRITON_INTERPRET=1``
before triton is first imported). The adapter calls
``LigerCrossEntropyFunction.apply`` the way the installed release spells it
(:func:`liger_arguments`), from 0.4.1 (the first release whose forward takes
``reduction`` and returns ``(loss, z_loss)``) to 0.8 (:data:`SERVED`), so the
historical benchmark (``tools.history``) runs the suite on the release a user
pinned; any other release is refused before the call
(:class:`~tp_logprob.peers._releases.UnservedReleaseError`). Verified with
liger-kernel 0.8.5 (the conformance run) and, with this adapter's tests under
``nox -s peer_releases``, the releases ``tools/conformance/releases.py`` lists.

Capability, from Liger's docs and ``ops/cross_entropy.py``:

- TP=1 only: the kernel sees the whole vocabulary of one row;
- no vocabulary padding: every column of the input counts;
- mask mode ``ignore_index`` only: a row is skipped when its target equals
  ``ignore_index``; any other target must lie in ``[0, V)`` (Liger asserts);
- fp32 only: the loss is stored in the *input* dtype, so bf16/fp16 inputs give a
  loss rounded to 8/11 bits;
- train and infer (the gradient is computed in the forward pass);
- ``fixed_topology``: one program per row, so rows are batch invariant;
- no temperature (``softcap`` is a different function), no entropy.

Glue (see :mod:`tp_logprob.peers._glue`):

- Liger zeroes ignored rows of its input, and stores the gradient in it when the
  input requires grad: it gets a private copy;
- ``selected_logp = 0.0 - loss`` (never ``-0.0``);
- Liger returns no LSE. The adapter calls the same kernel a second time with each
  row's argmax as the target: that loss is ``lse - M`` (the kernel's own
  ``m + log d`` minus ``M``, within rounding), so ``lse = M + loss``, with ``lse = M``
  on rows whose max ``M`` is ``+-inf`` (where the kernel's ``x - m`` is NaN). Adding
  the target's loss back to the target logit instead would cancel catastrophically
  when the target's probability is tiny. The second call costs a second pass.

Variants ("what users assume", each the same op): ``assume_padding``,
``assume_16bit``, ``assume_inactive_tokens``, ``assume_cross_tp_bitwise``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from tp_logprob.capability import LogprobBackendCapability
from tp_logprob.contract import (
    DeterminismScope,
    LogprobContract,
    LogprobDType,
    LogprobRole,
    MaskMode,
)
from tp_logprob.kernels.validation import check_op_inputs
from tp_logprob.peers._glue import claiming, lse_from_max, private_copy, selected_from_loss
from tp_logprob.peers._releases import Release, ServedReleases
from tp_logprob.result import LogprobResult

__all__ = [
    "CAPABILITY",
    "SERVED",
    "VERIFIED_VERSIONS",
    "assume_16bit",
    "assume_cross_tp_bitwise",
    "assume_inactive_tokens",
    "assume_padding",
    "honest",
    "liger_arguments",
    "liger_logprob",
]

SERVED = ServedReleases(
    "liger-kernel",
    (((0, 4, 1), (0, 9)),),
    "before 0.4.1 the forward takes no reduction, and 0.9 is not yet verified",
)
"""The releases whose ``LigerCrossEntropyFunction.forward`` :func:`liger_arguments` spells."""

VERIFIED_VERSIONS = str(SERVED)
_WEIGHT_FROM = (0, 5, 3)  # ``weight`` (class weights) after ``target``
_TOKEN_ACCURACY_FROM = (0, 6, 4)  # ``return_token_accuracy`` after ``return_z_loss``
_PREDICTED_TOKENS_FROM = (0, 8, 0)  # then ``return_predicted_tokens``

CAPABILITY = LogprobBackendCapability(
    backend_id="liger_ce",
    roles=frozenset({LogprobRole.TRAIN, LogprobRole.INFER}),
    dtypes=frozenset({LogprobDType.FP32}),
    tp_world_sizes=frozenset({1}),
    cp_world_sizes=frozenset({1}),
    supports_vocab_padding=False,
    mask_modes=frozenset({MaskMode.IGNORE_INDEX}),
    exports_vocab_lse=True,
    determinism_scopes=frozenset({DeterminismScope.FIXED_TOPOLOGY}),
)


def liger_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
) -> LogprobResult:
    """``(selected_logp, lse)`` from Liger's per-token cross entropy."""
    check_op_inputs(local_logits, targets, contract, group)
    function, release = _liger_function(local_logits.device)
    ignore_index = contract.mask.ignore_index
    targets = targets.contiguous()
    # The interpreter evaluates the kernel with numpy, which warns where the GPU is
    # silent (inf - inf, all-NaN blocks on special rows); the values are the kernel's
    # either way. np.errstate is the calling thread's; numpy's all-NaN warning goes
    # through the warnings filters, the whole process's, which are the caller's to set.
    with np.errstate(all="ignore"):
        loss = function.apply(
            private_copy(local_logits), targets, *liger_arguments(release, ignore_index)
        )[0]
        lse = None
        if contract.export_lse:
            with torch.no_grad():
                logits = local_logits.detach()
                row_max = logits.amax(dim=1) if logits.shape[1] else logits.new_empty(0)
                argmax = logits.argmax(dim=1).to(targets.dtype)
                shift = function.apply(
                    private_copy(logits), argmax, *liger_arguments(release, ignore_index)
                )[0]
                lse = lse_from_max(row_max, shift)
    return LogprobResult(selected_from_loss(loss), lse)


def liger_arguments(release: Release, ignore_index: int) -> tuple[Any, ...]:
    """``LigerCrossEntropyFunction.apply``'s arguments after ``(input, target)`` in ``release``.

    No class weight, z-loss, smoothing or softcap, ``reduction="none"``; the
    positional list grew over the releases (``weight`` in 0.5.3, token accuracy in
    0.6.4, predicted tokens in 0.8.0), read from each release's ``forward``.
    """
    weight: tuple[Any, ...] = (None,) if release >= _WEIGHT_FROM else ()
    flags = 1 + (release >= _TOKEN_ACCURACY_FROM) + (release >= _PREDICTED_TOKENS_FROM)
    return (*weight, ignore_index, 0.0, 0.0, "none", None, *(False,) * flags)


def _liger_function(device: torch.device) -> tuple[Any, Release]:
    """Liger's autograd function and the installed release, checked before the import."""
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "Liger's cross entropy is a Triton kernel: on CPU it runs only through the "
            "Triton interpreter; set TRITON_INTERPRET=1 before triton is first imported"
        )
    release = SERVED.installed()
    from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction

    return LigerCrossEntropyFunction, release


honest = (liger_logprob, CAPABILITY)
"""The honest backend: ``--tp-logprob-backend=tp_logprob.peers.liger:honest``."""

assume_padding = claiming(honest, "assume_padding", supports_vocab_padding=True)
assume_16bit = claiming(honest, "assume_16bit", dtypes=frozenset(LogprobDType))
assume_inactive_tokens = claiming(honest, "assume_inactive_tokens", mask_modes=frozenset(MaskMode))
assume_cross_tp_bitwise = claiming(
    honest,
    "assume_cross_tp_bitwise",
    determinism_scopes=frozenset({DeterminismScope.CROSS_TP_BITWISE}),
)
