"""The capability rules, each written once: which values of a contract dimension a backend serves.

A rule reads one dimension of a contract (its role, its TP degree, whether it has
vocabulary padding, ...) and says which values of it a capability serves. Dispatch
(:meth:`~tp_logprob.LogprobBackendCapability.incompatibilities`) runs every rule on a
contract and collects the reasons of the rules it breaks; the contract strategies ask
the same rules which values to draw. So a rule cannot drift between what is served
and what is tested.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tp_logprob.contract import (
    DeterminismScope,
    LogprobContract,
    LogprobDType,
    LogprobInputKind,
    LogprobRole,
    MaskMode,
    SupportMode,
)

if TYPE_CHECKING:
    from tp_logprob.capability import LogprobBackendCapability

__all__ = ["CAPABILITY_RULES", "MASK_NEEDS", "CapabilityRule", "mask_modes_served"]

MASK_NEEDS = (MaskMode.EXPLICIT_ACTIVE_MASK, MaskMode.IGNORE_INDEX)
"""The mask modes a contract can need (:attr:`~tp_logprob.MaskSpec.mode`)."""

_BOOLS = (False, True)
_BOTH = frozenset(_BOOLS)
_NO = frozenset({False})


def mask_modes_served(offered: Iterable[MaskMode]) -> frozenset[MaskMode]:
    """The mask modes a contract can need that a backend offering ``offered`` serves."""
    modes = frozenset(offered)
    return frozenset(need for need in MASK_NEEDS if any(mode.serves(need) for mode in modes))


@dataclass(frozen=True)
class CapabilityRule:
    """One contract dimension: how to read it, which values a capability serves, and why not.

    ``domain`` lists every value a contract can hold in this dimension when there
    are finitely many (None for TP and CP sizes and the temperature). ``served``
    returns the values a capability serves, or None for every valid value.
    ``reason`` is the dispatch message for a contract whose value is not served.
    """

    dimension: str
    domain: tuple[Any, ...] | None
    value_of: Callable[[LogprobContract], Any]
    served: Callable[[LogprobBackendCapability], frozenset[Any] | None]
    reason: Callable[[LogprobBackendCapability, LogprobContract], str]

    def serves(self, capability: LogprobBackendCapability, value: object) -> bool:
        """Whether ``capability`` serves a contract whose value in this dimension is ``value``."""
        served = self.served(capability)
        return served is None or value in served

    def refusal(
        self, capability: LogprobBackendCapability, contract: LogprobContract
    ) -> str | None:
        """The reason ``capability`` cannot serve ``contract`` in this dimension, or None."""
        if self.serves(capability, self.value_of(contract)):
            return None
        return self.reason(capability, contract)


def _names(members: frozenset[Any]) -> list[str]:
    return sorted(member.value for member in members)


def _flag(claimed: bool) -> frozenset[bool]:
    """A claim that, when made, adds ``True`` to the served values of a bool dimension."""
    return _BOTH if claimed else _NO


def _mask_reason(capability: LogprobBackendCapability, contract: LogprobContract) -> str:
    needed = contract.mask_mode
    inactive = contract.num_tokens - contract.mask.active_token_count
    why = (
        f" ({inactive} inactive tokens, whose targets need not hold ignore_index)"
        if needed is MaskMode.EXPLICIT_ACTIVE_MASK
        else ""
    )
    return (
        f"mask mode {needed.value!r}{why} not served by mask_modes {_names(capability.mask_modes)}"
    )


def _even_reason(capability: LogprobBackendCapability, contract: LogprobContract) -> str:
    sharding = contract.sharding
    return (
        f"vocab_shard_bounds {list(sharding.vocab_shard_bounds)} are not equal "
        f"shards of {sharding.padded_vocab_size} columns over {sharding.tp_world_size} "
        "ranks and the backend has even_shards_only=True"
    )


def _scopes_served(capability: LogprobBackendCapability) -> frozenset[DeterminismScope]:
    offered = capability.determinism_scopes
    return frozenset(s for s in DeterminismScope if any(o.satisfies(s) for o in offered))


CAPABILITY_RULES = (
    CapabilityRule(
        "input_kind",
        tuple(LogprobInputKind),
        lambda c: c.input_kind,
        lambda cap: cap.input_kinds,
        lambda cap, c: (
            f"input_kind {c.input_kind.value!r} not in input_kinds {_names(cap.input_kinds)}"
        ),
    ),
    CapabilityRule(
        "allow_tf32",
        _BOOLS,
        lambda c: c.allow_tf32,
        lambda cap: _NO,
        lambda cap, c: (
            "allow_tf32=True requested but no TF32 error model exists; "
            "the backend computes fp32 dot products in full fp32"
        ),
    ),
    CapabilityRule(
        "role",
        tuple(LogprobRole),
        lambda c: c.role,
        lambda cap: cap.roles,
        lambda cap, c: f"role {c.role.value!r} not in {_names(cap.roles)}",
    ),
    CapabilityRule(
        "dtype",
        tuple(LogprobDType),
        lambda c: c.dtype,
        lambda cap: cap.dtypes,
        lambda cap, c: f"dtype {c.dtype.value!r} not in {_names(cap.dtypes)}",
    ),
    CapabilityRule(
        "tp_world_size",
        None,
        lambda c: c.sharding.tp_world_size,
        lambda cap: cap.tp_world_sizes,
        lambda cap, c: (
            f"tp_world_size {c.sharding.tp_world_size} not in {sorted(cap.tp_world_sizes or ())}"
        ),
    ),
    CapabilityRule(
        "cp_world_size",
        None,
        lambda c: c.sharding.cp_world_size,
        lambda cap: cap.cp_world_sizes,
        lambda cap, c: (
            f"cp_world_size {c.sharding.cp_world_size} not in {sorted(cap.cp_world_sizes or ())}"
        ),
    ),
    CapabilityRule(
        "vocab_padding",
        _BOOLS,
        lambda c: c.sharding.has_padding,
        lambda cap: _flag(cap.supports_vocab_padding),
        lambda cap, c: (
            f"vocabulary padding (real {c.sharding.real_vocab_size} < padded "
            f"{c.sharding.padded_vocab_size}) not supported"
        ),
    ),
    CapabilityRule(
        "mask_mode",
        MASK_NEEDS,
        lambda c: c.mask_mode,
        lambda cap: mask_modes_served(cap.mask_modes),
        _mask_reason,
    ),
    CapabilityRule(
        "support_mode",
        tuple(SupportMode),
        lambda c: c.support_mode,
        lambda cap: cap.support_modes,
        lambda cap, c: (
            f"support mode {c.support_mode.value!r} not in support_modes "
            f"{_names(cap.support_modes)}"
        ),
    ),
    CapabilityRule(
        "has_bias",
        _BOOLS,
        lambda c: c.has_bias,
        lambda cap: _flag(cap.supports_bias),
        lambda cap, c: "has_bias=True requested but supports_bias=False",
    ),
    CapabilityRule(
        "export_lse",
        _BOOLS,
        lambda c: c.export_lse,
        lambda cap: _flag(cap.exports_vocab_lse),
        lambda cap, c: "export_lse requested but the backend does not export the LSE",
    ),
    CapabilityRule(
        "temperature",
        None,
        lambda c: c.temperature,
        lambda cap: None if cap.supports_temperature else frozenset({1.0}),
        lambda cap, c: f"temperature={c.temperature!r} requested but supports_temperature=False",
    ),
    CapabilityRule(
        "export_entropy",
        _BOOLS,
        lambda c: c.export_entropy,
        lambda cap: _flag(cap.exports_entropy),
        lambda cap, c: "export_entropy requested but exports_entropy=False",
    ),
    CapabilityRule(
        "even_layout",
        _BOOLS,
        lambda c: c.sharding.is_even_layout,
        lambda cap: frozenset({True}) if cap.even_shards_only else _BOTH,
        _even_reason,
    ),
    CapabilityRule(
        "determinism_scope",
        tuple(DeterminismScope),
        lambda c: c.reduction.determinism_scope,
        _scopes_served,
        lambda cap, c: (
            f"determinism scope {c.reduction.determinism_scope.value!r} not met by "
            f"{_names(cap.determinism_scopes)}"
        ),
    ),
)
"""Every rule, in the order dispatch reports their reasons."""
