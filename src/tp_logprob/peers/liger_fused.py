"""Liger-Kernel's fused linear cross entropy as a hidden-input tp-logprob backend (TP=1).

Wraps ``liger_kernel.ops.fused_linear_cross_entropy.LigerFusedLinearCrossEntropyFunction``
with ``reduction="none"`` and no class weight, smoothing, z-loss, softcap or token
scaling. Liger splits the rows into chunks of about ``N / ceil(V / H)`` rows, forms
each chunk's logits with one torch matmul ``hidden @ W.T (+ bias)`` *in the input
dtype*, and runs its cross-entropy Triton kernel (``ops/cross_entropy.py``, one
program per row, online softmax in fp32) on that chunk. With ``reduction="none"``
the gradient is deferred to the backward, which recomputes the chunks
(``fused_linear_cross_entropy.py:521-528``). On CPU the kernel runs through the
Triton interpreter (``TRITON_INTERPRET=1`` before triton is first imported).

Releases (:data:`SERVED`, read from each release's ``forward``): per-token losses
come back from 0.5.3 to 0.5.8 and from 0.6.3 on. Before 0.5.3 the forward sums
the losses whatever the reduction, and from 0.5.9 to 0.6.2 its ``reduction ==
"none"`` branch is commented out, so it sums them again: those releases are
refused by name (:class:`~tp_logprob.peers._releases.UnservedReleaseError`).
:func:`liger_arguments` spells the positional call of each served release
(``accum_dtype`` and ``use_token_scaling`` from 0.6.2 and 0.6.3, token accuracy from
0.6.4, predicted tokens from 0.8.0). Before 0.8.2 the gradient of
``reduction="none"`` is computed in the forward and scaled in the backward by the
*first* element of the upstream gradient (``element_mul_kernel`` loads one value),
so every row's gradient is wrong unless the upstream gradient is uniform; 0.8.2
defers the gradient to the backward. Verified with liger-kernel 0.8.5 (the
conformance run) and, with this adapter's tests under ``nox -s peer_releases``, the
releases ``tools/conformance/releases.py`` lists.

Capability, from ``ops/fused_linear_cross_entropy.py`` (``FLCE`` below) and
``ops/cross_entropy.py`` (``CE``):

- TP=1 only: the kernel normalizes over every row of the weight it is given;
- no vocabulary padding, for the same reason: padding rows would be live columns;
- mask mode ``ignore_index`` only: a row is skipped when its target equals
  ``ignore_index`` (CE:104-116); any other target is read unchecked (CE:142; FLCE
  has no bounds check), so an inactive row's garbage target is not served;
- fp32 only: the chunk's logits are the matmul's output in the input dtype
  (FLCE:168), so bf16/fp16 logits are rounded to 8/11 bits before the fp32 softmax;
- bias: added to each logits chunk (FLCE:169-170);
- train and infer;
- ``fixed_topology``, the weakest scope a backend can declare, and it does not
  fully hold: each chunk's matmul has ``min(next_pow2(ceil(N / ceil(V / H))), N)``
  rows (FLCE:103-105), and a matmul's bits for a row depend on that shape, so a
  row's result depends on N (the suite's batch-invariance property fails; run to
  run it is reproducible);
- no temperature (``softcap`` is a tanh cap, another function), no entropy.

Glue (see :mod:`tp_logprob.peers._glue`):

- Liger's matmul follows torch's fp32 matmul precision, a setting of the whole
  process (FLCE:168): the adapter refuses a call unless it gives full fp32 products
  (``"highest"``), as ``allow_tf32=False`` needs, and never changes it;
- ``selected_logp = 0.0 - loss`` (never ``-0.0``); Liger does not write into
  ``hidden``, ``weight`` or ``bias`` (the logits chunk is its own buffer), so no
  private copy is needed;
- Liger returns no LSE. With ``return_predicted_tokens=True`` (0.8.0 on) its kernel
  also returns each row's argmax ``a`` (CE:164-174; the first index of the maximum,
  ``-1`` only on ignored rows, which a contract Liger serves never has: every
  token is active and ``ignore_index`` lies outside ``[0, V)``); before 0.8.0 ``a``
  is the argmax of the adapter's own float64 logits
  (:func:`~tp_logprob.peers._glue.argmax_logits`, an ``[N, V]`` product in chunks).
  A second call with target ``a`` gives ``lse - x[a]`` (the kernel's own ``m + log
  d`` minus its ``x[a]``), and ``lse = x[a] + that``, with ``x[a] = hidden . W[a]
  (+ bias[a])`` computed by the adapter as one float64 dot product per row (nearly
  exact; Liger's own ``x[a]`` is not exposed). Rows whose ``x[a]`` is ``+-inf`` get
  ``lse = x[a]`` (:func:`lse_from_max`). Adding the target's loss back to the
  target logit instead would cancel catastrophically when the target's
  probability is tiny. The second call's input needs a gradient (a detached copy that
  does), because 0.6.3 to 0.7.x crash on an input that needs none: 0.6.3 reads its
  gradient buffers unassigned, 0.6.4 to 0.7.x detach a bias gradient left ``None``; the
  caller's own call under ``torch.no_grad`` (an engine's) still meets those crashes,
  which the suite reports. Cost: a second Liger pass (another chunked matmul over the
  whole vocabulary) and an ``[N, H]`` gather of weight rows, in chunks;
  ``export_lse=False`` skips both. Error: the LSE combines Liger's logits
  (through ``lse - x[a]``) with a nearly exact ``x[a]``, so its distance to the
  exact LSE may reach twice the dot-product error bound, not once.

Variants ("what users assume", each the same op): ``assume_padding``,
``assume_16bit``. There is no ``assume_inactive_tokens``: an inactive row's
out-of-range target (the suite draws up to 2^40) makes the kernel load from
outside the logits chunk, which crashes the interpreter's process.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from tp_logprob.contract import DeterminismScope, LogprobContract, LogprobDType, MaskMode
from tp_logprob.peers._glue import (
    argmax_logits,
    check_hidden_inputs,
    claiming,
    fused_peer_capability,
    lse_from_max,
    selected_from_loss,
)
from tp_logprob.peers._releases import Release, ServedReleases
from tp_logprob.result import LogprobResult

__all__ = [
    "CAPABILITY",
    "SERVED",
    "VERIFIED_VERSIONS",
    "assume_16bit",
    "assume_batch_invariant",
    "assume_padding",
    "honest",
    "liger_arguments",
    "liger_fused_logprob",
]

SERVED = ServedReleases(
    "liger-kernel",
    (((0, 5, 3), (0, 5, 9)), ((0, 6, 3), (0, 9))),
    'the others sum the losses under reduction="none" (before 0.5.3, and 0.5.9 to 0.6.2), '
    "and 0.9 is not yet verified",
)
"""The releases whose fused linear cross entropy returns per-token losses."""

VERIFIED_VERSIONS = str(SERVED)

_SCALING_FROM = (0, 6, 3)  # ``accum_dtype`` (0.6.2) and ``use_token_scaling`` after ``z_loss``
_TOKEN_ACCURACY_FROM = (0, 6, 4)  # then ``return_token_accuracy``
PREDICTED_TOKENS_FROM = (0, 8, 0)
"""The first release that returns each row's argmax (``return_predicted_tokens``)."""

