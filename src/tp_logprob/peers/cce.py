"""Apple's Cut Cross-Entropy as a hidden-input tp-logprob backend (TP=1), its torch path.

Wraps ``cut_cross_entropy.linear_cross_entropy(e, c, targets, reduction="none",
impl="torch_compile")``, the implementation that runs without a GPU (``impl="cce"``,
the default off macOS, is a Triton kernel). It drops the rows whose target equals
``ignore_index``, computes ``e @ c.T`` for the rest with one matmul *in the input
dtype*, and takes ``F.cross_entropy(logits.float(), targets, reduction="none")``,
all under ``torch.compile(fullgraph=True, dynamic=True)``; the ignored rows get a
loss of 0 (``handle_reduction_none``). ``linear_cross_entropy`` has the same
signature in every release, from the first (24.11.3) to 25.1.1 (:data:`SERVED`).
Verified with cut-cross-entropy 25.1.1 (the conformance run) and, with
``tests/peers/test_cce.py`` under ``nox -s peer_releases``, the releases
``tools/conformance/releases.py`` lists.

Capability, from ``linear_cross_entropy.py``, ``torch_compile.py`` and ``utils.py``:

- TP=1 only: the softmax is over every row of the classifier it is given;
- no vocabulary padding, for the same reason;
- mask mode ``ignore_index`` only: a row is skipped when its target equals
  ``ignore_index``; any other target is passed to ``F.cross_entropy``;
- fp32 only: the logits are the matmul's output in the input dtype, so bf16/fp16
  logits carry 8/11 bits before the fp32 softmax;
- no bias (``c`` is the classifier alone), no temperature (``softcap`` is a tanh
  cap, another function), no entropy;
- train and infer;
- ``run_to_run``: the matmul has one row per kept token, and a matmul's bits for a
  row depend on its shape, so a row's result may depend on the batch.

Not in the capability: ``torch.compile(fullgraph=True)`` compiles no frame under an
active ``TorchDispatchMode`` (an allocation or FLOP counter) and raises, and the skip
stays on the code object, so every later call in the process raises too
(``docs/repro_cce_dispatch_mode.py``).

Glue (see :mod:`tp_logprob.peers._glue`): the call needs torch's ``"highest"`` fp32
matmul precision (no TF32), which the matmul follows (the adapter refuses another and
never changes it: the setting is the whole process's), and runs with Dynamo's
``recompile_limit`` raised from 8 to 256 in the calling thread, for the call only:
every new specialisation (a size of 0 or 1, a dtype, grad mode) is a recompile, the
suite's cases hold dozens, and under ``fullgraph=True`` the ninth one raises instead of
falling back to eager. The library compiles its function at import, so no per-call
option of ``torch.compile`` reaches it; ``torch._dynamo.config.patch`` holds the raised
limit in a context variable from torch 2.12 on (the patching thread's alone: a user's
``torch.compile`` on another thread meanwhile reads its own limit). Under torch 2.11 and
earlier the patch is the whole process's, and the adapter refuses to run there rather
than change it. Where the library raises Dynamo's "found no compiled frames" error
(under a dispatch mode), the adapter passes it on after ``torch._dynamo.reset_code`` on
the library's compiled function alone, so that the skip does not outlive the call that
met it and later calls (other tests, other variants in the process) run the library
again, while every other compiled function in the process keeps its compiled code.
``selected_logp = 0.0 - loss``. Cut Cross-Entropy
returns no LSE: a second call with each row's argmax ``a`` as the target gives
``lse - x[a]``, and ``lse = x[a] + that``, with ``a`` and ``x[a] = hidden . W[a]``
from float64 products of the adapter's own, rounded once to fp32 (nearly exact; the
library's logits are not exposed), and ``lse = x[a]`` where ``x[a]`` is ``+-inf``.
So the LSE's distance to the exact one may reach twice
the dot-product error bound, as for ``liger_flce``. ``export_lse=False`` skips it.

Variants ("what users assume", each the same op): ``assume_padding``,
``assume_16bit``, ``assume_inactive_tokens``, ``assume_batch_invariant``.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

import torch

from tp_logprob.contract import LogprobContract, MaskMode
from tp_logprob.errors import LogprobDispatchError
from tp_logprob.peers._glue import (
    FUSED_PEER_VARIANTS,
    argmax_logits,
    check_hidden_inputs,
    fused_peer_backends,
    fused_peer_capability,
    imported_once,
    lse_from_max,
    selected_from_loss,
)
from tp_logprob.peers._releases import ServedReleases
from tp_logprob.result import LogprobResult

__all__ = [
    "CAPABILITY",
    "SERVED",
    "VERIFIED_VERSIONS",
    "cce_logprob",
    "honest",
    *FUSED_PEER_VARIANTS,
]

SERVED = ServedReleases(
    "cut-cross-entropy",
    (((24, 11, 3), (25, 2)),),
    "24.11.3 is the first release, and 25.2 is not yet verified",
)
"""The releases of cut-cross-entropy the adapter serves; it refuses the others before any work."""

VERIFIED_VERSIONS = str(SERVED)

CAPABILITY = fused_peer_capability("cce_linear_cross_entropy", MaskMode.IGNORE_INDEX)

_NEVER_IGNORED = -1
"""``ignore_index`` for the LSE call, whose targets are argmaxes (``>= 0``)."""

_RECOMPILE_LIMIT = 256
"""Dynamo's recompiles per code object during the call (its default is 8; see Glue)."""

