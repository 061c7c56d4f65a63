"""PyTorch's vocab-parallel loss (``loss_parallel`` on a DTensor) as a tp-logprob backend.

This is the path TorchTitan trains with: the LM head's output is a DTensor
sharded on the vocabulary dimension (``Shard(1)``) over a one-dimensional device
mesh, upcast with ``.float()`` (as TorchTitan's ``cross_entropy_loss`` does), and
``torch.nn.functional.cross_entropy(..., reduction="none")`` runs under
``torch.distributed.tensor.parallel.loss_parallel()``, whose handlers compute the
log-softmax with an all-reduce MAX and an all-reduce SUM and gather the target
logit with a masked all-reduce. Verified with torch 2.13.0 (the conformance run,
the CPU build) and, with this adapter's tests under ``nox -s peer_releases``, 2.14.1
(PyPI's CUDA 13 build, its CUDA libraries from disk, on a CPU: ``>=2.13,<2.15``).
Other releases are refused: PyPI's Linux builds of torch are CUDA builds, and the
CPU runs install 2.14.1's wheel and CUDA libraries from local disk; any other
release downloads its own (2.12.0: the wheel, nvidia-cudnn-cu13 9.20 and
nvidia-nccl-cu13 2.29, gigabytes), and the adapter drives PyTorch's private
threaded process group, which moves between releases.

Process groups. With a :class:`tp_logprob.comm.TorchGroup` handle the mesh is
built on its real process group (gloo on CPU, nccl on GPU). The property suite
runs every rank as a thread of one process; for those handles the adapter uses
PyTorch's in-process *threaded* process group, the one PyTorch's own DTensor
tests run on (``torch.testing._internal.distributed.multi_threaded_pg``): the
ranks meet through a ``HashStore`` whose key they agree on over the handle's
``all_gather``. Installing it swaps ``torch.distributed``'s world for a
per-thread one for the rest of the process, so the two kinds of handle do not
mix in one process: in a process that already holds a real process group (the
suite under ``torchrun``), an emulated handle raises
:class:`~tp_logprob.comm.EmulationUnavailableError`, and the suite skips what
would need it.

``loss_parallel()`` installs process-wide DTensor handlers that are not
reference counted (two threads leaving it at once raise ``KeyError``), and the
backward pass must run while they are installed, which is after the op returns:
the adapter enables them once for the process and leaves them on.

Capability, from PyTorch's docs and ``distributed/tensor/parallel/loss.py``:

- any TP, even shards only (``even_shards_only``): a ``Shard(1)`` DTensor splits
  the vocabulary like ``torch.chunk`` (``ceil(V / tp)`` columns per rank, the last
  one shorter, as :func:`tp_logprob.even_shard_bounds` does), and each rank finds
  the target's owner from that layout, so other bounds fail (an index error);
- fp32, bf16 and fp16 inputs (upcast with ``.float()`` first, exactly);
- no vocabulary padding; mask mode ``ignore_index`` (``target == ignore_index``
  gives a loss of 0; any other out-of-range target is silently masked to a 0 target
  logit, so inactive rows must hold ``ignore_index``);
- train and infer; ``fixed_topology``; no temperature, no entropy.

Glue: ``selected_logp = 0.0 - loss``. ``loss_parallel`` has no LSE output; the
adapter runs the same handlers' ``log_softmax`` on the DTensor and takes
``lse = M - max_v log_softmax(x)_v`` (the largest log-probability is exactly
``-log S``), with ``M`` and both maxima reduced by DTensor, and ``lse = M`` where
``M`` is ``+-inf``. That costs a second pass over the logits and two more
all-reduces.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import torch

from tp_logprob.capability import LogprobBackendCapability
from tp_logprob.comm import CollectiveAbortedError, EmulationUnavailableError, TorchGroup
from tp_logprob.contract import (
    DeterminismScope,
    LogprobContract,
    LogprobDType,
    LogprobRole,
    MaskMode,
)
from tp_logprob.kernels.validation import check_op_inputs
from tp_logprob.peers._glue import claiming, lse_from_max, selected_from_loss
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
    "honest",
    "loss_parallel_logprob",
]

SERVED = ServedReleases(
    "torch",
    (((2, 13), (2, 15)),),
    "the adapter drives torch's private threaded process group "
    "(torch.testing._internal.distributed.multi_threaded_pg), which other releases may move, "
    "and only 2.13 and 2.14 were run",
)
"""The torch releases the adapter serves; it refuses the others before any work."""

VERIFIED_VERSIONS = str(SERVED)

CAPABILITY = LogprobBackendCapability(
    backend_id="torch_loss_parallel",
    roles=frozenset({LogprobRole.TRAIN, LogprobRole.INFER}),
    dtypes=frozenset(LogprobDType),
    cp_world_sizes=frozenset({1}),
    supports_vocab_padding=False,
    mask_modes=frozenset({MaskMode.IGNORE_INDEX}),
    exports_vocab_lse=True,
    # An all-reduce SUM of per-rank partials: its association follows N and the chunking.
    determinism_scopes=frozenset({DeterminismScope.RUN_TO_RUN}),
    even_shards_only=True,
)

_SETUP_LOCK = threading.Lock()
_STATE: dict[str, Any] = {}
_STORES: dict[int, Any] = {}
_STORE_KEYS = itertools.count(1)


def loss_parallel_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
) -> LogprobResult:
    """``(selected_logp, lse)`` from ``cross_entropy`` on a vocab-sharded DTensor."""
    check_op_inputs(local_logits, targets, contract, group)
    if isinstance(group, TorchGroup):  # a real process group: DTensor's own collectives
        import torch.distributed as dist

        process_group = dist.group.WORLD if group.process_group is None else group.process_group
        return _compute(local_logits, targets, contract, process_group)
    import torch.distributed as dist
    from torch.testing._internal.distributed.multi_threaded_pg import ProcessLocalGroup

    if "threaded" not in _STATE and dist.is_initialized():
        raise EmulationUnavailableError(
            "torch_loss_parallel: this process holds a real process group, and the adapter's "
            "emulated group (PyTorch's threaded one) would replace torch.distributed's world "
            "for the whole process; run it at the real group's TP degree"
        )
    _enable_loss_parallel(threaded=True)

    rank, world = (0, 1) if group is None else (group.rank, group.world_size)
    if rank == 0:  # a previous call's failure left the threaded collectives stopped
        ProcessLocalGroup.reset()
    key, store = _shared_store(rank, group)
    dist.init_process_group("threaded", rank=rank, world_size=world, store=store)
    try:
        if rank == 0:  # every rank has passed init's store barrier: the store is found
            _STORES.pop(key, None)
        return _compute(local_logits, targets, contract, dist.group.WORLD)
    except SystemExit as stopped:  # how the threaded group stops the peers of a failed rank
        raise CollectiveAbortedError(f"rank {rank}: a peer rank failed ({stopped})") from None
    except Exception as error:
        ProcessLocalGroup.exception_handle(error)  # wake the peers waiting in a collective
        raise
    finally:
        dist.destroy_process_group()


def _compute(
    local_logits: torch.Tensor, targets: torch.Tensor, contract: LogprobContract, process_group: Any
) -> LogprobResult:
    _enable_loss_parallel(threaded=False)
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.nn import functional

    mesh = DeviceMesh.from_group(process_group, local_logits.device.type)
    rows, padded = contract.num_tokens, contract.sharding.padded_vocab_size
    logits = DTensor.from_local(
        local_logits.float(),  # TorchTitan's cross_entropy_loss upcasts the same way
        mesh,
        [Shard(1)],
        run_check=False,
        shape=torch.Size((rows, padded)),
        stride=(padded, 1),
    )
    ignore_index = contract.mask.ignore_index
    loss: Any = functional.cross_entropy(
        logits, targets, reduction="none", ignore_index=ignore_index
    )
    lse = None
    if contract.export_lse:
        with torch.no_grad():
            row_max: Any = logits.amax(dim=1)
            top_logprob: Any = functional.log_softmax(logits, dim=1).amax(dim=1)
            lse = lse_from_max(row_max.full_tensor(), -top_logprob.full_tensor())
    return LogprobResult(selected_from_loss(loss.to_local()), lse)


def _shared_store(rank: int, group: Any) -> tuple[int, Any]:
    """One ``HashStore`` for all ranks of this call, found through the handle's all-gather."""
    import torch.distributed as dist

    key = torch.zeros(1, dtype=torch.int64)
    if rank == 0:
        key[0] = next(_STORE_KEYS)
        _STORES[int(key[0])] = dist.HashStore()
    if group is not None:
        key = group.all_gather(key)[0]
    return int(key[0]), _STORES[int(key[0])]