CAPABILITY = fused_peer_capability("liger_flce", MaskMode.IGNORE_INDEX, supports_bias=True)

_NEVER_IGNORED = -1
"""``ignore_index`` for the LSE call, whose targets are argmaxes (``>= 0``)."""

_DOT_ROWS = 1024
"""Rows per float64 ``x[a]`` chunk: the gathered weight rows stay ``_DOT_ROWS x H``."""


def liger_fused_logprob(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
    *,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> LogprobResult:
    """``(selected_logp, lse)`` from Liger's fused linear cross entropy."""
    check_hidden_inputs(
        CAPABILITY.backend_id, hidden, targets, contract, group, weight, bias,
        logits_backend="liger_ce"
    )  # fmt: skip
    function, release = _liger_function(hidden.device)
    targets = targets.contiguous()
    ignore_index = contract.mask.ignore_index
    # The interpreter evaluates the kernel with numpy, which warns where the GPU is
    # silent (inf - inf, all-NaN blocks on special rows); the values are the kernel's
    # either way. np.errstate is the calling thread's; numpy's all-NaN warning goes
    # through the warnings filters, the whole process's, which are the caller's to set.
    with np.errstate(all="ignore"):
        outputs = function.apply(
            hidden, weight, targets, bias, *liger_arguments(release, ignore_index)
        )
        loss = outputs[0]
        lse = None
        if contract.export_lse:
            with torch.no_grad():
                argmax = outputs[3] if release >= PREDICTED_TOKENS_FROM else None
                lse = _lse(function, release, hidden.detach(), weight.detach(), bias, argmax)
    return LogprobResult(selected_from_loss(loss), lse)


def liger_arguments(release: Release, ignore_index: int) -> tuple[Any, ...]:
    """``LigerFusedLinearCrossEntropyFunction.apply``'s arguments after ``(input, weight,
    target, bias)`` in a served ``release``: no class weight, z-loss, smoothing, softcap or
    token scaling, ``reduction="none"``, and each row's argmax where the release returns it.
    """
    arguments: tuple[Any, ...] = (None, ignore_index, 0.0, 0.0, "none", None, False)
    if release >= _SCALING_FROM:
        arguments += (None, False)  # accum_dtype, use_token_scaling
    if release >= _TOKEN_ACCURACY_FROM:
        arguments += (False,)  # return_token_accuracy
    if release >= PREDICTED_TOKENS_FROM:
        arguments += (True,)  # return_predicted_tokens
    return arguments


def _lse(
    function: Any,
    release: Release,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    argmax: torch.Tensor | None,
) -> torch.Tensor:
    """``x[a] + (lse - x[a])`` with ``a`` each row's argmax; see the module docstring."""
    bias = None if bias is None else bias.detach()
    if argmax is None:
        argmax, x_top = argmax_logits(hidden, weight, bias)
    else:
        argmax = argmax.to(torch.int64)
        x_top = _logits_at(hidden, weight, bias, argmax)
    arguments = liger_arguments(release, _NEVER_IGNORED)
    # An input that needs a gradient: 0.6.3 to 0.7.x crash on one that does not.
    shift = function.apply(hidden.detach().requires_grad_(), weight, argmax, bias, *arguments)[0]
    return lse_from_max(x_top, shift)


def _logits_at(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, columns: torch.Tensor
) -> torch.Tensor:
    """``x[t, columns[t]]`` as float64 dot products rounded once to fp32, ``[N]``."""
    out = torch.empty(hidden.shape[0], dtype=torch.float64, device=hidden.device)
    for begin in range(0, hidden.shape[0], _DOT_ROWS):
        end = min(begin + _DOT_ROWS, hidden.shape[0])
        rows = weight[columns[begin:end]].to(torch.float64)
        dots = (hidden[begin:end].to(torch.float64) * rows).sum(dim=1)
        if bias is not None:
            dots = dots + bias[columns[begin:end]].to(torch.float64)
        out[begin:end] = dots
    return out.to(torch.float32)


def _liger_function(device: torch.device) -> tuple[Any, Release]:
    """Liger's autograd function and the installed release, checked before the import."""
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "Liger's fused linear cross entropy runs a Triton kernel: on CPU it runs only "
            "through the Triton interpreter; set TRITON_INTERPRET=1 before triton is "
            "first imported"
        )
    release = SERVED.installed()
    from liger_kernel.ops.fused_linear_cross_entropy import (
        LigerFusedLinearCrossEntropyFunction,
    )

    return LigerFusedLinearCrossEntropyFunction, release


honest = (liger_fused_logprob, CAPABILITY)
"""The honest backend: ``--tp-logprob-backend=tp_logprob.peers.liger_fused:honest``."""

assume_padding = claiming(honest, "assume_padding", supports_vocab_padding=True)
assume_16bit = claiming(honest, "assume_16bit", dtypes=frozenset(LogprobDType))
assume_batch_invariant = claiming(
    honest,
    "assume_batch_invariant",
    determinism_scopes=frozenset({DeterminismScope.FIXED_TOPOLOGY}),
)
