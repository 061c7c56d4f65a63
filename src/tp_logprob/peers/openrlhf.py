"""OpenRLHF's ``log_probs_from_logits`` as a backend (TP=1).

This is the helper OpenRLHF's actor computes per-token logprobs with
(``openrlhf.models.utils``; ``Actor.forward`` divides the logits by its temperature
in place first, and the helper takes a ``temperature`` argument that does the same,
``logits.div_(temperature)``). It has two paths: fp32 and fp64 logits go to
flash-attn's Triton ``cross_entropy_loss`` when flash-attn imports, and otherwise
to the path this adapter runs on CPU: ``gather(logits) - logsumexp(logits)``, the
``logsumexp`` taken over chunks of 1024 rows (``_logsumexp_by_chunk``); 16-bit
logits get ``log_softmax`` row by row in the input dtype. The two functions are the
same from 0.6.2, the first release with the temperature argument and the chunked
``logsumexp``, to 0.11.2 (:data:`SERVED`; before 0.6.2 the helper takes no temperature).
Verified with openrlhf 0.11.2 (the conformance run) and, with
``tests/peers/test_openrlhf.py`` under ``nox -s peer_releases``, the releases
``tools/conformance/releases.py`` lists.

``openrlhf.models.utils`` does not import here: the package's ``__init__`` imports
its actor, whose ``ring_attn_utils`` imports ``flash_attn.bert_padding``; PyPI has
flash-attn only as a source distribution that builds CUDA kernels, and its
``__init__`` loads that extension. The module also imports DeepSpeed at the top,
which the helper never uses. The adapter therefore compiles ``log_probs_from_logits``
and ``_logsumexp_by_chunk`` from the installed ``openrlhf/models/utils.py``, unchanged
(:mod:`tp_logprob.peers._installed`), with ``torch`` and ``torch.nn.functional`` as
their names; the conformance session installs openrlhf ``--no-deps`` and nothing else.

Capability, from OpenRLHF's source:

- TP=1 (the whole vocabulary of a row); no vocabulary padding;
- fp32 only: for bf16/fp16 the result is ``log_softmax`` in the input dtype;
- temperature: the in-place ``logits.div_(temperature)`` of fp32 logits; no entropy
  (``compute_entropy`` is a ``torch.compile`` function of its own, not run here);
- mask mode ``all_active``: no ``ignore_index``, every label is gathered, so an
  out-of-range target raises;
- train and infer; ``fixed_topology`` (row-wise reductions in chunks of fixed size).

Glue: the helper divides its input in place, so it gets a private copy where the
temperature is not 1 (the caller's logits stay untouched, and gradients flow through
the copy). OpenRLHF returns no LSE; the adapter calls the helper again with each
row's argmax of the tempered logits as the label: that logprob is ``z_max - lse``,
so ``lse = z_max - logprob``, with ``lse = z_max`` where ``z_max`` is ``+-inf``.
"""

from __future__ import annotations

from typing import Any

import torch

from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.validation import check_op_inputs
from tp_logprob.peers._glue import (
    TORCH_HELPER_VARIANTS,
    imported_once,
    lse_from_max,
    private_copy,
    torch_helper_backends,
)
from tp_logprob.peers._installed import installed_definitions as compile_installed
from tp_logprob.peers._releases import ServedReleases
from tp_logprob.result import LogprobResult

__all__ = [
    "CAPABILITY",
    "SERVED",
    "VERIFIED_VERSIONS",
    "honest",
    "openrlhf_logprob",
    *TORCH_HELPER_VARIANTS,
]

SERVED = ServedReleases(
    "openrlhf",
    (((0, 6, 2), (0, 12)),),
    "before 0.6.2 log_probs_from_logits takes no temperature (and log_softmax's all at once), "
    "and 0.12 is not yet verified",
)
"""The releases of openrlhf the adapter serves; it refuses the others before any work."""

VERIFIED_VERSIONS = str(SERVED)

DEFINITIONS = {"models/utils.py": ("_logsumexp_by_chunk", "log_probs_from_logits")}
"""The definitions the adapter runs, by file of the installed ``openrlhf`` package."""


def installed_definitions() -> dict[str, Any]:
    """:data:`DEFINITIONS`, compiled from the installed files unchanged."""
    namespace = {
        "__name__": "tp_logprob.peers.openrlhf._installed",
        "torch": torch,
        "F": torch.nn.functional,
    }
    return compile_installed("openrlhf", DEFINITIONS, namespace)


@imported_once
def _log_probs_from_logits() -> Any:
    SERVED.installed()
    return installed_definitions()["log_probs_from_logits"]


def openrlhf_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
) -> LogprobResult:
    """``(selected_logp, lse)`` from OpenRLHF's ``log_probs_from_logits``."""
    check_op_inputs(local_logits, targets, contract, group)
    log_probs = _log_probs_from_logits()
    temperature = contract.batch_temperature
    # The helper writes logits / T into its input; at T = 1 it leaves it alone.
    logits = local_logits if temperature == 1.0 else private_copy(local_logits)
    selected = log_probs(logits, targets.long(), temperature)
    lse = None
    if contract.export_lse:
        with torch.no_grad():
            z = private_copy(local_logits.detach())
            top = log_probs(z, z.argmax(dim=1), temperature)  # z is tempered after the call
            lse = lse_from_max(z.amax(dim=1), -top.float())
    return LogprobResult(selected.float(), lse)


honest, assume_padding, assume_16bit, assume_inactive_tokens = torch_helper_backends(
    openrlhf_logprob, "openrlhf_log_probs_from_logits", supports_temperature=True
)
"""The honest backend: ``--tp-logprob-backend=tp_logprob.peers.openrlhf:honest``."""

CAPABILITY = honest[1]
