"""Tensor parallelism in one process: shard a full logits tensor, run every rank, compare.

``run_tp`` is how tests and the property suite drive a backend at any TP degree
without starting processes: each rank runs in its own thread with an
:class:`~tp_logprob.comm.EmulatedGroup` handle, on a column slice (a view) of
the full logits.

Gradients follow real TP training. Each rank's outputs are connected only to
that rank's slice, so backprop *every* rank's (replicated) loss, each into its
own shard::

    results = run_tp(op, logits, targets, contract)
    sum(r.selected_logp.sum() for r in results).backward()   # each column once

Backpropagating only ``results[0]`` fills rank 0's columns and leaves the
others' gradient at zero.

Neither function can hang. Ranks waiting in the group's all-gather give up after
``timeout`` seconds, and a rank stuck anywhere else (a backend's own collective,
a lock that is never released) is reported once no rank has made progress for
``timeout`` seconds: a :class:`~tp_logprob.comm.CollectiveTimeoutError` that names
the ranks still running. Such a rank's thread cannot be stopped; it is left
behind as a daemon thread.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from tp_logprob.comm import (
    DEFAULT_TIMEOUT_S,
    CollectiveAbortedError,
    CollectiveError,
    CollectiveTimeoutError,
    EmulatedGroup,
    GroupHandle,
)
from tp_logprob.contract import LogprobContract
from tp_logprob.errors import LogprobContractError
from tp_logprob.result import LogprobResult

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import torch

__all__ = ["ReplicationError", "as_result", "check_replicated", "run_tp", "run_tp_hidden"]


class ReplicationError(RuntimeError):
    """Ranks returned outputs that are not bitwise identical (a backend bug)."""


def run_tp(
    op: Callable[..., Any],
    logits: torch.Tensor | Sequence[torch.Tensor],
    targets: torch.Tensor,
    contract: LogprobContract,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> list[LogprobResult]:
    """Run ``op`` on every rank of ``contract``'s sharding; return each rank's result.

    ``logits`` is the full ``[N, padded_vocab_size]`` tensor, or one shard per rank in
    rank order (a list, as a trainer holds them), and ``contract`` any rank's contract.
    Rank r calls
    ``op(logits[:, start_r:end_r], targets, contract.with_rank(r), group=handle_r)``
    (or ``op(logits[r], ...)``) in its own thread. If a rank raises, the group is aborted
    so no peer waits, and the first rank's own exception is re-raised (not a peer's abort
    error).
    Outputs must be bitwise identical on every rank, else :class:`ReplicationError`.
    ``timeout`` bounds every wait, the group's collectives and the ranks' progress
    (see the module docstring).

    Example::

        results = run_tp(torch_native_logprob, logits, targets, contract)
        assert len(results) == contract.sharding.tp_world_size
    """
    import torch

    if not isinstance(contract, LogprobContract):
        raise LogprobContractError(
            f"contract={contract!r}: expected a LogprobContract, got {type(contract).__name__}"
        )
    sharding = contract.sharding
    if isinstance(logits, (list, tuple)):
        shards = _checked_shards(list(logits), contract)
        return _run_ranks(
            lambda rank, contract_r, group: op(shards[rank], targets, contract_r, group=group),
            contract,
            timeout,
        )
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise LogprobContractError(
            f"logits: expected a 2-dim torch.Tensor [num_tokens, padded_vocab_size], got {shape}"
        )
    if logits.shape[1] != sharding.padded_vocab_size:
        raise LogprobContractError(
            f"logits: width {logits.shape[1]} != padded_vocab_size={sharding.padded_vocab_size}"
            " (run_tp takes the full, unsharded logits)"
        )

    def call(rank: int, contract_r: LogprobContract, group: GroupHandle | None) -> Any:
        start, end = sharding.vocab_shard_bounds[rank]
        return op(logits[:, start:end], targets, contract_r, group=group)

    return _run_ranks(call, contract, timeout)


def _checked_shards(shards: list[Any], contract: LogprobContract) -> list[torch.Tensor]:
    """``shards``, one 2-dim tensor per rank of the sharding, each its rank's width."""
    import torch

    for rank, shard in enumerate(shards):
        if not isinstance(shard, torch.Tensor) or shard.dim() != 2:
            shape = tuple(shard.shape) if isinstance(shard, torch.Tensor) else type(shard).__name__
            raise LogprobContractError(
                f"logits[{rank}]: expected a 2-dim torch.Tensor shard, got {shape}"
            )
    bounds = contract.sharding.vocab_shard_bounds
    if len(shards) != len(bounds):
        raise LogprobContractError(
            f"logits: {len(shards)} shards for tp_world_size={len(bounds)} (one per rank)"
        )
    for rank, (shard, (start, end)) in enumerate(zip(shards, bounds, strict=True)):
        if shard.shape[1] != end - start:
            raise LogprobContractError(
                f"logits[{rank}]: width {shard.shape[1]} != its shard's {end - start} "
                f"(vocab_shard_bounds[{rank}]=({start}, {end}))"
            )
    return shards


