"""verl's Megatron vocab-parallel logprob and entropy helpers as a backend (any TP, real groups).

verl's Megatron engine (``verl.workers.engine.megatron.transformer_impl``) computes a
rank's per-token logprobs and entropies from its vocabulary shard of the logits with
``verl.utils.megatron.tensor_parallel``:

- ``vocab_parallel_log_probs_from_logits(logits, labels)``: ``-`` Megatron-Core's
  ``tensor_parallel.vocab_parallel_cross_entropy`` (its own all-reduces on Megatron's
  tensor-parallel group; see :mod:`tp_logprob.peers.megatron`);
- ``vocab_parallel_entropy(logits)``: verl's ``_VocabParallelEntropy``: the row maximum
  (all-reduce MAX), ``exp(x - M)`` and its sum (all-reduce SUM), the softmax, ``sum(softmax
  * x)`` (a ``torch.compile(dynamic=True)`` function; all-reduce SUM), and ``M + log(sum) -
  sum(softmax * x)``, all in the input dtype, on ``parallel_state``'s tensor-parallel group.

Both find their group in Megatron's ``parallel_state`` (initialized here on first use with
the contract's TP degree over the default process group), so the adapter needs a real
process group (``real_group_only``) and Megatron's ``rank * width`` ranges (even shards
only). verl's engine clones the logits before the entropy, whose backward writes into its
saved input (``sub_`` then ``add_``) and Megatron's forward subtracts the maximum from fp32
logits in place: the adapter hands each helper its own copy likewise. Verified with verl
0.9.1 and megatron-core 0.19.2 (the conformance run); the two helpers and
``_VocabParallelEntropy`` are the same since verl 0.4.1 (``>=0.4.1,<0.10``: their syntax
trees compared in the wheels of 0.4.1, 0.5.0, 0.6.1, 0.7.1, 0.8.0 and 0.9.1; the file
changes elsewhere).

verl's package import needs ``ray`` and ``tensordict`` (``noxfile.py``, ``VERL_IMPORTS``);
the module needs megatron-core (installed as :mod:`tp_logprob.peers.megatron` says).

Capability, from the two helpers and Megatron's source:

- any TP on a real process group, equal shards; no vocabulary padding;
- fp32 only: the logprob is Megatron's (fp32 whatever the input), but the entropy is
  computed and returned in the input dtype;
- no temperature (the engine divides the logits in place before the call); entropy;
- mask mode ``all_active``: no mask, every target is read (Megatron masks off-rank
  targets, so an out-of-range one reads a target logit of 0);
- train and infer; ``fixed_topology``; no LSE (neither helper exposes one).

Glue: none; ``selected_logp`` is verl's ``-loss`` itself (``-0.0`` where the loss is
``+0.0``).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from tp_logprob.capability import LogprobBackendCapability
from tp_logprob.contract import (
    DeterminismScope,
    LogprobContract,
    LogprobDType,
    LogprobRole,
    MaskMode,
)
from tp_logprob.kernels.validation import check_op_inputs
from tp_logprob.peers._glue import imported_once, private_copy
from tp_logprob.peers._releases import ServedReleases
from tp_logprob.peers.megatron import tensor_parallel_state
from tp_logprob.result import LogprobResult

__all__ = ["CAPABILITY", "SERVED", "VERIFIED_VERSIONS", "library", "verl_megatron_logprob"]

SERVED = ServedReleases(
    "verl",
    (((0, 4, 1), (0, 10)),),
    "the releases outside are not yet verified",
)
"""The releases of verl the adapter serves; it refuses the others before any work."""

VERIFIED_VERSIONS = str(SERVED)

CAPABILITY = LogprobBackendCapability(
    backend_id="verl_megatron_vocab_parallel",
    roles=frozenset({LogprobRole.TRAIN, LogprobRole.INFER}),
    dtypes=frozenset({LogprobDType.FP32}),
    cp_world_sizes=frozenset({1}),
    supports_vocab_padding=False,
    mask_modes=frozenset({MaskMode.ALL_ACTIVE}),
    exports_vocab_lse=False,
    determinism_scopes=frozenset({DeterminismScope.FIXED_TOPOLOGY}),
    exports_entropy=True,
    even_shards_only=True,
    real_group_only=True,
)


@imported_once
def _verl() -> dict[str, Any]:
    SERVED.installed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # verl's and Megatron's import-time notices
        from verl.utils.megatron import tensor_parallel
    return {
        "logprob": tensor_parallel.vocab_parallel_log_probs_from_logits,
        "entropy": tensor_parallel.vocab_parallel_entropy,
    }


def verl_megatron_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
) -> LogprobResult:
    """``(selected_logp, entropy)`` from verl's vocab-parallel helpers on Megatron's group
    (``group`` is not used: the helpers find their own)."""
    check_op_inputs(local_logits, targets, contract, group)
    tensor_parallel_state(contract)
    verl = _verl()
    entropy = None
    if contract.export_entropy:
        entropy = verl["entropy"](private_copy(local_logits)).float()
    selected = verl["logprob"](private_copy(local_logits), targets.long())
    return LogprobResult(selected.float(), None, entropy)


library = (verl_megatron_logprob, CAPABILITY)
"""verl's helpers on their own groups, any TP: real groups only."""
