"""What a backend declares it can serve, and why it cannot serve a given contract.

The capability rules are each written once, here: a rule reads one dimension of a
contract (its role, its TP degree, whether it has vocabulary padding, ...) and says
which values of it a capability serves. Dispatch
(:meth:`LogprobBackendCapability.incompatibilities`) runs every rule on a contract and
collects the reasons of the rules it breaks; the contract strategies ask the same
rules which values to draw. So a rule cannot drift between what is served and what
is tested.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from tp_logprob._validation import check_bool, check_enum, check_enum_set, check_int_set
from tp_logprob.accumulation import ANY_ORDER, AccumulationOrder
from tp_logprob.contract import (
    DeterminismScope,
    LogprobContract,
    LogprobDType,
    LogprobInputKind,
    LogprobRole,
    MaskMode,
    SupportMode,
)
from tp_logprob.errors import LogprobContractError

__all__ = [
    "CAPABILITY_RULES",
    "CONTRACT_DIMENSIONS",
    "POLICY_KEYWORDS",
    "CapabilityRule",
    "ImplementationKind",
    "MASK_NEEDS",
    "PLATFORMS",
    "LogprobBackendCapability",
    "mask_modes_served",
]

PLATFORMS = ("cuda", "rocm", "cpu")
"""Where a backend can be registered: NVIDIA GPUs, AMD GPUs, the CPU."""

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
        "heterogeneous",
        _BOOLS,
        lambda c: c.heterogeneous,
        lambda cap: _flag(cap.supports_row_parameters),
        lambda cap, c: (
            "per-row sampling parameters (a heterogeneous batch: per-row temperature, top_k, "
            "top_p or min_p) requested but supports_row_parameters=False"
        ),
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

POLICY_KEYWORDS = frozenset({"auto", "production", "reference", "deterministic"})
"""Words a backend id may not be: they name dispatch policies, not backends."""

CONTRACT_DIMENSIONS = tuple(rule.dimension for rule in CAPABILITY_RULES)
"""The contract dimensions a capability rules on, for :meth:`LogprobBackendCapability.serves`."""

_RULES_BY_DIMENSION = {rule.dimension: rule for rule in CAPABILITY_RULES}


class ImplementationKind(str, Enum):
    """``production`` backends are meant for training; ``reference`` ones for checking."""

    PRODUCTION = "production"
    REFERENCE = "reference"


def _check_backend_id(value: object) -> str:
    if not isinstance(value, str):
        raise LogprobContractError(f"backend_id={value!r}: expected a str")
    backend_id = value.strip()
    if not backend_id:
        raise LogprobContractError(f"backend_id={value!r}: must not be blank")
    if backend_id.lower() in POLICY_KEYWORDS:
        raise LogprobContractError(
            f"backend_id={value!r}: shadows the dispatch policy {backend_id.lower()!r}; "
            "choose another name"
        )
    return backend_id


@dataclass(frozen=True)
class LogprobBackendCapability:
    """The contracts one backend serves on one platform.

    ``tp_world_sizes`` / ``cp_world_sizes`` of None mean any size. A determinism
    scope meets every weaker request (``cross_tp_bitwise`` > ``fixed_topology`` >
    ``run_to_run``), and a backend with ``explicit_active_mask`` also serves masks
    that need only ``ignore_index`` (as ``ignore_index`` and ``all_active`` backends do).
    ``supports_temperature`` means the op divides ``fp32(x) / fp32(T)`` as the
    contract says (any backend serves ``temperature=1.0``); ``exports_entropy``
    means it returns ``entropy`` when ``export_entropy=True``. ``even_shards_only``
    means it serves only equal shards, ``padded / tp`` columns each with the TP
    degree dividing the padded vocabulary (the layout
    :func:`~tp_logprob.even_shard_bounds` makes then), as kernels that derive their
    range from ``rank * width`` do (Megatron's ``VocabUtility``).
    ``consumes_input`` means the op may write into ``local_logits`` (to save
    memory); without it the suite requires the inputs untouched. ``real_group_only``
    means the op does its own communication through ``torch.distributed`` (on the
    default process group, or on groups it built, as Megatron-Core's functions do)
    instead of through the group handle it is given: it runs only on a real
    process group (the suite under ``torchrun``), and the suite skips, saying so,
    whatever would need the emulated group. ``input_kinds``
    says what the op takes: ``logits`` (a rank's logits shard) or ``hidden`` (hidden
    states and the rank's LM-head weight rows, the fused form; see
    :class:`~tp_logprob.LogprobInputKind`); a ``hidden`` backend that adds the LM
    head's bias says ``supports_bias``, and is sent no ``has_bias`` contract without
    it. No built-in backend claims TF32, so a
    contract with ``allow_tf32=True`` is rejected rather than served in full fp32.
    ``support_modes`` says over which supports the op normalises (see
    :class:`~tp_logprob.SupportMode`): ``full`` (no support, the default),
    ``sampling_params`` (recomputed from top-k / top-p / min-p) and
    ``replayed_mask`` (the engine's kept ids). ``supports_row_parameters`` means it
    serves a heterogeneous batch, each row with its own temperature (0 for a greedy
    row) and sampling parameters (``docs/semantics.md``, "Heterogeneous batches");
    without it dispatch refuses such a contract. ``bitwise_platforms`` names the
    platforms (of :data:`PLATFORMS`) on which a backend claiming
    ``cross_platform_bitwise`` gives the same bits as on every other one of them: it is
    required with that scope, refused without it, and the registry refuses the claim on a
    platform outside it. ``accumulation_order`` says how the op sums a shard's terms
    (:class:`~tp_logprob.accumulation.AccumulationOrder`, default any order): the suite
    holds the backend to that order's tolerance bound and checks the declaration with
    rows built to break it (``docs/tolerances.md``, "Declared orders").

    Each of these rules is written once, in :data:`CAPABILITY_RULES`:
    :meth:`incompatibilities` runs them, and :meth:`served_values` / :meth:`serves`
    answer from them per contract dimension (the contract strategies draw from
    those answers). ``docs/semantics.md``, "Capability rules", states them.
    """

    backend_id: str
    roles: frozenset[LogprobRole]
    dtypes: frozenset[LogprobDType]
    tp_world_sizes: frozenset[int] | None = None
    cp_world_sizes: frozenset[int] | None = None
    supports_vocab_padding: bool = False
    mask_modes: frozenset[MaskMode] = frozenset()
    exports_vocab_lse: bool = False
    determinism_scopes: frozenset[DeterminismScope] = frozenset()
    implementation_kind: ImplementationKind = ImplementationKind.PRODUCTION
    supports_temperature: bool = False
    exports_entropy: bool = False
    even_shards_only: bool = False
    consumes_input: bool = False
    real_group_only: bool = False
    input_kinds: frozenset[LogprobInputKind] = frozenset({LogprobInputKind.LOGITS})
    supports_bias: bool = False
    support_modes: frozenset[SupportMode] = frozenset({SupportMode.FULL})
    supports_row_parameters: bool = False
    bitwise_platforms: frozenset[str] = frozenset()
    accumulation_order: AccumulationOrder = ANY_ORDER

    def __post_init__(self) -> None:
        checked: dict[str, Any] = {
            "backend_id": _check_backend_id(self.backend_id),
            "roles": check_enum_set("roles", self.roles, LogprobRole, non_empty=True),
            "dtypes": check_enum_set("dtypes", self.dtypes, LogprobDType, non_empty=True),
            "tp_world_sizes": check_int_set("tp_world_sizes", self.tp_world_sizes, min_value=1),
            "cp_world_sizes": check_int_set("cp_world_sizes", self.cp_world_sizes, min_value=1),
            "supports_vocab_padding": check_bool(
                "supports_vocab_padding", self.supports_vocab_padding
            ),
            "mask_modes": check_enum_set("mask_modes", self.mask_modes, MaskMode, non_empty=False),
            "exports_vocab_lse": check_bool("exports_vocab_lse", self.exports_vocab_lse),
            "determinism_scopes": check_enum_set(
                "determinism_scopes", self.determinism_scopes, DeterminismScope, non_empty=True
            ),
            "implementation_kind": check_enum(
                "implementation_kind", self.implementation_kind, ImplementationKind
            ),
            "supports_temperature": check_bool("supports_temperature", self.supports_temperature),
            "exports_entropy": check_bool("exports_entropy", self.exports_entropy),
            "even_shards_only": check_bool("even_shards_only", self.even_shards_only),
            "consumes_input": check_bool("consumes_input", self.consumes_input),
            "real_group_only": check_bool("real_group_only", self.real_group_only),
            "input_kinds": check_enum_set(
                "input_kinds", self.input_kinds, LogprobInputKind, non_empty=True
            ),
            "supports_bias": check_bool("supports_bias", self.supports_bias),
            "support_modes": check_enum_set(
                "support_modes", self.support_modes, SupportMode, non_empty=True
            ),
            "supports_row_parameters": check_bool(
                "supports_row_parameters", self.supports_row_parameters
            ),
        }
        if not isinstance(self.accumulation_order, AccumulationOrder):
            raise LogprobContractError(
                f"accumulation_order={self.accumulation_order!r}: expected an "
                "AccumulationOrder (tp_logprob.AccumulationOrder.any(), .tree(), ...)"
            )
        checked["bitwise_platforms"] = _check_bitwise_platforms(
            self.bitwise_platforms, checked["determinism_scopes"]
        )
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    def incompatibilities(self, contract: LogprobContract) -> tuple[str, ...]:
        """Every reason this backend cannot serve ``contract``; empty when it can.

        One reason per broken rule of :data:`CAPABILITY_RULES`, in its order.
        """
        refusals = (rule.refusal(self, contract) for rule in CAPABILITY_RULES)
        return tuple(reason for reason in refusals if reason is not None)

    def served_values(self, dimension: str) -> frozenset[Any] | None:
        """The values of contract ``dimension`` this backend serves; None means every valid one.

        ``dimension`` is one of :data:`CONTRACT_DIMENSIONS`; the answer comes from the
        rule dispatch runs, so what is drawn for a backend is what it is sent.

        >>> from tp_logprob.kernels.builtin import TORCH_NATIVE
        >>> sorted(s.value for s in TORCH_NATIVE.served_values("determinism_scope"))
        ['fixed_topology', 'run_to_run']
        """
        return _rule(dimension).served(self)

    def serves(self, dimension: str, value: object) -> bool:
        """Whether this backend serves a contract whose ``dimension`` holds ``value``.

        >>> from tp_logprob.kernels.builtin import TORCH_NATIVE
        >>> TORCH_NATIVE.serves("tp_world_size", 8), TORCH_NATIVE.serves("allow_tf32", True)
        (True, False)
        """
        return _rule(dimension).serves(self, value)

    def supports(self, contract: LogprobContract) -> bool:
        """Whether this backend can serve ``contract``."""
        return not self.incompatibilities(contract)

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible description, stable across runs."""
        return {
            "backend_id": self.backend_id,
            "roles": _names(self.roles),
            "dtypes": _names(self.dtypes),
            "tp_world_sizes": None if self.tp_world_sizes is None else sorted(self.tp_world_sizes),
            "cp_world_sizes": None if self.cp_world_sizes is None else sorted(self.cp_world_sizes),
            "supports_vocab_padding": self.supports_vocab_padding,
            "mask_modes": _names(self.mask_modes),
            "exports_vocab_lse": self.exports_vocab_lse,
            "determinism_scopes": _names(self.determinism_scopes),
            "implementation_kind": self.implementation_kind.value,
            "supports_temperature": self.supports_temperature,
            "exports_entropy": self.exports_entropy,
            "even_shards_only": self.even_shards_only,
            "consumes_input": self.consumes_input,
            "real_group_only": self.real_group_only,
            "input_kinds": _names(self.input_kinds),
            "supports_bias": self.supports_bias,
            "support_modes": _names(self.support_modes),
            "supports_row_parameters": self.supports_row_parameters,
            "bitwise_platforms": sorted(self.bitwise_platforms),
            "accumulation_order": self.accumulation_order.to_dict(),
        }


def _names(members: frozenset[Any]) -> list[str]:
    return sorted(member.value for member in members)


def _rule(dimension: object) -> CapabilityRule:
    rule = _RULES_BY_DIMENSION.get(dimension) if isinstance(dimension, str) else None
    if rule is None:
        raise LogprobContractError(
            f"dimension={dimension!r}: expected one of {', '.join(CONTRACT_DIMENSIONS)}"
        )
    return rule


def _check_bitwise_platforms(
    platforms: object, scopes: frozenset[DeterminismScope]
) -> frozenset[str]:
    """``bitwise_platforms`` as a frozenset of :data:`PLATFORMS`, given exactly when
    ``cross_platform_bitwise`` is claimed."""
    if isinstance(platforms, (str, bytes)) or not isinstance(platforms, Iterable):
        raise LogprobContractError(
            f"bitwise_platforms={platforms!r}: expected a set of platforms from {PLATFORMS}"
        )
    values = frozenset(platforms)
    unknown = sorted(repr(p) for p in values if not isinstance(p, str) or p not in PLATFORMS)
    if unknown:
        raise LogprobContractError(
            f"bitwise_platforms={platforms!r}: {', '.join(unknown)} not one of {PLATFORMS}"
        )
    claimed = DeterminismScope.CROSS_PLATFORM_BITWISE in scopes
    if claimed and not values:
        raise LogprobContractError(
            "bitwise_platforms=frozenset(): a cross_platform_bitwise backend names the "
            f"platforms whose bits it matches, from {PLATFORMS}"
        )
    if values and not claimed:
        raise LogprobContractError(
            f"bitwise_platforms={sorted(values)!r}: only a backend claiming "
            "determinism_scopes with cross_platform_bitwise names bitwise platforms"
        )
    return values
