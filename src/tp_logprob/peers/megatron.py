"""Megatron-Core's vocab-parallel cross entropy as a tp-logprob backend (any TP).

Runs the pieces of ``megatron.core.tensor_parallel.cross_entropy.VocabParallelCrossEntropy``
(``calculate_logits_max``, ``calculate_predicted_logits``,
``calculate_cross_entropy_loss``, ``prepare_gradient_calculation_operands``,
``calculate_gradients``) in the order Megatron's ``_VocabParallelCrossEntropy``
runs them, with ``label_smoothing=0``. Megatron's three ``torch.distributed.all_reduce``
calls (MAX of the row maxima, SUM of the target logits, SUM of the shifted sums)
run as Megatron runs them on a real process group (a
:class:`~tp_logprob.comm.TorchGroup` handle: the suite under ``torchrun``), on the
handle's process group, reduced in gloo's or NCCL's own order. On any other group
handle (the suite's emulated group) they are the only lines not Megatron's: each is
an ``all_gather`` over the handle followed by a max, or a sum in rank order.

:data:`library` runs Megatron's own ``vocab_parallel_cross_entropy`` whole, on the
tensor-parallel group of Megatron's ``parallel_state`` (initialized on first use with
the contract's TP degree over the default process group): Megatron's code end to
end, its communication included. It needs a real process group
(``real_group_only``), takes Megatron's ``rank * width`` ranges (even shards only)
and exports no LSE.

Releases (:data:`SERVED`, read from each release's ``tensor_parallel/cross_entropy.py``):
0.8.0 split ``_VocabParallelCrossEntropy.forward`` into the
``VocabParallelCrossEntropy`` pieces this adapter runs, and they are the same through
0.19.2 (0.19 added an optional ``tp_group`` to ``vocab_parallel_cross_entropy``,
left out here, so it uses ``parallel_state``'s group as before). Verified with
megatron-core 0.19.2 (the conformance run) and, with this adapter's tests under
``nox -s peer_releases``, the releases ``tools/conformance/releases.py`` lists. From
0.17 its metadata asks for Python >= 3.12, but the package is pure Python apart
from an optional dataset helper; on Python 3.11 install it from the source
distribution, without the Python check, and with only the dependencies it imports
here (torch, numpy, packaging; and ``pkg_resources``, ``setuptools<81``, for
0.8)::

    pip install --no-deps --ignore-requires-python --no-binary megatron-core "megatron-core==0.19.2"

(``--no-binary`` because the wheel is tagged cp312; ``--no-deps`` so pip does not
pull a CUDA torch; 0.8.0 and 0.9.0 have no source distribution, only cp311 wheels.)
Importing it warns that Transformer Engine and Apex are missing; the adapter
silences those import warnings.

Capability, from Megatron's docs and ``tensor_parallel/cross_entropy.py``:

- any TP; fp32, bf16 and fp16 inputs (``calculate_logits_max`` casts to fp32, and
  everything after is fp32);
- no vocabulary padding: every local column counts (Megatron pads the vocabulary
  with trained columns, not masked ones);
- no mask at all: a loss is computed for every row and callers multiply by a
  ``loss_mask`` afterwards, so the backend serves only contracts whose tokens are
  all active (mask mode ``ignore_index``, the capability's weakest);
- train and infer; ``fixed_topology``; no temperature, no entropy.

Glue (see :mod:`tp_logprob.peers._glue`):

- for fp32 input ``.float()`` returns the input itself and Megatron then subtracts
  the maximum *in place* (and overwrites it with ``exp``, then softmax): the adapter
  hands it a copy. bf16/fp16 inputs are cast to a new fp32 tensor by Megatron.
- ``selected_logp = 0.0 - loss``;
- ``lse = M + log(S)`` from Megatron's own all-reduced ``logits_max`` and
  ``sum_exp_logits``, with ``lse = M`` on rows whose maximum is ``+-inf``.

Two shardings: :data:`honest` uses the contract's shard bounds as Megatron's
``vocab_start_index, vocab_end_index``; :data:`equal_shards` asks Megatron's own
``VocabUtility.vocab_range_from_per_partition_vocab_size(width, rank, tp)``, which
assumes every rank holds the same ``width`` (``start = rank * width``), so it
claims ``even_shards_only``. Even that is right only when ``tp`` divides the
padded vocabulary: in :func:`~tp_logprob.even_shard_bounds`' layout the last shard
is shorter otherwise, and Megatron, which pads the vocabulary to a multiple of
``128 * tp`` and asserts the division elsewhere (``VocabUtility.
vocab_range_from_global_vocab_size``), never meets that case; the capability
cannot say "tp divides the vocabulary".
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

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
from tp_logprob.kernels.validation import active_mask_tensor, check_op_inputs
from tp_logprob.peers._glue import (
    claiming,
    imported_once,
    lse_from_max,
    private_copy,
    selected_from_loss,
)
from tp_logprob.peers._releases import ServedReleases
from tp_logprob.result import LogprobResult

__all__ = [
    "CAPABILITY",
    "SERVED",
    "VERIFIED_VERSIONS",
    "assume_cross_tp_bitwise",
    "assume_inactive_tokens",
    "assume_padding",
    "assume_uneven_shards",
    "equal_shards",
    "honest",
    "library",
    "megatron_library_logprob",
    "megatron_logprob",
    "tensor_parallel_state",
]

SERVED = ServedReleases(
    "megatron-core",
    (((0, 8), (0, 20)),),
    "releases before 0.8 have no VocabParallelCrossEntropy pieces (their "
    "_VocabParallelCrossEntropy.forward is one block), and 0.19.2 is the newest release",
)
"""The releases of megatron-core the adapter serves; it refuses the others before any work."""

VERIFIED_VERSIONS = str(SERVED)

CAPABILITY = LogprobBackendCapability(
    backend_id="megatron_vp_ce",
    roles=frozenset({LogprobRole.TRAIN, LogprobRole.INFER}),
    dtypes=frozenset(LogprobDType),
    cp_world_sizes=frozenset({1}),
    supports_vocab_padding=False,
    mask_modes=frozenset({MaskMode.ALL_ACTIVE}),  # no mask: every target is read
    exports_vocab_lse=True,
    determinism_scopes=frozenset({DeterminismScope.FIXED_TOPOLOGY}),
)


@imported_once
def _megatron() -> dict[str, Any]:
    """Megatron's classes."""
    SERVED.installed()
    with warnings.catch_warnings():
        # "Transformer Engine and Apex are not installed", "absl.logging is not installed"
        warnings.simplefilter("ignore")
        from megatron.core import parallel_state
        from megatron.core.tensor_parallel.cross_entropy import (
            VocabParallelCrossEntropy,
            vocab_parallel_cross_entropy,
        )
        from megatron.core.tensor_parallel.utils import VocabUtility
    return {
        "pieces": VocabParallelCrossEntropy,
        "utility": VocabUtility,
        "function": vocab_parallel_cross_entropy,
        "parallel_state": parallel_state,
    }


