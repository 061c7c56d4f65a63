"""Capability-gated dispatch: a contract only ever reaches a backend that declares it can serve it.

Backends are registered per platform as a factory plus a capability. Factories run
on first dispatch (so ``import tp_logprob`` never imports torch or triton); one that
raises is recorded as failed, skipped, and reported, not retried on every call.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tp_logprob._validation import check_bool, check_instance
from tp_logprob.capability import PLATFORMS, ImplementationKind, LogprobBackendCapability
from tp_logprob.contract import DeterminismScope, LogprobContract
from tp_logprob.errors import LogprobContractError, LogprobDispatchError

__all__ = [
    "PLATFORMS",
    "KernelRegistry",
    "LogprobDispatchProvenance",
    "LogprobDispatchResult",
    "detect_platform",
    "registry",
]

LogprobOp = Callable[..., Any]
"""``op(local_logits, targets, contract, group=None) -> LogprobResult``."""


def detect_platform() -> str:
    """``rocm`` for a HIP build with a device, ``cuda`` when CUDA is available, else ``cpu``."""
    if importlib.util.find_spec("torch") is None:
        return "cpu"
    torch = importlib.import_module("torch")
    if not torch.cuda.is_available():
        return "cpu"
    return "rocm" if getattr(torch.version, "hip", None) else "cuda"


def _check_platform(platform: object) -> str:
    if not isinstance(platform, str) or platform not in PLATFORMS:
        raise LogprobContractError(f"platform={platform!r}: expected one of {PLATFORMS}")
    return platform


def _resolve_platform(platform: object) -> str:
    """The detected platform for None, else ``platform`` checked."""
    return detect_platform() if platform is None else _check_platform(platform)


@dataclass(frozen=True)
class LogprobDispatchProvenance:
    """Why this backend was chosen: enough to audit a run after the fact."""

    requested_backend: str
    platform: str
    contract: dict[str, Any]
    selected: dict[str, Any]
    fallback: bool
    rejected: tuple[tuple[str, tuple[str, ...]], ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible form."""
        return {
            "requested_backend": self.requested_backend,
            "platform": self.platform,
            "contract": self.contract,
            "selected": self.selected,
            "fallback": self.fallback,
            "rejected": [
                {"backend_id": backend_id, "reasons": list(reasons)}
                for backend_id, reasons in self.rejected
            ],
        }


@dataclass(frozen=True)
class LogprobDispatchResult:
    """The op to call, the capability it was chosen under, and why."""

    op: LogprobOp
    capability: LogprobBackendCapability
    provenance: LogprobDispatchProvenance


@dataclass
class _Entry:
    factory: Callable[[], LogprobOp]
    capability: LogprobBackendCapability
    op: LogprobOp | None = None
    failure: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def build(self) -> LogprobOp | None:
        """Run the factory once; remember the op or the failure."""
        with self.lock:
            if self.op is None and self.failure is None:
                try:
                    op = self.factory()
                    if not callable(op):
                        raise TypeError(f"factory returned {op!r}, which is not callable")
                    self.op = op
                except Exception as error:  # a broken backend must not break dispatch
                    self.failure = f"factory failed: {type(error).__name__}: {error}"
            return self.op


