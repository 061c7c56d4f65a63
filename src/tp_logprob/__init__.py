"""tp-logprob: vocab-parallel token log-probabilities you can prove correct.

Public API re-exports only. Importing this package imports neither torch nor
triton: the contract and registry are pure Python, backends load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from tp_logprob.accumulation import AccumulationOrder
from tp_logprob.capability import ImplementationKind, LogprobBackendCapability
from tp_logprob.contract import (
    DeterminismScope,
    LogprobContract,
    LogprobDType,
    LogprobInputKind,
    LogprobOutputSpec,
    LogprobRole,
    MaskMode,
    MaskSpec,
    ReductionSpec,
    ShardingSpec,
    SupportMode,
    SupportSpec,
    even_shard_bounds,
)
from tp_logprob.errors import LogprobContractError, LogprobDispatchError
from tp_logprob.registry import (
    KernelRegistry,
    LogprobDispatchProvenance,
    LogprobDispatchResult,
    detect_platform,
    registry,
)
from tp_logprob.result import LogprobResult

__version__ = "0.1.0"

__all__ = [
    "AccumulationOrder",
    "DeterminismScope",
    "ImplementationKind",
    "KernelRegistry",
    "LogprobBackendCapability",
    "LogprobContract",
    "LogprobContractError",
    "LogprobDType",
    "LogprobDispatchError",
    "LogprobDispatchProvenance",
    "LogprobDispatchResult",
    "LogprobInputKind",
    "LogprobOutputSpec",
    "LogprobResult",
    "LogprobRole",
    "MaskMode",
    "MaskSpec",
    "ReductionSpec",
    "ShardingSpec",
    "SupportMode",
    "SupportSpec",
    "__version__",
    "comm",
    "detect_platform",
    "even_shard_bounds",
    "preflight",
    "registry",
    "resolve_and_preflight",
    "run_tp",
    "run_tp_hidden",
]

# Names that need torch at call time are resolved on first access.
_LAZY = {
    "comm": ("tp_logprob.comm", None),
    "run_tp": ("tp_logprob.emulate", "run_tp"),
    "run_tp_hidden": ("tp_logprob.emulate", "run_tp_hidden"),
    "preflight": ("tp_logprob.preflight", "preflight"),
    "resolve_and_preflight": ("tp_logprob.preflight", "resolve_and_preflight"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'tp_logprob' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