def _all_reduce_max(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    if group is None:
        return tensor
    if isinstance(group, TorchGroup):  # Megatron's own call
        torch.distributed.all_reduce(
            tensor, op=torch.distributed.ReduceOp.MAX, group=group.process_group
        )
        return tensor
    return torch.stack(group.all_gather(tensor)).amax(dim=0)


def _all_reduce_sum(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    if group is None:
        return tensor
    if isinstance(group, TorchGroup):  # Megatron's own call
        torch.distributed.all_reduce(
            tensor, op=torch.distributed.ReduceOp.SUM, group=group.process_group
        )
        return tensor
    gathered = group.all_gather(tensor)
    total: torch.Tensor = gathered[0]
    for part in gathered[1:]:  # rank order: every rank adds the same way
        total = total + part
    return total


class _VocabParallelLoss(torch.autograd.Function):
    """Megatron's ``_VocabParallelCrossEntropy`` with all-reduces over a tp-logprob group."""

    @staticmethod
    def forward(
        ctx: Any, logits: torch.Tensor, targets: torch.Tensor, bounds: Any, group: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        pieces = _megatron()["pieces"]
        # fp32 input would be modified in place by Megatron: give it a copy.
        source = logits.clone() if logits.dtype == torch.float32 else logits
        source, logits_max = pieces.calculate_logits_max(source)
        logits_max = _all_reduce_max(logits_max, group)
        start, end = bounds
        target_mask, masked_target_1d, predicted, sum_exp, exp_logits = (
            pieces.calculate_predicted_logits(source, targets, logits_max, start, end)
        )
        predicted = _all_reduce_sum(predicted, group)
        sum_exp = _all_reduce_sum(sum_exp, group)
        softmax, loss = pieces.calculate_cross_entropy_loss(exp_logits, predicted, sum_exp)
        ctx.save_for_backward(softmax, target_mask, masked_target_1d)
        ctx.input_dtype = logits.dtype
        ctx.mark_non_differentiable(logits_max, sum_exp)
        return loss, logits_max, sum_exp

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, *_: Any) -> Any:
        pieces = _megatron()["pieces"]
        softmax, target_mask, masked_target_1d = ctx.saved_tensors
        grad_2d, arange_1d, softmax_update, grad_input = (
            pieces.prepare_gradient_calculation_operands(softmax, target_mask)
        )
        grad_input = pieces.calculate_gradients(
            grad_2d, arange_1d, masked_target_1d, softmax_update, grad_input, grad_loss
        )
        return grad_input.to(ctx.input_dtype), None, None, None


def _run(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any,
    bounds: tuple[int, int],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Megatron's loss and the LSE built from its merged max and sum."""
    loss, logits_max, sum_exp = _VocabParallelLoss.apply(local_logits, targets, bounds, group)
    lse = lse_from_max(logits_max, torch.log(sum_exp)) if contract.export_lse else None
    return loss, lse


def megatron_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
) -> LogprobResult:
    """``(selected_logp, lse)`` with the contract's shard bounds as Megatron's vocab range."""
    check_op_inputs(local_logits, targets, contract, group)
    loss, lse = _run(local_logits, targets, contract, group, contract.sharding.local_bounds)
    return LogprobResult(selected_from_loss(loss), lse)


def megatron_equal_shards_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
) -> LogprobResult:
    """``(selected_logp, lse)`` with Megatron's own ``rank * width`` vocab range."""
    check_op_inputs(local_logits, targets, contract, group)
    sharding = contract.sharding
    vocab_range = _megatron()["utility"].vocab_range_from_per_partition_vocab_size
    bounds = vocab_range(local_logits.shape[1], sharding.tp_rank, sharding.tp_world_size)
    loss, lse = _run(local_logits, targets, contract, group, bounds)
    return LogprobResult(selected_from_loss(loss), lse)


def megatron_loss_mask_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
) -> LogprobResult:
    """What Megatron's training loop does with inactive tokens: ``-(loss * loss_mask)``."""
    check_op_inputs(local_logits, targets, contract, group)
    loss, lse = _run(local_logits, targets, contract, group, contract.sharding.local_bounds)
    loss_mask = active_mask_tensor(contract, local_logits.device).float()
    return LogprobResult(-(loss * loss_mask), lse)


