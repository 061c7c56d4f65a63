"""The per-token logprobs of Liger-Kernel's chunked RL losses as a hidden-input backend (TP=1).

Liger's GRPO loss (``LigerFusedLinearGRPOLoss``, ``liger_kernel.chunked_loss``) and every
other loss on ``LigerFusedLinearPPOBase`` take the policy's per-token logprobs from one
public static method, ``LigerFusedLinearPPOBase.chunk_forward(input_chunk, weight,
selected_token_ids, bias, temperature)``, "selected-token log probabilities without
materializing full vocab logits", before any loss math (its reference-model logprobs
too). The adapter calls that method, so the value it reads is the logprob by Liger's
own definition, not one inverted from a loss. The method runs
``_ChunkedSelectiveLogProbFunction``: chunks of 2048 rows by 4096 vocabulary columns,
each chunk's logits ``(hidden @ W.T).float()`` (the matmul in the input dtype), the bias
added in fp32, multiplied by ``1 / T``, and folded into an online logsumexp in fp32 (a
running maximum rescaling the sum of ``exp(z - max)``); the target's logit is picked out
of the chunk that holds it (a target in no chunk adds 0), and the logprob is
``z[target] - (max + log sum)``. The backward recomputes each chunk. Pure torch: no
Triton.

Releases (:data:`SERVED`): ``chunk_forward`` returns the per-token logprobs through
``_ChunkedSelectiveLogProbFunction`` from 0.8.0 (0.7 returns the whole ``log_softmax``
and the logits instead) to 0.8.5, with the same arguments; 0.8.4 has the backward form
the weight and bias gradients only where they are needed, the forward unchanged.

Capability, from ``chunked_loss/fused_linear_ppo.py``:

- TP=1 (the softmax is over every row of the weight it is given); no vocabulary
  padding; bias;
- fp32 only: a chunk's logits are the matmul's output in the input dtype;
- temperature: ``z = x * (1 / T)``, a multiplication by the fp32 rounding of ``1 / T``
  (the losses' ``temperature`` argument), not the contract's division by ``fp32(T)``;
- no entropy; mask mode ``all_active``: ``chunk_forward`` has no mask (the losses mask
  afterwards with their ``attention_mask``); a target outside ``[0, V)`` is in no chunk,
  so its logit stays 0;
- train and infer; ``run_to_run``: a chunk's matmul has ``min(N, 2048)`` rows, and a
  matmul's bits for a row may depend on its shape.

Glue: the hidden states go in as one sequence (``[1, N, H]``), as one of the losses'
batch chunks; the adapter refuses a process whose fp32 matmul precision is not full
(:func:`~tp_logprob.peers._glue.check_hidden_inputs`). Liger returns no LSE: a second
call with each row's argmax ``a`` as the target gives ``z[a] - lse``
(:func:`~tp_logprob.peers._glue.lse_from_argmax_logprob`).

Variants ("what users assume", each the same op): ``assume_padding``, ``assume_16bit``,
``assume_inactive_tokens``, ``assume_batch_invariant``.
"""

from __future__ import annotations

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
    "liger_ppo_logprob",
    *FUSED_PEER_VARIANTS,
]

SERVED = ServedReleases(
    "liger-kernel",
    (((0, 8), (0, 9)),),
    "before 0.8.0 chunk_forward returns the whole log_softmax and the logits, and 0.9 is "
    "not yet verified",
)
"""The releases whose ``LigerFusedLinearPPOBase.chunk_forward`` returns per-token logprobs."""

VERIFIED_VERSIONS = str(SERVED)

CAPABILITY = fused_peer_capability(
    "liger_ppo_chunk_forward",
    MaskMode.ALL_ACTIVE,
    supports_bias=True,
    supports_temperature=True,
)


@imported_once
def _chunk_forward() -> Any:
    SERVED.installed()
    from liger_kernel.chunked_loss.fused_linear_ppo import LigerFusedLinearPPOBase

    return LigerFusedLinearPPOBase.chunk_forward


def _call(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """Liger's logprobs of ``targets``, the rows as one sequence of a batch chunk."""
    logprobs: torch.Tensor = _chunk_forward()(
        hidden[None], weight, targets[None], bias, temperature
    )
    return logprobs[0]


def liger_ppo_logprob(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
    *,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> LogprobResult:
    """``(selected_logp, lse)`` from ``LigerFusedLinearPPOBase.chunk_forward``."""
    check_hidden_inputs(
        CAPABILITY.backend_id, hidden, targets, contract, group, weight, bias,
        logits_backend="liger_ce",
    )  # fmt: skip
    temperature = contract.batch_temperature
    selected = _call(hidden, weight, bias, targets.long(), temperature)
    lse = None
    if contract.export_lse:
        lse = lse_from_argmax_logprob(
            hidden,
            weight,
            bias,
            contract.temperature_fp32,
            lambda h, w, b, top: _call(h, w, b, top, temperature),
        )
    return LogprobResult(selected.float(), lse)


(
    honest,
    assume_padding,
    assume_16bit,
    assume_inactive_tokens,
    assume_batch_invariant,
) = fused_peer_backends(liger_ppo_logprob, CAPABILITY)
"""The honest backend: ``--tp-logprob-backend=tp_logprob.peers.liger_ppo:honest``."""
