"""Liger-Kernel's vocab-parallel cross entropy as a tp-logprob backend.

Wraps ``liger_kernel.transformers.LigerVocabParallelCrossEntropy`` (``reduction="none"``,
``label_smoothing=0``), whose autograd op ``LigerVocabParallelCEFunction`` takes the
row maximum with ``amax`` in the input dtype, all-reduces it (MAX), runs one Triton
program per row that stores ``exp(x - M)`` in an fp32 buffer and returns the row's
fp32 sum and shifted target logit, all-reduces those two (SUM), and returns
``log(sum) - predicted``; the backward kernel turns the saved buffer into the
gradient. The all-reduces are ``torch.distributed`` calls on the ``tp_group`` it is
given, skipped when that is ``None`` or has one rank. Verified with liger-kernel
0.8.5 (``>=0.8.1,<0.9``: the module is new in 0.8.1, and its two files,
``ops/`` and ``transformers/vocab_parallel_cross_entropy.py``, are byte-identical in
0.8.1 to 0.8.5, compared in their wheels, and ``tests/peers`` pass on 0.8.1); on CPU
the kernels run through the Triton interpreter (``TRITON_INTERPRET=1`` before triton
is first imported).

Capability, from Liger's docstrings and ``ops/vocab_parallel_cross_entropy.py``:

- any TP on a real process group (:data:`library`): Liger calls
  ``dist.all_reduce`` itself, so it needs a ``ProcessGroup``, not a group handle;
  each rank's range is ``rank * V_local`` (``vocab_start``), so equal shards only;
  on the suite's emulated group, TP=1 (:data:`honest`, ``tp_group=None``);
- fp32, bf16 and fp16: the kernel loads every block as fp32 and the loss is fp32;
- no vocabulary padding: every local column counts;
- mask mode ``ignore_index`` only: a row is skipped when its target equals
  ``ignore_index``; any other target outside the rank's range is read as an
  off-rank target (a shifted target logit of 0 from this rank);
- train and infer; ``fixed_topology`` (one program per row); no temperature, no
  entropy.

``label_smoothing_formula`` and ``label_smoothing_mode`` (``global`` / ``partition``)
choose how a smoothing ``alpha > 0`` is spread; at ``label_smoothing=0`` Liger skips
that branch, so neither bears on the logprob (``tests/peers`` pins both modes
bit-identical there), and with ``alpha > 0`` the loss is no longer a logprob.

Glue (see :mod:`tp_logprob.peers._glue`): rows ``[N, V]`` are Liger's
``[S, B, V]`` with ``B = 1``; ``selected_logp = 0.0 - loss``; Liger exports no LSE,
so at TP=1 the adapter calls the op a second time with each row's argmax as the
target (and ``ignore_index=-1``, which no argmax equals), whose loss is
``log(sum exp(x - M))``, and ``lse = M + loss`` (``M`` where
``M`` is ``+-inf``). :data:`library` exports no LSE (the argmax target would need
the global argmax, a collective of the adapter's own).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import torch

from tp_logprob.capability import LogprobBackendCapability
from tp_logprob.comm import TorchGroup
from tp_logprob.contract import (
    DeterminismScope,
    LogprobContract,
    LogprobDType,
    LogprobRole,
    MaskMode,
)
from tp_logprob.errors import LogprobContractError
from tp_logprob.kernels.validation import check_op_inputs
from tp_logprob.peers._glue import claiming, imported_once, lse_from_max, selected_from_loss
from tp_logprob.peers._releases import ServedReleases
from tp_logprob.result import LogprobResult

__all__ = [
    "CAPABILITY",
    "SERVED",
    "VERIFIED_VERSIONS",
    "assume_inactive_tokens",
    "assume_padding",
    "honest",
    "liger_vocab_parallel_logprob",
    "library",
]

SERVED = ServedReleases(
    "liger-kernel",
    (((0, 8, 1), (0, 9)),),
    "LigerVocabParallelCrossEntropy arrived in 0.8.1, and 0.9 is not yet verified",
)
"""The releases of liger-kernel the adapter serves; it refuses the others before any work."""

VERIFIED_VERSIONS = str(SERVED)

CAPABILITY = LogprobBackendCapability(
    backend_id="liger_vp_ce",
    roles=frozenset({LogprobRole.TRAIN, LogprobRole.INFER}),
    dtypes=frozenset(LogprobDType),
    tp_world_sizes=frozenset({1}),
    cp_world_sizes=frozenset({1}),
    supports_vocab_padding=False,
    mask_modes=frozenset({MaskMode.IGNORE_INDEX}),
    exports_vocab_lse=True,
    determinism_scopes=frozenset({DeterminismScope.FIXED_TOPOLOGY}),
)


@imported_once
def _vocab_parallel_class() -> Any:
    SERVED.installed()
    from liger_kernel.transformers import LigerVocabParallelCrossEntropy

    return LigerVocabParallelCrossEntropy


def _module(ignore_index: int, mode: str) -> Any:
    """Liger's ``LigerVocabParallelCrossEntropy`` with no smoothing (imported once)."""
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        raise RuntimeError(
            "Liger's vocab-parallel cross entropy is a Triton kernel: on CPU it runs only "
            "through the Triton interpreter; set TRITON_INTERPRET=1 before triton is "
            "first imported"
        )
    return _vocab_parallel_class()(
        ignore_index=ignore_index,
        reduction="none",
        label_smoothing=0.0,
        label_smoothing_mode=mode,
    )