class KernelRegistry:
    """Backends per platform, and the dispatcher that honours their capabilities."""

    def __init__(self) -> None:
        self._entries: dict[str, dict[str, _Entry]] = {platform: {} for platform in PLATFORMS}
        self._lock = threading.Lock()

    def register_logprob_backend(
        self,
        platform: str,
        factory: Callable[[], LogprobOp],
        capability: LogprobBackendCapability,
        *,
        replace: bool = False,
    ) -> None:
        """Register ``factory`` (called once, on first dispatch) under ``capability``."""
        platform = _check_platform(platform)
        if not callable(factory):
            raise LogprobContractError(f"factory={factory!r}: expected a callable")
        check_instance("capability", capability, LogprobBackendCapability)
        replace = check_bool("replace", replace)
        claims_platforms = DeterminismScope.CROSS_PLATFORM_BITWISE in capability.determinism_scopes
        if claims_platforms and platform not in capability.bitwise_platforms:
            raise LogprobContractError(
                f"platform={platform!r}: {capability.backend_id!r} claims "
                "cross_platform_bitwise for bitwise_platforms="
                f"{sorted(capability.bitwise_platforms)!r} only; register a capability "
                "without that scope here"
            )
        with self._lock:
            entries = self._entries[platform]
            if capability.backend_id in entries and not replace:
                raise LogprobContractError(
                    f"backend_id={capability.backend_id!r}: already registered on "
                    f"platform={platform!r}; pass replace=True to replace it"
                )
            entries[capability.backend_id] = _Entry(factory, capability)

    def backends(self, platform: str | None = None) -> tuple[LogprobBackendCapability, ...]:
        """The capabilities registered on ``platform`` (the detected one by default)."""
        platform = _resolve_platform(platform)
        with self._lock:
            return tuple(entry.capability for entry in self._entries[platform].values())

    def failures(self, platform: str | None = None) -> dict[str, str]:
        """Backends whose factory raised, with the error."""
        platform = _resolve_platform(platform)
        with self._lock:
            entries = list(self._entries[platform].items())
        return {name: entry.failure for name, entry in entries if entry.failure is not None}

    def load_backends(self, platform: str | None = None) -> dict[str, str | None]:
        """Run every factory on ``platform`` now: backend id -> its failure, or None if loaded."""
        platform = _resolve_platform(platform)
        with self._lock:
            entries = list(self._entries[platform].items())
        return {
            name: None if entry.build() is not None else entry.failure for name, entry in entries
        }

    def get_logprob_op(
        self,
        contract: LogprobContract,
        requested_backend: str = "auto",
        *,
        platform: str | None = None,
        preflighted: bool = False,
    ) -> LogprobDispatchResult:
        """Pick a backend whose capability supports ``contract``.

        ``requested_backend`` is ``"auto"`` (production backends first, then
        reference), ``"production"``, ``"reference"`` or a backend id. Policies
        with ``tp_world_size > 1`` need ``preflighted=True``: every rank must have
        agreed on the contract fingerprint and the resolved backend (see
        :func:`tp_logprob.preflight`), or ranks could resolve different backends.
        """
        check_instance("contract", contract, LogprobContract)
        preflighted = check_bool("preflighted", preflighted)
        platform = _resolve_platform(platform)
        if not isinstance(requested_backend, str):
            raise LogprobContractError(f"requested_backend={requested_backend!r}: expected a str")
        request = requested_backend.strip()
        policy = request.lower()
        if policy == "deterministic":
            raise LogprobContractError(
                f"requested_backend={requested_backend!r}: determinism is part of the "
                "contract, not a backend; request ReductionSpec(determinism_scope=...) instead"
            )
        is_policy = policy in ("auto", "production", "reference")
        world = contract.sharding.tp_world_size
        if is_policy and world > 1 and not preflighted:
            raise LogprobDispatchError(
                f"requested_backend={requested_backend!r} with tp_world_size={world}: ranks "
                "could resolve different backends; run tp_logprob.preflight(...) on every "
                "rank and pass preflighted=True, or request a backend id"
            )
        candidates = self._candidates(platform, request, policy if is_policy else None)
        rejected: list[tuple[str, tuple[str, ...]]] = []
        for entry in candidates:
            reasons = entry.capability.incompatibilities(contract)
            op = None if reasons else entry.build()
            if op is None:
                rejected.append((entry.capability.backend_id, reasons or (str(entry.failure),)))
                continue
            provenance = LogprobDispatchProvenance(
                requested_backend=request,
                platform=platform,
                contract=contract.to_dict(),
                selected=entry.capability.to_dict(),
                fallback=bool(rejected),
                rejected=tuple(rejected),
            )
            return LogprobDispatchResult(op, entry.capability, provenance)
        raise LogprobDispatchError(_no_backend_message(request, platform, contract, rejected))

    def _candidates(self, platform: str, request: str, policy: str | None) -> list[_Entry]:
        with self._lock:
            entries = dict(self._entries[platform])
        if policy is None:
            if request not in entries:
                known = ", ".join(sorted(entries)) or "none"
                raise LogprobDispatchError(
                    f"requested_backend={request!r}: not registered on platform={platform!r} "
                    f"(registered: {known})"
                )
            return [entries[request]]
        kinds = {
            "auto": (ImplementationKind.PRODUCTION, ImplementationKind.REFERENCE),
            "production": (ImplementationKind.PRODUCTION,),
            "reference": (ImplementationKind.REFERENCE,),
        }[policy]
        return [
            entry
            for kind in kinds
            for entry in entries.values()
            if entry.capability.implementation_kind is kind
        ]


def _no_backend_message(
    request: str,
    platform: str,
    contract: LogprobContract,
    rejected: list[tuple[str, tuple[str, ...]]],
) -> str:
    lines = [
        f"no backend on platform={platform!r} serves requested_backend={request!r} for "
        f"contract: {contract.describe()}"
    ]
    if not rejected:
        lines.append("  (no candidate backends registered for this request)")
    for backend_id, reasons in rejected:
        lines.append(f"  {backend_id}:")
        lines.extend(f"    - {reason}" for reason in reasons)
    return "\n".join(lines)


def _default_registry() -> KernelRegistry:
    from tp_logprob.kernels.builtin import register_builtin_backends

    default = KernelRegistry()
    register_builtin_backends(default)
    return default


registry = _default_registry()
"""The default registry, holding the built-in backends."""
