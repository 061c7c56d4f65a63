"""TRL's Triton logprob-and-entropy kernel as a backend (TP=1; on CPU under the interpreter).

``trl.kernels.selective_log_softmax_and_entropy`` is the kernel TRL's trainer helpers
(``selective_log_softmax``, ``entropy_from_logits`` and
``selective_log_softmax_and_entropy`` of ``trl.trainer.utils``) hand CUDA and XPU logits
to; :mod:`tp_logprob.peers.trl` runs the torch path those helpers take everywhere else,
so it never reaches this kernel. One program per row walks the row in blocks of 1024
columns: ``z = fp32(x) / T``, a running maximum, the sum of ``exp(z - max)`` and of
``exp(z - max) * z``; then ``log_z = max + log sum``, the logprob ``z[target] - log_z``
and the entropy ``log_z - weighted / sum``, all in fp32. A ``row_mask`` row stores 0 for
both and returns before its target is read. The backward recomputes each block from
the saved ``log_z``. On CPU the kernel runs only through the Triton interpreter
(``TRITON_INTERPRET=1``).

Releases (:data:`SERVED`): public in ``trl.kernels`` from 1.14.0 with the same arguments
(``logits, index, temperature, row_mask``) to 1.16 (1.16 keeps the layout strides of the
forward for the backward instead of recomputing them; the kernels are the same).

Capability, from ``kernels/logprob_entropy.py``:

- TP=1 (the whole row); no vocabulary padding;
- every input dtype: each block is loaded and converted to fp32 first, and the outputs
  are fp32;
- temperature: ``z = fp32(x) / T``, ``T`` a ``tl.constexpr`` divisor;
- entropy;
- mask mode ``explicit_active_mask``: the adapter passes the contract's mask as
  ``row_mask``, and an inactive row's target is never read;
- train and infer; ``fixed_topology``: one program per row, the blocks in column order.

Two peer bugs, each with its reproducer: the entropy (and its gradient) is NaN beside a
-inf logit, ``0 * -inf`` in the weighted sum (``docs/repro_trl_kernel_entropy_neg_inf.py``),
and a row whose first 1024 columns are all -inf is NaN, since its first rescaling is
``exp(-inf - -inf)`` (``docs/repro_trl_kernel_leading_neg_inf_block.py``).

Glue: the contract's mask goes in as ``row_mask`` (``None`` when every token is active).
The kernel returns no LSE (it keeps ``log_z`` for its backward only): a second call with
each row's argmax ``a`` as the target and no mask gives ``z[a] - lse``, so ``lse = z[a] -
that``, with ``z[a] = fp32(x[a]) / fp32(T)``, and ``lse = z[a]`` where that is ``+-inf``.

The one "what users assume" variant, ``assume_padding``, claims no entropy, so that what
fails is the assumption; the kernel's capability already holds 16-bit inputs, inactive
tokens and a fixed topology, and it has no TP.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
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
    "trl_kernel_logprob",
]

SERVED = ServedReleases(
    "trl",
    (((1, 14), (1, 17)),),
    "trl.kernels.selective_log_softmax_and_entropy arrived in 1.14, and 1.17 is not yet verified",
)
"""The trl releases whose ``trl.kernels`` exports ``selective_log_softmax_and_entropy``."""

VERIFIED_VERSIONS = str(SERVED)

CAPABILITY = LogprobBackendCapability(
    backend_id="trl_kernel_logprob_entropy",
    roles=frozenset({LogprobRole.TRAIN, LogprobRole.INFER}),
    dtypes=frozenset(LogprobDType),
    tp_world_sizes=frozenset({1}),
    cp_world_sizes=frozenset({1}),
    supports_vocab_padding=False,
    mask_modes=frozenset({MaskMode.EXPLICIT_ACTIVE_MASK}),
    exports_vocab_lse=True,
    supports_temperature=True,
    exports_entropy=True,
    determinism_scopes=frozenset({DeterminismScope.FIXED_TOPOLOGY}),
)


@imported_once
def _kernel() -> Any:
    SERVED.installed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' import-time notices
        from trl.kernels import selective_log_softmax_and_entropy
    return selective_log_softmax_and_entropy


def trl_kernel_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
) -> LogprobResult:
    """``(selected_logp, lse[, entropy])`` from TRL's ``selective_log_softmax_and_entropy``."""
    check_op_inputs(local_logits, targets, contract, group)
    if local_logits.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "TRL's logprob-and-entropy kernel is a Triton kernel: on CPU it runs only through "
            "the Triton interpreter; set TRITON_INTERPRET=1 before triton is first imported"
        )
    kernel = _kernel()
    temperature = contract.batch_temperature
    logits = local_logits.contiguous()
    row_mask = None
    if contract.mask.active_mask is not None:
        row_mask = active_mask_tensor(contract, logits.device)
    # The interpreter evaluates the kernel with numpy, which warns where a GPU is silent
    # (inf - inf on special rows); the values are the kernel's either way.
    with np.errstate(all="ignore"):
        selected, entropy = kernel(logits, targets.long(), temperature, row_mask)
        lse = None
        if contract.export_lse:
            with torch.no_grad():
                z = logits.detach().float() / torch.tensor(contract.temperature_fp32)
                top = kernel(logits.detach(), z.argmax(dim=1), temperature, None)[0]
                lse = lse_from_max(z.amax(dim=1), -top)
    return LogprobResult(selected, lse, entropy if contract.export_entropy else None)


honest = (trl_kernel_logprob, CAPABILITY)
"""The honest backend: ``--tp-logprob-backend=tp_logprob.peers.trl_kernel:honest``."""

assume_padding = claiming(
    (trl_kernel_logprob, dataclasses.replace(CAPABILITY, exports_entropy=False)),
    "assume_padding",
    supports_vocab_padding=True,
)