_PER_THREAD_CONFIG_FROM = "2.12"
"""The first torch whose Dynamo config patches are the patching thread's (see Glue)."""

_SKIPPED_FRAME = "found no compiled frames"
"""What Dynamo's error says when ``fullgraph=True`` meets a frame it did not compile."""


@imported_once
def _linear_cross_entropy() -> Any:
    SERVED.installed()
    from cut_cross_entropy import linear_cross_entropy

    return linear_cross_entropy


@imported_once
def _compiled_code() -> types.CodeType:
    """The code object of the library's compiled function, where Dynamo keeps its compiled
    code and the skip (see Glue)."""
    from cut_cross_entropy.torch_compile import torch_compile_linear_cross_entropy_apply

    code: types.CodeType = inspect.unwrap(torch_compile_linear_cross_entropy_apply).__code__
    return code


def _check_per_thread_config() -> None:
    """Raise where raising Dynamo's recompile limit for the call would raise it for every
    thread of the process (torch 2.11 and earlier)."""
    if torch.__version__ < _PER_THREAD_CONFIG_FROM:
        raise LogprobDispatchError(
            f"torch {torch.__version__}: {CAPABILITY.backend_id} needs Dynamo's recompile "
            "limit raised for its call, and before torch 2.12 that setting is the whole "
            "process's; run it under torch>=2.12, where it is the calling thread's"
        )


def _loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore: int) -> Any:
    function = _linear_cross_entropy()
    try:
        with torch._dynamo.config.patch(recompile_limit=_RECOMPILE_LIMIT):
            return function(
                hidden, weight, targets, ignore_index=ignore, reduction="none", impl="torch_compile"
            )
    except RuntimeError as error:
        if _SKIPPED_FRAME in str(error):
            torch._dynamo.reset_code(_compiled_code())  # the skip would outlive this call
        raise


def cce_logprob(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
    *,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> LogprobResult:
    """``(selected_logp, lse)`` from Cut Cross-Entropy's torch path."""
    check_hidden_inputs(
        CAPABILITY.backend_id, hidden, targets, contract, group, weight, bias,
        no_bias="Cut Cross-Entropy's classifier has no bias"
    )  # fmt: skip
    _check_per_thread_config()
    targets = targets.long().contiguous()
    loss = _loss(hidden, weight, targets, contract.mask.ignore_index)
    lse = None
    if contract.export_lse:
        with torch.no_grad():
            top, x_top = argmax_logits(hidden.detach(), weight.detach())
            shift = _loss(hidden.detach(), weight.detach(), top, _NEVER_IGNORED)
            lse = lse_from_max(x_top, shift)
    return LogprobResult(selected_from_loss(loss), lse)


(
    honest,
    assume_padding,
    assume_16bit,
    assume_inactive_tokens,
    assume_batch_invariant,
) = fused_peer_backends(cce_logprob, CAPABILITY)
"""The honest backend: ``--tp-logprob-backend=tp_logprob.peers.cce:honest``."""
