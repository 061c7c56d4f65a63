"""Preflight: prove every rank agrees on the contract and the backend before a collective op.

Dispatch runs on each rank independently, so two ranks with slightly different
contracts (another mask, other shard bounds) or registries could pick different
backends and then meet in mismatched collectives: a hang or silent garbage. One
small all-gather before the first call rules that out, after which
``registry.get_logprob_op(contract, "auto", preflighted=True)`` is honest.

Each rank sends a fixed-size uint8 record (equal shapes are what all-gather
needs on every transport): the sha256 of its contract fingerprint, the sha256
of its backend id, its ``tp_rank`` and ``tp_world_size``, and the backend id's
first bytes (for the error message only).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from tp_logprob.comm import GroupHandle
from tp_logprob.contract import LogprobContract
from tp_logprob.errors import LogprobContractError, LogprobDispatchError

if TYPE_CHECKING:
    from tp_logprob.registry import KernelRegistry, LogprobDispatchResult

__all__ = ["NO_BACKEND", "preflight", "resolve_and_preflight"]

NO_BACKEND = "<no backend>"
"""The backend id a rank reports to its peers when its own dispatch failed."""

_DIGEST = 32
_NAME = 64
_RECORD = 2 * _DIGEST + 8 + _NAME


def preflight(contract: LogprobContract, backend_id: str, group: GroupHandle | None) -> None:
    """Raise :class:`LogprobDispatchError` naming the ranks unless all ranks agree.

    Every rank of ``group`` must call this with its own contract and the backend
    id it resolved; all of them raise the same error, or none does. ``group=None``
    means TP=1, where there is nothing to agree on.

    Example, on every rank::

        dispatch = registry.get_logprob_op(contract, "auto", preflighted=True)
        preflight(contract, dispatch.capability.backend_id, group)
    """
    import torch

    if not isinstance(contract, LogprobContract):
        raise LogprobContractError(
            f"contract={contract!r}: expected a LogprobContract, got {type(contract).__name__}"
        )
    if not isinstance(backend_id, str):
        raise LogprobContractError(f"backend_id={backend_id!r}: expected a str")
    sharding = contract.sharding
    if group is None:
        if sharding.tp_world_size != 1:
            raise LogprobContractError(
                f"group=None: means TP=1, but the contract has tp_world_size="
                f"{sharding.tp_world_size}"
            )
        return
    record = _encode(contract, backend_id)
    device = getattr(group, "device", None) or torch.device("cpu")
    sent = torch.tensor(list(record), dtype=torch.uint8, device=device)
    gathered = [bytes(t.cpu().tolist()) for t in group.all_gather(sent)]
    problems = _disagreements([_decode(item) for item in gathered], group.world_size)
    if problems:
        raise LogprobDispatchError(
            f"preflight failed (seen by rank {group.rank} of {group.world_size}): ranks disagree\n"
            + "\n".join(f"  - {problem}" for problem in problems)
        )


def resolve_and_preflight(
    contract: LogprobContract,
    group: GroupHandle | None,
    requested_backend: str = "auto",
    *,
    registry: KernelRegistry | None = None,
    platform: str | None = None,
) -> LogprobDispatchResult:
    """Dispatch locally, then :func:`preflight` the outcome; what most callers want.

    A rank whose own dispatch fails still takes part in the preflight (reporting
    ``NO_BACKEND``), so its peers learn of it at once instead of timing out.
    """
    if registry is None:
        from tp_logprob.registry import registry as default_registry

        registry = default_registry
    try:
        result = registry.get_logprob_op(
            contract, requested_backend, platform=platform, preflighted=True
        )
    except LogprobDispatchError:
        preflight(contract, NO_BACKEND, group)
        raise
    preflight(contract, result.capability.backend_id, group)
    return result


def _encode(contract: LogprobContract, backend_id: str) -> bytes:
    sharding = contract.sharding
    name = backend_id.encode()[:_NAME].ljust(_NAME, b"\0")
    return b"".join(
        (
            bytes.fromhex(contract.cross_rank_fingerprint()),
            hashlib.sha256(backend_id.encode()).digest(),
            sharding.tp_rank.to_bytes(4, "little"),
            sharding.tp_world_size.to_bytes(4, "little"),
            name,
        )
    )


def _decode(record: bytes) -> tuple[str, str, int, int, str]:
    if len(record) != _RECORD:
        raise LogprobDispatchError(f"preflight: a peer sent {len(record)} bytes, not {_RECORD}")
    fingerprint = record[:_DIGEST].hex()
    backend_digest = record[_DIGEST : 2 * _DIGEST].hex()
    offset = 2 * _DIGEST
    tp_rank = int.from_bytes(record[offset : offset + 4], "little")
    tp_world = int.from_bytes(record[offset + 4 : offset + 8], "little")
    name = record[offset + 8 :].rstrip(b"\0").decode(errors="replace")
    return fingerprint, backend_digest, tp_rank, tp_world, name


def _disagreements(records: list[tuple[str, str, int, int, str]], world: int) -> list[str]:
    problems = []
    fingerprints = _ranks_by([record[0][:12] for record in records])
    if len(fingerprints) > 1:
        problems.append(f"contract fingerprint (cross_rank_fingerprint): {_format(fingerprints)}")
    backends = _ranks_by([record[1] for record in records])
    if len(backends) > 1:
        names = {repr(records[ranks[0]][4]): ranks for ranks in backends.values()}
        problems.append(f"resolved backend: {_format(names)}")
    for rank, (_, _, tp_rank, tp_world, _) in enumerate(records):
        if (tp_rank, tp_world) != (rank, world):
            problems.append(
                f"group rank {rank} of {world} holds a contract for tp_rank={tp_rank} of "
                f"tp_world_size={tp_world}"
            )
    return problems


def _ranks_by(values: list[str]) -> dict[str, list[int]]:
    """Each distinct value with the ranks holding it, in order of first appearance."""
    ranks: dict[str, list[int]] = {}
    for rank, value in enumerate(values):
        ranks.setdefault(value, []).append(rank)
    return ranks


def _format(ranks: dict[str, list[int]]) -> str:
    return "; ".join(f"{value} on ranks {members}" for value, members in ranks.items())
