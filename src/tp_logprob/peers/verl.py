"""verl's ``logprobs_from_logits`` and ``entropy_from_logits`` as a backend (TP=1).

These are the helpers verl's FSDP actor computes per-token logprobs and entropies
with (``verl.utils.torch_functional``). ``logprobs_from_logits`` has two paths: with
flash-attn importable (and ``VERL_DISABLE_FLASH_ATTN_CE`` unset) flash-attn's Triton
``cross_entropy_loss``, a CUDA kernel; otherwise ``logprobs_from_logits_v2``, the
path this adapter runs on CPU: ``gather(logits) - logsumexp(logits)`` row by row
for fp32, ``log_softmax`` row by row for 16-bit inputs. ``entropy_from_logits`` is
``logsumexp(logits) - sum(softmax(logits) * logits)``. Both helpers are in every
release, 0.1 to 0.9.1 (:data:`SERVED`); 0.1's CPU path is ``logprobs_from_logits_naive``
(``log_softmax``), ``logprobs_from_logits_v2`` from 0.2. Verified with verl 0.9.1 on
its torch path (the conformance run) and, with this adapter's tests in
``tests/peers/test_adapters.py`` under ``nox -s peer_releases``, the releases
``tools/conformance/releases.py`` lists (0.4.1's package import also needs
``pkg_resources``, 0.4.1's and 0.5.0's pandas).

verl imports ``ray`` at package import (``verl.protocol``); the conformance session
installs verl ``--no-deps`` with only what ``verl.utils.torch_functional`` and the
package import need (``noxfile.py``, ``VERL_IMPORTS``).

Capability, from verl's docstrings and source:

- TP=1 (the whole vocabulary of a row); no vocabulary padding;
- fp32 only: for bf16/fp16 the result is ``log_softmax`` in the input dtype;
- no temperature: verl's actor divides the logits before the call;
- entropy (``entropy_from_logits``);
- mask mode ``all_active``: no ``ignore_index``, every target is gathered, so an
  out-of-range target raises;
- train and infer; ``fixed_topology`` (one row at a time).

The "users assume" variants claim no entropy, so that what fails is the assumption.

Glue: none for ``selected_logp``. verl returns no LSE; the adapter calls
``logprobs_from_logits`` again with each row's argmax as the label: that logprob is
``x_max - lse``, so ``lse = x_max - logprob``, with ``lse = x_max`` where ``x_max``
is ``+-inf``.
"""

from __future__ import annotations

import functools
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
    "SERVED",
    "VERIFIED_VERSIONS",
    "honest",
    "helpers_logprob",
    "installed_helpers",
    "verl_logprob",
    *TORCH_HELPER_VARIANTS,
]

SERVED = ServedReleases(
    "verl",
    (((0, 1), (0, 10)),),
    "0.1 is the first release, and 0.10 is not yet verified",
)
"""The releases of verl the adapter serves; it refuses the others before any work."""

VERIFIED_VERSIONS = str(SERVED)


def installed_helpers(served: ServedReleases, logprob: str, entropy: str) -> dict[str, Any]:
    """The helpers ``logprob`` and ``entropy`` of the installed ``verl.utils.torch_functional``,
    once ``served`` has the installed release."""
    served.installed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # import-time notices of verl's dependencies
        from verl.utils import torch_functional
    return {
        "logprob": getattr(torch_functional, logprob),
        "entropy": getattr(torch_functional, entropy),
    }


_verl = imported_once(
    functools.partial(installed_helpers, SERVED, "logprobs_from_logits", "entropy_from_logits")
)


def verl_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
) -> LogprobResult:
    """``(selected_logp, lse[, entropy])`` from verl's logprob and entropy helpers."""
    check_op_inputs(local_logits, targets, contract, group)
    return helpers_logprob(_verl(), local_logits, targets, contract)


def helpers_logprob(
    verl: dict[str, Any],
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
) -> LogprobResult:
    """``(selected_logp, lse[, entropy])`` from a pair of verl's helpers, ``verl["logprob"]``
    and ``verl["entropy"]``, on checked inputs; the LSE from a second logprob call with
    each row's argmax as the label."""
    selected = verl["logprob"](local_logits, targets.long())
    entropy = verl["entropy"](local_logits) if contract.export_entropy else None
    lse = None
    if contract.export_lse:
        with torch.no_grad():
            logits = local_logits.detach()
            top = verl["logprob"](logits, logits.argmax(dim=1))
            lse = lse_from_max(logits.amax(dim=1), -top.float())
    return LogprobResult(selected.float(), lse, None if entropy is None else entropy.float())


honest, assume_padding, assume_16bit, assume_inactive_tokens = torch_helper_backends(
    verl_logprob, "verl_logprobs_from_logits", exports_entropy=True
)
"""The honest backend: ``--tp-logprob-backend=tp_logprob.peers.verl:honest``."""

CAPABILITY = honest[1]
