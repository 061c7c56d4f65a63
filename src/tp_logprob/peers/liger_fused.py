"""Liger-Kernel's fused linear cross entropy as a hidden-input tp-logprob backend (TP=1).

Wraps ``liger_kernel.ops.fused_linear_cross_entropy.LigerFusedLinearCrossEntropyFunction``
with ``reduction="none"`` and no class weight, smoothing, z-loss, softcap or token
scaling. Liger splits the rows into chunks of about ``N / ceil(V / H)`` rows, forms
each chunk's logits with one torch matmul ``hidden @ W.T (+ bias)`` *in the input
dtype*, and runs its cross-entropy Triton kernel (``ops/cross_entropy.py``, one
program per row, online softmax in fp32) on that chunk. With ``reduction="none"``
the gradient is deferred to the backward, which recomputes the chunks
(``fused_linear_cross_entropy.py:521-528``). Verified with liger-kernel 0.8.5
(``>=0.8,<0.9``); on CPU the kernel runs through the Triton interpreter
(``TRITON_INTERPRET=1`` before triton is first imported).

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
- Liger returns no LSE. With ``return_predicted_tokens=True`` its kernel also
  returns each row's argmax ``a`` (CE:164-174; the first index of the maximum,
  ``-1`` only on ignored rows, which a contract Liger serves never has: every
  token is active and ``ignore_index`` lies outside ``[0, V)``). A second call
  with target ``a`` gives ``lse - x[a]`` (the kernel's own ``m + log d`` minus its
  ``x[a]``), and ``lse = x[a] + that``, with ``x[a] = hidden . W[a] (+ bias[a])``
  computed by the adapter as one float64 dot product per row (nearly exact;
  Liger's own ``x[a]`` is not exposed). Rows whose ``x[a]`` is ``+-inf`` get
  ``lse = x[a]`` (:func:`lse_from_max`). Adding the target's loss back to the
  target logit instead would cancel catastrophically when the target's
  probability is tiny. Cost: a second Liger pass (another chunked matmul over the
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
import warnings
from typing import Any

import numpy as np
import torch

from tp_logprob.contract import DeterminismScope, LogprobContract, LogprobDType, MaskMode
from tp_logprob.peers._glue import (
    check_hidden_inputs,
    claiming,
    fused_peer_capability,
    lse_from_max,
    selected_from_loss,
)
from tp_logprob.result import LogprobResult

__all__ = [
    "CAPABILITY",
    "VERIFIED_VERSIONS",
    "assume_16bit",
    "assume_padding",
    "honest",
    "liger_fused_logprob",
]

VERIFIED_VERSIONS = "liger-kernel>=0.8,<0.9"

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
    function = _liger_function(hidden.device)
    targets = targets.contiguous()
    # The interpreter evaluates the kernel with numpy, which warns where the GPU is
    # silent (inf - inf, all-NaN blocks on special rows); the values are the kernel's
    # either way. Liger serves TP=1 only, so no other rank thread shares the filters.
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        loss, argmax = _call(function, hidden, weight, bias, targets, contract.mask.ignore_index)
        lse = None
        if contract.export_lse:
            with torch.no_grad():
                lse = _lse(function, hidden.detach(), weight.detach(), bias, argmax)
    return LogprobResult(selected_from_loss(loss), lse)


def _call(
    function: Any,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    ignore_index: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Liger's per-token loss and argmax (``-1`` on ignored rows)."""
    loss, _, _, argmax = function.apply(
        hidden,
        weight,
        targets,
        bias,
        None,  # ce_weight
        ignore_index,
        0.0,  # lse_square_scale
        0.0,  # label_smoothing
        "none",
        None,  # softcap
        False,  # return_z_loss
        None,  # accum_dtype
        False,  # use_token_scaling
        False,  # return_token_accuracy
        True,  # return_predicted_tokens
    )
    return loss, argmax


def _lse(
    function: Any,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    argmax: torch.Tensor,
) -> torch.Tensor:
    """``x[a] + (lse - x[a])`` with ``a`` Liger's argmax; see the module docstring."""
    bias = None if bias is None else bias.detach()
    argmax = argmax.to(torch.int64)
    shift, _ = _call(function, hidden, weight, bias, argmax, _NEVER_IGNORED)
    return lse_from_max(_logits_at(hidden, weight, bias, argmax), shift)


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


def _liger_function(device: torch.device) -> Any:
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "Liger's fused linear cross entropy runs a Triton kernel: on CPU it runs only "
            "through the Triton interpreter; set TRITON_INTERPRET=1 before triton is "
            "first imported"
        )
    from liger_kernel.ops.fused_linear_cross_entropy import (
        LigerFusedLinearCrossEntropyFunction,
    )

    return LigerFusedLinearCrossEntropyFunction


honest = (liger_fused_logprob, CAPABILITY)
"""The honest backend: ``--tp-logprob-backend=tp_logprob.peers.liger_fused:honest``."""

assume_padding = claiming(honest, "assume_padding", supports_vocab_padding=True)
assume_16bit = claiming(honest, "assume_16bit", dtypes=frozenset(LogprobDType))
assume_batch_invariant = claiming(
    honest,
    "assume_batch_invariant",
    determinism_scopes=frozenset({DeterminismScope.FIXED_TOPOLOGY}),
)
