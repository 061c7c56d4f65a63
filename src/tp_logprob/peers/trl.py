"""TRL's ``selective_log_softmax`` (and ``selective_log_softmax_and_entropy``) as a backend.

These are the helpers TRL's GRPO and PPO trainers compute per-token logprobs and
entropies with (``trl.trainer.utils``). On CUDA and XPU they run TRL's fused Triton
kernel; everywhere else, including this adapter's CPU runs, a torch path:
``gather(logits) - logsumexp(logits)`` row by row for fp32, ``log_softmax`` row by
row for 16-bit inputs, ``-(exp(logp) * logp).sum()`` for the entropy, and
``logits / temperature`` first.

Releases (:data:`SERVED`, read from each release's ``trainer/utils.py``):
``selective_log_softmax(logits, index)`` arrived in 0.15.0; 1.14.0 added its
``temperature`` argument and ``selective_log_softmax_and_entropy``. Before 1.14 the
adapter divides the logits by the temperature itself, ``logits / temperature`` as
the trainers of those releases did before the call, and takes the entropy from
``entropy_from_logits`` (0.20.0 on; an entropy asked of an older release is refused,
:data:`ENTROPY_SERVED`). Verified with trl 1.16.0 (the conformance run) and, with
this adapter's tests under ``nox -s peer_releases``, the releases
``tools/conformance/releases.py`` lists, each on its CPU path.

Capability, from TRL's docstrings and source:

- TP=1 (the whole vocabulary of a row); no vocabulary padding;
- fp32 only: for bf16/fp16 the result is ``log_softmax`` in the input dtype, so a
  16-bit logprob;
- temperature: ``logits / temperature`` is one IEEE fp32 division by
  ``fp32(T)`` for fp32 logits, as the contract asks;
- entropy (``selective_log_softmax_and_entropy``);
- mask mode ``ignore_index`` only: ``row_mask`` zeroes masked rows *after* the
  gather, which raises on an out-of-range target, so masked rows still need valid
  targets, which the contract does not promise;
- train and infer; ``fixed_topology`` (one row at a time).

The "users assume" variants (``assume_padding``, ``assume_16bit``,
``assume_inactive_tokens``) claim no entropy, so that what fails is the assumption.

Glue: none for ``selected_logp`` (TRL returns the logprob itself). TRL returns
no LSE; the adapter calls ``selective_log_softmax`` again with each row's argmax as
the index: that logprob is ``z_max - lse`` (``z = x / T``), so ``lse = z_max -
logprob``, with ``lse = z_max`` where ``z_max`` is ``+-inf``.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.validation import check_op_inputs
from tp_logprob.peers._glue import (
    TORCH_HELPER_VARIANTS,
    imported_once,
    lse_from_max,
    torch_helper_backends,
)
from tp_logprob.peers._releases import ServedReleases
from tp_logprob.result import LogprobResult

__all__ = [
    "CAPABILITY",
    "ENTROPY_SERVED",
    "SERVED",
    "VERIFIED_VERSIONS",
    "honest",
    "trl_logprob",
    *TORCH_HELPER_VARIANTS,
]

SERVED = ServedReleases(
    "trl",
    (((0, 15), (1, 17)),),
    "selective_log_softmax arrived in 0.15, and 1.17 is not yet verified",
)
"""The trl releases whose ``selective_log_softmax`` the adapter calls."""

ENTROPY_SERVED = ServedReleases("trl", (((0, 20), (1, 17)),), "entropy_from_logits arrived in 0.20")
"""The trl releases that also give the entropy."""

VERIFIED_VERSIONS = str(SERVED)

_TEMPERATURE_FROM = (1, 14, 0)
"""The first release whose helpers take ``temperature`` (and with the joint helper)."""


@imported_once
def _trl() -> dict[str, Any]:
    release = SERVED.installed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' import-time notices
        from trl.trainer import utils
    helpers = {"release": release, "logprob": utils.selective_log_softmax}
    if release >= _TEMPERATURE_FROM:
        helpers["both"] = utils.selective_log_softmax_and_entropy
    elif release >= ENTROPY_SERVED.spans[0][0]:
        helpers["entropy"] = utils.entropy_from_logits
    return helpers


def _logprob(trl: dict[str, Any], logits: torch.Tensor, index: torch.Tensor, t: float) -> Any:
    """``selective_log_softmax`` at temperature ``t``, the way the installed release takes it."""
    if "both" in trl:
        return trl["logprob"](logits, index, temperature=t)
    return trl["logprob"](logits / t if t != 1.0 else logits, index)


def trl_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
) -> LogprobResult:
    """``(selected_logp, lse[, entropy])`` from TRL's logprob helpers."""
    check_op_inputs(local_logits, targets, contract, group)
    trl = _trl()
    temperature = contract.batch_temperature
    index = targets.long()
    if contract.export_entropy and "both" not in trl and "entropy" not in trl:
        ENTROPY_SERVED.check(".".join(map(str, trl["release"])))  # refused: no entropy helper
    entropy = None
    if contract.export_entropy and "both" in trl:
        selected, entropy = trl["both"](local_logits, index, temperature=temperature)
    else:
        selected = _logprob(trl, local_logits, index, temperature)
    if contract.export_entropy and "entropy" in trl:
        z = local_logits / temperature if temperature != 1.0 else local_logits
        entropy = trl["entropy"](z)
    lse = None
    if contract.export_lse:
        with torch.no_grad():
            logits = local_logits.detach()
            z_max = (logits / temperature if temperature != 1.0 else logits).amax(dim=1)
            top = _logprob(trl, logits, logits.argmax(dim=1), temperature)
            lse = lse_from_max(z_max, -top.float())
    return LogprobResult(selected.float(), lse, None if entropy is None else entropy.float())


honest, assume_padding, assume_16bit, assume_inactive_tokens = torch_helper_backends(
    trl_logprob, "trl_selective_log_softmax", supports_temperature=True, exports_entropy=True
)
"""The honest backend: ``--tp-logprob-backend=tp_logprob.peers.trl:honest``."""

CAPABILITY = honest[1]
