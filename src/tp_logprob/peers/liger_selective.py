"""Liger-Kernel's ``fused_selective_log_softmax`` as an inference backend (TP=1; Triton).

``liger_kernel.ops.grpo_loss.fused_selective_log_softmax(logits, input_ids, temperature,
mask)`` is the Triton kernel Liger's Triton GRPO loss (``liger_kernel.transformers.
grpo_loss``) computes the old and reference policies' per-token logprobs with, under
``torch.no_grad``. It takes a ``[B, L + 1, V]`` batch of logits and scores positions
``0 .. L - 1`` against the last ``L`` ids; one program per position walks the row in
blocks of 2048 columns: ``z = fp32(x) / T``, a running maximum rescaling the sum of
``exp(z - max)``, then ``z[id] - (max + log sum)`` in fp32. A position whose ``mask`` is
0 returns before it reads its id and keeps the output's initial 0. On CPU the kernel
runs only through the Triton interpreter (``TRITON_INTERPRET=1``).

Releases (:data:`SERVED`): the same function and arguments from 0.7.0 (the oldest release
checked) to 0.8.5; 0.8.2 changed the kernel's index arithmetic, not its values.

Capability, from ``ops/grpo_loss.py``:

- TP=1 (the whole row); no vocabulary padding;
- every input dtype: each block is loaded and converted to fp32;
- temperature: ``z = fp32(x) / T``, ``T`` a ``tl.constexpr`` divisor;
- no entropy; mask mode ``explicit_active_mask``: the contract's mask goes in as
  ``mask``, and an inactive position's id is never read;
- infer only: the function runs under ``torch.no_grad``, so nothing flows back;
- ``fixed_topology``: one program per position, the blocks in column order.

Glue: the rows go in as one sequence of ``N + 1`` positions, the last a row of zeros the
kernel never reads (it scores ``L = N`` positions), with the targets as the ``N`` ids.
Liger returns no LSE: a second call with each row's argmax ``a`` as the id and no mask
gives ``z[a] - lse``, so ``lse = z[a] - that``, with ``z[a] = fp32(x[a]) / fp32(T)``, and
``lse = z[a]`` where that is ``+-inf``.

The one "what users assume" variant, ``assume_padding``: the capability already holds
16-bit inputs, inactive tokens and a fixed topology, and the kernel has no TP.
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
from tp_logprob.kernels.validation import active_mask_tensor, check_op_inputs
from tp_logprob.peers._glue import claiming, imported_once, lse_from_max
from tp_logprob.peers._releases import ServedReleases
from tp_logprob.result import LogprobResult

__all__ = [
    "CAPABILITY",
    "SERVED",
    "VERIFIED_VERSIONS",
    "assume_padding",
    "honest",
    "liger_selective_logprob",
]

SERVED = ServedReleases(
    "liger-kernel",
    (((0, 7), (0, 9)),),
    "0.7.0 is the oldest release checked, and 0.9 is not yet verified",
)
"""The releases whose ``fused_selective_log_softmax`` the adapter calls."""

VERIFIED_VERSIONS = str(SERVED)

CAPABILITY = LogprobBackendCapability(
    backend_id="liger_fused_selective_log_softmax",
    roles=frozenset({LogprobRole.INFER}),
    dtypes=frozenset(LogprobDType),
    tp_world_sizes=frozenset({1}),
    cp_world_sizes=frozenset({1}),
    supports_vocab_padding=False,
    mask_modes=frozenset({MaskMode.EXPLICIT_ACTIVE_MASK}),
    exports_vocab_lse=True,
    supports_temperature=True,
    determinism_scopes=frozenset({DeterminismScope.FIXED_TOPOLOGY}),
)


@imported_once
def _kernel() -> Any:
    SERVED.installed()
    from liger_kernel.ops.grpo_loss import fused_selective_log_softmax

    return fused_selective_log_softmax


def _call(
    logits: torch.Tensor, ids: torch.Tensor, temperature: float, mask: torch.Tensor | None
) -> torch.Tensor:
    """Liger's logprobs of ``ids``, the rows as one sequence with an unread last position."""
    sequence = torch.cat([logits.detach(), logits.new_zeros(1, logits.shape[1])])[None]
    mask = None if mask is None else mask[None]
    with np.errstate(all="ignore"):  # the interpreter evaluates inf - inf with numpy
        logprobs: torch.Tensor = _kernel()(sequence.contiguous(), ids[None], temperature, mask)
    return logprobs[0]


def liger_selective_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
) -> LogprobResult:
    """``(selected_logp, lse)`` from Liger's ``fused_selective_log_softmax``."""
    check_op_inputs(local_logits, targets, contract, group)
    if local_logits.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "Liger's fused_selective_log_softmax is a Triton kernel: on CPU it runs only "
            "through the Triton interpreter; set TRITON_INTERPRET=1 before triton is first "
            "imported"
        )
    temperature = contract.batch_temperature
    mask = None
    if contract.mask.active_mask is not None:
        mask = active_mask_tensor(contract, local_logits.device)
    selected = _call(local_logits, targets.long(), temperature, mask)
    lse = None
    if contract.export_lse:
        z = local_logits.detach().float() / torch.tensor(contract.temperature_fp32)
        top = _call(local_logits, z.argmax(dim=1), temperature, None)
        lse = lse_from_max(z.amax(dim=1), -top)
    return LogprobResult(selected, lse)


honest = (liger_selective_logprob, CAPABILITY)
"""The honest backend: ``--tp-logprob-backend=tp_logprob.peers.liger_selective:honest``."""

assume_padding = claiming(honest, "assume_padding", supports_vocab_padding=True)
