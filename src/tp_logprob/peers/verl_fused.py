"""verl's fused LM-head logprob and entropy as a hidden-input backend (TP=1), its torch path.

verl's actors compute per-token logprobs and entropies from hidden states, without
materializing the logits, when ``use_fused_kernels`` is set
(``verl.models.transformers.dense_common``): ``fused_kernel_options.impl_backend``
picks ``"torch"``, ``verl.utils.experimental.torch_functional.FusedLinearForPPO``, or
``"triton"``, ``verl.utils.kernel.linear_cross_entropy``.

This adapter wraps ``FusedLinearForPPO`` (``impl_backend="torch"``, the default,
``chunk_size=512``): for each chunk of 512 rows, ``logits = (hidden @ W.T) /
temperature`` in the input dtype, then ``.float()``, ``log_softmax(logits).gather``
for the logprob (flash-attn's Triton ``cross_entropy_loss`` instead when flash-attn
imports, which it does not here) and ``logsumexp(logits) - sum(softmax(logits) *
logits)`` for the entropy, returned in the input dtype; the backward recomputes each
chunk's logits. Verified with verl 0.9.1 (the conformance run) and, with
``tests/peers/test_verl_fused.py`` under ``nox -s peer_release``, 0.4.1, 0.5.0,
0.6.1, 0.7.1, 0.8.0 and 0.9.0 (``>=0.4.1,<0.10``; before 0.8 the logprob is cast
back to the input dtype, the same for fp32).

verl 0.9 adds ``impl_backend="liger"``: Liger-Kernel's
``LigerFusedLinearScaledCrossEntropyFunction``, which runs a CuteDSL kernel on SM90
GPUs and elsewhere (CPU included) ``_FusedLinearPPOFallbackFunction``, by its own
comment a port of this path (the same formulas and 512-row chunks), so the report has
no row of its own for it.

``linear_cross_entropy`` (Triton) does not run on CPU, not even under the Triton
interpreter: its forward opens ``torch.cuda.nvtx.range`` first, which raises
``RuntimeError`` ("NVTX functions not installed") on a CPU build of torch, and its
kernels' launcher then asserts ``hidden.is_cuda`` and ``hidden_size % 128 == 0``
(``verl/utils/kernel/kernels.py``, ``efficient_entropy_forward``).
``tests/peers/test_verl_fused.py`` pins that, and the report says so.

Capability, from ``experimental/torch_functional.py``:

- TP=1 (the softmax is over every row of the weight it is given); no vocabulary
  padding; no bias (the op takes the vocabulary weights alone);
- fp32 only: the logits are the matmul's output in the input dtype (and divided by
  the temperature there), so bf16/fp16 logits carry 8/11 bits before the fp32
  softmax, and the entropy is returned in the input dtype;
- temperature: ``fp32 logits / T`` with ``T`` a Python float, after the matmul;
- entropy;
- mask mode ``all_active``: no ``ignore_index``, every target is gathered, so an
  out-of-range target raises;
- train and infer; ``run_to_run``: a chunk's matmul has ``min(512, rows left)`` rows,
  and a matmul's bits for a row depend on its shape, so a row may depend on the batch.

Glue (see :mod:`tp_logprob.peers._glue`): the call needs torch's ``"highest"`` fp32
matmul precision (no TF32; the adapter refuses another and never changes it: the
setting is the whole process's). verl returns no LSE: a second call with each row's
argmax ``a`` as the target gives ``z[a] - lse``, and ``lse = z[a] - that``, with
``z[a] = fp32(x[a]) / fp32(T)`` and ``a``, ``x[a]`` from float64 products of the
adapter's own, rounded once to fp32 (:func:`~tp_logprob.peers._glue.argmax_logits`),
``lse = z[a]`` where that is ``+-inf``; so the LSE's distance to the exact one may
reach twice the dot-product error bound, as for ``cce_linear_cross_entropy``.

Variants ("what users assume", each the same op, without entropy so that what fails
is the assumption): ``assume_padding``, ``assume_16bit``, ``assume_inactive_tokens``,
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
    "SERVED",
    "VERIFIED_VERSIONS",
    "honest",
    "triton_linear_cross_entropy",
    "verl_fused_logprob",
    *FUSED_PEER_VARIANTS,
]

SERVED = ServedReleases(
    "verl",
    (((0, 4, 1), (0, 10)),),
    "the releases outside are not yet verified",
)
"""The releases of verl the adapter serves; it refuses the others before any work."""

VERIFIED_VERSIONS = str(SERVED)

CAPABILITY = fused_peer_capability(
    "verl_fused_linear_for_ppo",
    MaskMode.ALL_ACTIVE,
    supports_temperature=True,
    exports_entropy=True,
)


@imported_once
def _verl() -> dict[str, Any]:
    SERVED.installed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # import-time notices of verl's dependencies
        from verl.utils.experimental.torch_functional import FusedLinearForPPO

    return {"torch": FusedLinearForPPO()}  # impl_backend="torch", chunk_size=512


def triton_linear_cross_entropy() -> Any:
    """verl's Triton ``linear_cross_entropy`` (CUDA only; see the module docstring)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from verl.utils.kernel.linear_cross_entropy import linear_cross_entropy
    return linear_cross_entropy


def verl_fused_logprob(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
    *,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> LogprobResult:
    """``(selected_logp, lse[, entropy])`` from verl's ``FusedLinearForPPO``."""
    check_hidden_inputs(
        CAPABILITY.backend_id, hidden, targets, contract, group, weight, bias,
        no_bias="verl's FusedLinearForPPO takes the vocabulary weights alone",
    )  # fmt: skip
    fused, temperature = _verl()["torch"], contract.batch_temperature
    selected, entropy = fused(hidden, weight, targets.long(), temperature)
    lse = None
    if contract.export_lse:
        lse = lse_from_argmax_logprob(
            hidden,
            weight,
            None,
            contract.temperature_fp32,
            lambda h, w, _, top: fused(h, w, top, temperature)[0],
        )
    entropy = entropy.float() if contract.export_entropy else None
    return LogprobResult(selected.float(), lse, entropy)


(
    honest,
    assume_padding,
    assume_16bit,
    assume_inactive_tokens,
    assume_batch_invariant,
) = fused_peer_backends(verl_fused_logprob, CAPABILITY)
"""The honest backend: ``--tp-logprob-backend=tp_logprob.peers.verl_fused:honest``."""
