"""TRL's chunked LM-head logprob and entropy as a hidden-input backend (TP=1).

``trl.kernels.ChunkedLogProbFunction`` is the autograd function behind TRL's fused LM
head (``trl.trainer.utils.add_fused_lm_head``, which its GRPO trainer installs): the
per-token logprobs of ``hidden @ W.T (+ bias)`` without the ``[N, V]`` logits. It
projects tiles of ``min(N, 4096)`` tokens by ``chunk_size`` vocabulary columns with one
``torch.mm`` each, in the input dtype (autocast's where that is on), and folds each tile
into online-logsumexp statistics in fp32: ``z = x * (1 / T)``, a running maximum, the
sum of ``exp(z - max)`` and, for the entropy, of ``exp(z - max) * z``; the logprob is
``z[target] - (max + log sum)``. On CUDA and XPU a Triton kernel folds each tile; on
other devices (this adapter's CPU runs) 1.16 folds it with torch ops (``_forward_tile``),
and 1.15 runs its Triton kernel, so on CPU it needs the Triton interpreter. The backward
recomputes each tile. The adapter calls it as the fused head does: ``chunk_size`` 32768
(``_CHUNKED_LOGPROB_CHUNK_SIZE``), no softcap, ``logit_scale`` 1, and ``outputs``
``("entropy",)`` where the contract asks for the entropy, ``()`` otherwise.

Releases (:data:`SERVED`): the function is public in ``trl.kernels`` from 1.15.0 (1.2 to
1.14 keep a private ``_ChunkedLogProbFunction`` in ``trl.trainer.utils``, with other
arguments in each release); the arguments are the same in 1.15 and 1.16.

Capability, from ``kernels/chunked_logprob.py``:

- TP=1 (the softmax is over every row of the weight it is given); no vocabulary
  padding; bias;
- fp32 only: a tile's logits are the matmul's output in the input dtype;
- temperature: ``z = x * (1 / T)``, a multiplication by the fp32 rounding of ``1 / T``,
  not the contract's division by ``fp32(T)`` (they differ by up to an ulp of ``z``);
- entropy;
- mask mode ``all_active``: the function has no mask (the fused head scores every
  position and drops the ``-100`` labels afterwards); a target outside ``[0, V)`` is
  never found in a tile, so its logit stays 0;
- train and infer; ``run_to_run``: a tile's matmul has ``min(N, 4096)`` rows, and a
  matmul's bits for a row may depend on its shape.

Glue: the tiles' ``torch.mm`` follows torch's fp32 matmul precision, a setting of the
whole process: the adapter refuses a call unless it gives full fp32 products
(``"highest"``), as ``allow_tf32=False`` needs, and never changes it. TRL returns no
LSE: a second call with each row's argmax ``a`` as the target gives ``z[a] -
lse``, and ``lse = z[a] - that``, with ``a`` and ``x[a]`` from float64 products of the
adapter's own rounded once to fp32 (:func:`~tp_logprob.peers._glue.argmax_logits`),
``z[a] = x[a] / fp32(T)``, and ``lse = z[a]`` where that is ``+-inf``.

Variants ("what users assume", each the same op, without entropy so that what fails is
the assumption): ``assume_padding``, ``assume_16bit``, ``assume_inactive_tokens``,
``assume_batch_invariant``.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from tp_logprob.contract import LogprobContract, MaskMode
from tp_logprob.peers._glue import (
    FUSED_PEER_VARIANTS,
    check_hidden_inputs,
    fused_peer_backends,
    fused_peer_capability,
    imported_once,
    lse_from_argmax_logprob,
)
from tp_logprob.peers._releases import ServedReleases
from tp_logprob.result import LogprobResult

__all__ = [
    "CAPABILITY",
    "CHUNK_SIZE",
    "SERVED",
    "VERIFIED_VERSIONS",
    "honest",
    "trl_chunked_logprob",
    *FUSED_PEER_VARIANTS,
]

SERVED = ServedReleases(
    "trl",
    (((1, 15), (1, 17)),),
    "trl.kernels.ChunkedLogProbFunction arrived in 1.15 (before, a private function with "
    "other arguments), and 1.17 is not yet verified",
)
"""The trl releases whose ``trl.kernels`` exports ``ChunkedLogProbFunction``."""

VERIFIED_VERSIONS = str(SERVED)

CHUNK_SIZE = 32768
"""Vocabulary columns per tile, as TRL's fused LM head passes them."""

CAPABILITY = fused_peer_capability(
    "trl_chunked_logprob",
    MaskMode.ALL_ACTIVE,
    supports_bias=True,
    supports_temperature=True,
    exports_entropy=True,
)


@imported_once
def _function() -> Any:
    SERVED.installed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' import-time notices
        from trl.kernels import ChunkedLogProbFunction
    return ChunkedLogProbFunction


def _call(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
    entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """TRL's logprobs (and entropy where asked) of ``targets``."""
    outputs = ("entropy",) if entropy else ()
    logprobs, entropies, *_ = _function().apply(
        hidden, weight, bias, targets, temperature, CHUNK_SIZE, None, 1.0, outputs
    )
    return logprobs, entropies


def trl_chunked_logprob(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
    *,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> LogprobResult:
    """``(selected_logp, lse[, entropy])`` from TRL's ``ChunkedLogProbFunction``."""
    check_hidden_inputs(
        CAPABILITY.backend_id, hidden, targets, contract, group, weight, bias,
        logits_backend="trl_selective_log_softmax",
    )  # fmt: skip
    temperature = contract.batch_temperature
    selected, entropy = _call(
        hidden, weight, bias, targets.long(), temperature, contract.export_entropy
    )
    lse = None
    if contract.export_lse:
        lse = lse_from_argmax_logprob(
            hidden,
            weight,
            bias,
            contract.temperature_fp32,
            lambda h, w, b, top: _call(h, w, b, top, temperature, False)[0],
        )
    exported = entropy.float() if contract.export_entropy and entropy is not None else None
    return LogprobResult(selected.float(), lse, exported)


(
    honest,
    assume_padding,
    assume_16bit,
    assume_inactive_tokens,
    assume_batch_invariant,
) = fused_peer_backends(trl_chunked_logprob, CAPABILITY)
"""The honest backend: ``--tp-logprob-backend=tp_logprob.peers.trl_chunked:honest``."""