def _enable_loss_parallel(*, threaded: bool) -> None:
    """Install the threaded process group (if asked) and loss_parallel's handlers, once."""
    SERVED.installed()
    with _SETUP_LOCK:
        if threaded and "threaded" not in _STATE:
            from torch.testing._internal.distributed.multi_threaded_pg import (
                _install_threaded_pg,
            )

            torch._C._distributed_c10d._set_thread_isolation_mode(True)  # type: ignore[attr-defined]
            _install_threaded_pg()
            _STATE["threaded"] = True
        if "loss_parallel" not in _STATE:
            from torch.distributed.tensor.parallel import loss_parallel

            context = loss_parallel()
            context.__enter__()
            _STATE["loss_parallel"] = context


honest = (loss_parallel_logprob, CAPABILITY)
"""The honest backend: ``--tp-logprob-backend=tp_logprob.peers.torch_loss_parallel:honest``."""

assume_uneven_shards = claiming(honest, "assume_uneven_shards", even_shards_only=False)
assume_padding = claiming(honest, "assume_padding", supports_vocab_padding=True)
assume_batch_invariant = claiming(
    honest,
    "assume_batch_invariant",
    determinism_scopes=frozenset({DeterminismScope.FIXED_TOPOLOGY}),
)
assume_inactive_tokens = claiming(honest, "assume_inactive_tokens", mask_modes=frozenset(MaskMode))
assume_cross_tp_bitwise = claiming(
    honest,
    "assume_cross_tp_bitwise",
    determinism_scopes=frozenset({DeterminismScope.CROSS_TP_BITWISE}),
)