def run_tp_hidden(
    op: Callable[..., Any],
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    *,
    bias: torch.Tensor | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> list[LogprobResult]:
    """:func:`run_tp` for fused LM-head ops (contracts with ``input_kind="hidden"``).

    ``weight`` is the full ``[padded_vocab_size, hidden_size]`` LM-head weight and
    ``bias`` (when the contract has one) the full ``[padded_vocab_size]``. Rank r calls
    ``op(hidden, targets, contract.with_rank(r), group=handle_r, weight=weight[start_r:end_r],
    bias=bias[start_r:end_r])`` (``hidden`` replicated, weight rows a view). Replication
    is checked as in :func:`run_tp`.

    Gradients: each rank's ``d weight`` lands in its own rows; ``d hidden`` from
    backpropagating every rank's loss is the sum of the ranks' partials, which is
    the all-reduce a real TP caller performs.
    """
    import torch

    if not isinstance(contract, LogprobContract):
        raise LogprobContractError(
            f"contract={contract!r}: expected a LogprobContract, got {type(contract).__name__}"
        )
    sharding = contract.sharding
    for name, value, dims in (("weight", weight, 2), ("bias", bias, 1)):
        if value is None:
            continue
        if not isinstance(value, torch.Tensor) or value.dim() != dims:
            raise LogprobContractError(
                f"{name}: expected a {dims}-dim torch.Tensor with padded_vocab_size rows"
            )
        if value.shape[0] != sharding.padded_vocab_size:
            raise LogprobContractError(
                f"{name}: {value.shape[0]} rows != padded_vocab_size={sharding.padded_vocab_size}"
                " (run_tp_hidden takes the full, unsharded weight)"
            )

    def call(rank: int, contract_r: LogprobContract, group: GroupHandle | None) -> Any:
        start, end = sharding.vocab_shard_bounds[rank]
        shard_bias = None if bias is None else bias[start:end]
        return op(
            hidden, targets, contract_r, group=group, weight=weight[start:end], bias=shard_bias
        )

    return _run_ranks(call, contract, timeout)


def _run_ranks(
    call: Callable[[int, LogprobContract, Any], Any], contract: LogprobContract, timeout: float
) -> list[LogprobResult]:
    """``call(rank, rank_contract, group_handle)`` on every rank in its own thread."""
    import torch

    world = contract.sharding.tp_world_size
    group = EmulatedGroup(world, timeout=timeout, name=f"run_tp(tp={world})")
    results: list[Any] = [None] * world
    errors: list[BaseException | None] = [None] * world
    grad_enabled = torch.is_grad_enabled()  # grad mode is thread-local: carry the caller's

    def rank_main(rank: int) -> None:
        try:
            with torch.set_grad_enabled(grad_enabled):
                results[rank] = call(rank, contract.with_rank(rank), group[rank])
        except BaseException as error:
            errors[rank] = error
            group.abort(f"rank {rank} raised {type(error).__name__}: {error}")
        finally:
            group.note_progress()

    threads = [
        threading.Thread(target=rank_main, args=(rank,), name=f"tp-rank-{rank}", daemon=True)
        for rank in range(world)
    ]
    for thread in threads:
        thread.start()
    hung = _wait_for_ranks(threads, group, timeout)
    if hung is not None:
        _reraise_first(errors, note=str(hung))
        raise hung
    _reraise_first(errors)
    checked = [as_result(rank, result) for rank, result in enumerate(results)]
    check_replicated(checked)
    return checked


_POLL_S = 0.05


def _wait_for_ranks(
    threads: list[threading.Thread], group: EmulatedGroup, timeout: float
) -> CollectiveTimeoutError | None:
    """Join every rank; the error to raise if some rank stops making progress."""
    while True:
        running = [rank for rank, thread in enumerate(threads) if thread.is_alive()]
        if not running:
            return None
        if group.idle_seconds() > timeout:
            break
        threads[running[0]].join(_POLL_S)
    waiting = group.waiting_ranks()
    group.abort(f"rank(s) {running} made no progress for {timeout:g} s")
    for rank in waiting:
        threads[rank].join(1.0)  # they raise the abort and finish
    stuck = [rank for rank in running if rank not in waiting]
    where = (
        f"rank(s) {stuck} never reached the group's all_gather: the op waits in something "
        "else (a collective of its own, a lock) or computes"
        if stuck
        else f"rank(s) {waiting} waited in the group's all_gather"
    )
    return CollectiveTimeoutError(
        f"{group.name}: no rank made progress for {timeout:g} s and rank(s) {running} of "
        f"{group.world_size} are still running; {where}. Pass a larger timeout= if the op is "
        "only slow."
    )


def _reraise_first(errors: list[BaseException | None], *, note: str | None = None) -> None:
    """Raise the lowest rank's own error, preferring it over peers' consequential aborts.

    With ``note`` (ranks hung), only a rank's own error is raised, never an abort.
    """
    raised = [(rank, error) for rank, error in enumerate(errors) if error is not None]
    consequential = CollectiveAbortedError if note is None else CollectiveError
    primary = [item for item in raised if not isinstance(item[1], consequential)]
    if note is not None:
        raised = primary
    if not raised:
        return
    rank, error = (primary or raised)[0]
    if hasattr(error, "add_note"):
        error.add_note(f"(raised on emulated TP rank {rank} of {len(errors)})")
        if note is not None:
            error.add_note(note)
    raise error


def as_result(rank: int, result: object) -> LogprobResult:
    """Rank ``rank``'s op return as a LogprobResult: plain ``(selected, lse)`` pairs still count."""
    if isinstance(result, LogprobResult):
        return result
    if isinstance(result, tuple) and len(result) in (2, 3):
        return LogprobResult(*result)
    raise ReplicationError(
        f"rank {rank}: op returned {type(result).__name__}, expected a "
        "LogprobResult(selected_logp, lse[, entropy])"
    )


def check_replicated(results: list[LogprobResult]) -> None:
    """Raise :class:`ReplicationError` unless every rank's outputs have rank 0's exact bits.

    Bits are compared, so equal NaN payloads match and ``0.0`` differs from ``-0.0``. A
    processed op's ``support_lse``, ``support_size`` and ``support_threshold`` count too.
    """
    for name in (*LogprobResult._fields, *LogprobResult.SUPPORT_FIELDS):
        reference = getattr(results[0], name)
        for rank, result in enumerate(results[1:], start=1):
            problem = _bit_difference(reference, getattr(result, name))
            if problem is not None:
                raise ReplicationError(f"{name} differs between rank 0 and rank {rank}: {problem}")


def _bit_difference(a: Any, b: Any) -> str | None:
    import torch

    if a is None or b is None:
        return None if a is None and b is None else f"rank 0 gave {a!r}, the other {b!r}"
    if (a.shape, a.dtype) != (b.shape, b.dtype):
        return f"shape/dtype {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    a_flat, b_flat = (t.detach().cpu().reshape(-1) for t in (a, b))
    a_bits, b_bits = a_flat.contiguous().view(bits), b_flat.contiguous().view(bits)
    differ = torch.nonzero(a_bits != b_bits).flatten()
    if differ.numel() == 0:
        return None
    row = int(differ[0])
    unsigned = (1 << (8 * a.element_size())) - 1  # show bit patterns, not signed ints
    return (
        f"first at row {row} ({a_flat[row].item()!r} vs {b_flat[row].item()!r}; bits "
        f"{int(a_bits[row]) & unsigned:#x} vs {int(b_bits[row]) & unsigned:#x}), "
        f"{differ.numel()} rows in all"
    )
