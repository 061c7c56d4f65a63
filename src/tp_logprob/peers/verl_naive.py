"""verl's ``logprobs_from_logits_naive`` and ``entropy_from_logits_with_chunking`` as a backend.

The two other public logprob and entropy helpers of ``verl.utils.torch_functional``
beside the ones :mod:`tp_logprob.peers.verl` wraps: ``logprobs_from_logits_naive`` is
``gather(log_softmax(logits), labels)`` over the whole batch at once (the form verl's
own tests compare the other paths to), and ``entropy_from_logits_with_chunking`` (the
entropy of verl's actor when its ``entropy_from_logits_with_chunking`` option is set)
takes chunks of 2048 rows, casts each to fp32, and returns ``logsumexp(z) -
sum(softmax(z) * z)`` in fp32. Releases (:data:`SERVED`): both from 0.4.1 to 0.9.1,
the same code in each (read from each release's ``torch_functional.py``).

verl imports ``ray`` at package import (``verl.protocol``); the conformance session
installs verl ``--no-deps`` with only what ``verl.utils.torch_functional`` and the
package import need (``noxfile.py``, ``VERL_IMPORTS``).

Capability, from verl's source:

- TP=1 (the whole vocabulary of a row); no vocabulary padding;
- fp32 only: for bf16/fp16 the logprob is ``log_softmax`` in the input dtype (the
  entropy is computed in fp32);
- no temperature: verl's actor divides the logits before the call;
- entropy;
- mask mode ``all_active``: no ``ignore_index``, every label is gathered, so an
  out-of-range target raises;
- train and infer; ``fixed_topology``: ``log_softmax`` is one row-wise reduction.

The "users assume" variants claim no entropy, so that what fails is the assumption.

Glue: none for ``selected_logp``. verl returns no LSE; the adapter calls
``logprobs_from_logits_naive`` again with each row's argmax as the label: that logprob
is ``x_max - lse``, so ``lse = x_max - logprob``, with ``lse = x_max`` where ``x_max``
is ``+-inf``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.validation import check_op_inputs
from tp_logprob.peers._glue import TORCH_HELPER_VARIANTS, imported_once, torch_helper_backends
from tp_logprob.peers._releases import ServedReleases
from tp_logprob.peers.verl import helpers_logprob, installed_helpers
from tp_logprob.result import LogprobResult

__all__ = [
    "CAPABILITY",
    "SERVED",
    "VERIFIED_VERSIONS",
    "honest",
    "verl_naive_logprob",
    *TORCH_HELPER_VARIANTS,
]

SERVED = ServedReleases(
    "verl",
    (((0, 4, 1), (0, 10)),),
    "the releases outside are not yet verified",
)
"""The verl releases with both helpers, the same code in each."""

VERIFIED_VERSIONS = str(SERVED)


_verl = imported_once(
    functools.partial(
        installed_helpers,
        SERVED,
        "logprobs_from_logits_naive",
        "entropy_from_logits_with_chunking",
    )
)


def verl_naive_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
) -> LogprobResult:
    """``(selected_logp, lse[, entropy])`` from verl's naive logprob and chunked entropy."""
    check_op_inputs(local_logits, targets, contract, group)
    return helpers_logprob(_verl(), local_logits, targets, contract)


honest, assume_padding, assume_16bit, assume_inactive_tokens = torch_helper_backends(
    verl_naive_logprob, "verl_logprobs_from_logits_naive", exports_entropy=True
)
"""The honest backend: ``--tp-logprob-backend=tp_logprob.peers.verl_naive:honest``."""

CAPABILITY = honest[1]