def _tp_group(group: Any, contract: LogprobContract) -> Any:
    """The ``ProcessGroup`` Liger all-reduces on: ``None`` at TP=1."""
    if contract.sharding.tp_world_size == 1:
        return None
    if isinstance(group, TorchGroup):
        # Liger reads None as "TP=1" and skips its all-reduces: name the world group.
        return group.process_group or torch.distributed.group.WORLD
    raise LogprobContractError(
        f"group={group!r}: Liger's vocab-parallel cross entropy calls torch.distributed "
        "itself and needs a real process group (a TorchGroup) at TP > 1"
    )


def liger_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    tp_group: Any,
    ignore_index: int = -100,
    mode: str = "global",
) -> torch.Tensor:
    """Liger's per-row loss of ``[N, V_local]`` logits and global ``targets``."""
    # The interpreter evaluates the kernel with numpy, which warns where the GPU is
    # silent (inf - inf on special rows); the values are the kernel's either way.
    # np.errstate is the calling thread's (each emulated rank's own); any warning that
    # goes through the warnings filters, the whole process's, is the caller's to filter.
    with np.errstate(all="ignore"):
        loss = _module(ignore_index, mode)(logits[:, None, :], targets[:, None], tp_group)
    return loss[:, 0]  # type: ignore[no-any-return]


def liger_vocab_parallel_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
) -> LogprobResult:
    """``(selected_logp, lse)`` from Liger's vocab-parallel cross entropy."""
    check_op_inputs(local_logits, targets, contract, group)
    tp_group = _tp_group(group, contract)
    loss = liger_loss(local_logits, targets, tp_group, contract.mask.ignore_index)
    lse = None
    if contract.export_lse and tp_group is None:
        with torch.no_grad():
            logits = local_logits.detach()
            row_max = logits.amax(dim=1) if logits.shape[1] else logits.new_empty(0)
            shift = liger_loss(logits, logits.argmax(dim=1), None, ignore_index=-1)
            lse = lse_from_max(row_max, shift)
    return LogprobResult(selected_from_loss(loss), lse)


honest = (liger_vocab_parallel_logprob, CAPABILITY)
"""The honest backend: ``--tp-logprob-backend=tp_logprob.peers.liger_vocab_parallel:honest``."""

library = (
    liger_vocab_parallel_logprob,
    dataclasses.replace(
        CAPABILITY,
        backend_id="liger_vp_ce.library",
        tp_world_sizes=None,
        exports_vocab_lse=False,
        even_shards_only=True,
        real_group_only=True,
    ),
)
"""Liger's own all-reduces on the real process group, any TP, equal shards: real groups only."""

assume_padding = claiming(honest, "assume_padding", supports_vocab_padding=True)
assume_inactive_tokens = claiming(honest, "assume_inactive_tokens", mask_modes=frozenset(MaskMode))