def tensor_parallel_state(contract: LogprobContract) -> None:
    """Megatron's ``parallel_state`` with the contract's TP degree over the default group.

    Initialized on first use; a later contract of another degree is refused, since the
    state is the process's.
    """
    if not torch.distributed.is_initialized():
        raise LogprobContractError(
            "torch.distributed is not initialized: Megatron's parallel_state needs a real "
            "process group (run under torchrun; the backend is real_group_only)"
        )
    state = _megatron()["parallel_state"]
    world = contract.sharding.tp_world_size
    if not state.model_parallel_is_initialized():
        state.initialize_model_parallel(tensor_model_parallel_size=world)
    megatron_world = state.get_tensor_model_parallel_world_size()
    if megatron_world != world:
        raise LogprobContractError(
            f"sharding.tp_world_size={world}: Megatron's tensor-parallel group has "
            f"{megatron_world} ranks"
        )


def megatron_library_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
) -> LogprobResult:
    """``selected_logp`` from Megatron's own ``vocab_parallel_cross_entropy`` on Megatron's
    tensor-parallel group (``group`` is not used: Megatron finds its own)."""
    check_op_inputs(local_logits, targets, contract, group)
    tensor_parallel_state(contract)
    # fp32 input would be modified in place by Megatron: give it a copy.
    loss = _megatron()["function"](private_copy(local_logits), targets)
    return LogprobResult(selected_from_loss(loss), None)


honest = (megatron_logprob, CAPABILITY)
"""The honest backend: ``--tp-logprob-backend=tp_logprob.peers.megatron:honest``."""

equal_shards = (
    megatron_equal_shards_logprob,
    dataclasses.replace(
        CAPABILITY, backend_id="megatron_vp_ce_equal_shards", even_shards_only=True
    ),
)
"""Megatron's own ``rank * width`` shard ranges: even shards only."""

library = (
    megatron_library_logprob,
    dataclasses.replace(
        CAPABILITY,
        backend_id="megatron_vp_ce_library",
        exports_vocab_lse=False,
        even_shards_only=True,
        real_group_only=True,
    ),
)
"""Megatron's ``vocab_parallel_cross_entropy`` whole, on its own groups: real groups only."""

assume_padding = claiming(honest, "assume_padding", supports_vocab_padding=True)
assume_cross_tp_bitwise = claiming(
    honest,
    "assume_cross_tp_bitwise",
    determinism_scopes=frozenset({DeterminismScope.CROSS_TP_BITWISE}),
)
assume_inactive_tokens = claiming(
    (megatron_loss_mask_logprob, CAPABILITY),
    "assume_inactive_tokens",
    mask_modes=frozenset(MaskMode),
)
assume_uneven_shards = claiming(equal_shards, "assume_uneven_shards", even_shards_only=False)
