"""OpenRLHF's actor logprob and entropy path as a backend (TP=1).

``openrlhf.models.actor.Actor.forward`` turns its model's logits into per-token
logprobs and entropies in four steps: ``logits.to(torch.float32)``, then, at a
temperature other than 1, ``logits.div_(temperature)`` in place, then
``compute_entropy(logits)`` where the entropy is asked for, and
``log_probs_from_logits(logits, labels)`` (``openrlhf.models.utils``). ``compute_entropy``
is a ``torch.compile`` function, ``logsumexp(z) - sum(softmax(z) * z)``; the logprob
helper is the one :mod:`tp_logprob.peers.openrlhf` wraps alone (``gather(z) -
logsumexp(z)`` over chunks of 1024 rows on this adapter's CPU path), here called as the
actor calls it, on the upcast and tempered logits with its own temperature left at 1.

``Actor.forward`` itself does not run here: ``openrlhf.models.actor`` imports
``ring_attn_utils``, which imports flash-attn (a CUDA build; see
:mod:`tp_logprob.peers.openrlhf`), and DeepSpeed and PEFT, and it needs a Hugging Face
model. The adapter compiles the three functions the actor calls from the installed
``openrlhf/models/utils.py``, unchanged (:mod:`tp_logprob.peers._installed`), and takes
the four steps above as the actor's source states them.

Releases (:data:`SERVED`): the actor takes these steps from 0.11.1 to 0.11.2. From
0.8.0 (the first release with ``compute_entropy``) to 0.11.0 it computed the entropy of
the logits *before* the temperature, and passed the temperature to
``log_probs_from_logits``, so at ``T != 1`` its entropy was not that of the policy its
logprobs describe; 0.11.1 divides once, first. The adapter refuses those releases rather
than serve a different path under the same name.

Capability, from OpenRLHF's source:

- TP=1 (the whole vocabulary of a row); no vocabulary padding;
- every input dtype: the actor upcasts the logits to fp32 before anything else, so a
  16-bit row is the fp32 row of its values;
- temperature: the in-place ``div_`` of fp32 logits; entropy (``compute_entropy``);
- mask mode ``all_active``: the actor gathers every label and masks with
  ``action_mask`` afterwards, so an out-of-range target raises;
- train and infer; ``fixed_topology`` (row-wise reductions).

Glue: the actor divides its own logits in place; the adapter gives the steps a private
fp32 copy (so the caller's logits stay untouched and gradients flow through the copy).
The actor returns no LSE; the adapter calls ``log_probs_from_logits`` again with each
row's argmax of the tempered logits as the label: that logprob is ``z_max - lse``, so
``lse = z_max - logprob``, with ``lse = z_max`` where ``z_max`` is ``+-inf``.

The "what users assume" variants (``assume_padding``, ``assume_inactive_tokens``)
claim no entropy, so that what fails is the assumption.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from tp_logprob.contract import LogprobContract, LogprobDType, MaskMode
from tp_logprob.kernels.validation import check_op_inputs
from tp_logprob.peers._glue import claiming, imported_once, lse_from_max, torch_helper_backends
from tp_logprob.peers._installed import installed_definitions as compile_installed
from tp_logprob.peers._releases import ServedReleases
from tp_logprob.result import LogprobResult

__all__ = [
    "CAPABILITY",
    "DEFINITIONS",
    "SERVED",
    "VERIFIED_VERSIONS",
    "assume_inactive_tokens",
    "assume_padding",
    "honest",
    "installed_definitions",
    "openrlhf_actor_logprob",
]

SERVED = ServedReleases(
    "openrlhf",
    (((0, 11, 1), (0, 12)),),
    "before 0.11.1 the actor takes the entropy of the logits before the temperature, and "
    "0.12 is not yet verified",
)
"""The openrlhf releases whose actor divides by the temperature once, before both outputs."""

VERIFIED_VERSIONS = str(SERVED)

DEFINITIONS = {
    "models/utils.py": ("_logsumexp_by_chunk", "log_probs_from_logits", "compute_entropy")
}
"""The definitions the actor calls, by file of the installed ``openrlhf`` package."""


def installed_definitions() -> dict[str, Any]:
    """:data:`DEFINITIONS`, compiled from the installed file unchanged."""
    namespace = {
        "__name__": "tp_logprob.peers.openrlhf_actor._installed",
        "torch": torch,
        "F": torch.nn.functional,
    }
    return compile_installed("openrlhf", DEFINITIONS, namespace)


@imported_once
def _openrlhf() -> dict[str, Any]:
    SERVED.installed()
    return installed_definitions()


def _tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The actor's first two steps on a private fp32 copy: ``.to(float32)``, ``div_(T)``."""
    z = logits.to(torch.float32).clone(memory_format=torch.contiguous_format)
    if temperature != 1.0:
        z.div_(temperature)
    return z


def openrlhf_actor_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
) -> LogprobResult:
    """``(selected_logp, lse[, entropy])`` the way OpenRLHF's actor computes them."""
    check_op_inputs(local_logits, targets, contract, group)
    openrlhf = _openrlhf()
    temperature = contract.batch_temperature
    z = _tempered(local_logits, temperature)
    entropy = openrlhf["compute_entropy"](z) if contract.export_entropy else None
    selected = openrlhf["log_probs_from_logits"](z, targets.long())
    lse = None
    if contract.export_lse:
        with torch.no_grad():
            z = _tempered(local_logits.detach(), temperature)
            top = openrlhf["log_probs_from_logits"](z, z.argmax(dim=1))
            lse = lse_from_max(z.amax(dim=1), -top.float())
    return LogprobResult(selected.float(), lse, None if entropy is None else entropy.float())


CAPABILITY = dataclasses.replace(
    torch_helper_backends(
        openrlhf_actor_logprob,
        "openrlhf_actor_logprob_entropy",
        supports_temperature=True,
        exports_entropy=True,
    ).honest[1],
    dtypes=frozenset(LogprobDType),
)

honest = (openrlhf_actor_logprob, CAPABILITY)
"""The honest backend: ``--tp-logprob-backend=tp_logprob.peers.openrlhf_actor:honest``."""

_base = (openrlhf_actor_logprob, dataclasses.replace(CAPABILITY, exports_entropy=False))
assume_padding = claiming(_base, "assume_padding", supports_vocab_padding=True)
assume_inactive_tokens = claiming(_base, "assume_inactive_tokens", mask_modes=frozenset(MaskMode))
