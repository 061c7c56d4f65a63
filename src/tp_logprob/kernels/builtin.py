"""The built-in backends' capabilities and lazy factories.

Each factory imports its kernel module only when first dispatched, so registering
the built-ins costs nothing and needs neither torch nor triton installed.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
from collections.abc import Callable
from typing import Any

from tp_logprob.accumulation import AccumulationOrder
from tp_logprob.capability import PLATFORMS, LogprobBackendCapability
from tp_logprob.contract import (
    DeterminismScope,
    LogprobDType,
    LogprobInputKind,
    LogprobRole,
    MaskMode,
)
from tp_logprob.support import SupportMode

__all__ = [
    "TORCH_NATIVE",
    "TORCH_NATIVE_FUSED",
    "TORCH_PORTABLE",
    "TRITON_EXACT_SUM",
    "TRITON_FUSED",
    "TRITON_FUSED_EXACT_SUM",
    "TRITON_ONLINE",
    "TRITON_PORTABLE",
    "ONLINE_BLOCKS",
    "PLATFORM_TWINS",
    "ROCM_FUSED_CAPABILITIES",
    "register_builtin_backends",
    "register_fused_backends",
    "triton_platforms",
]


def _capability(
    backend_id: str, scope: DeterminismScope, **fields: Any
) -> LogprobBackendCapability:
    """Every built-in serves every sampling support: the full vocabulary, sampling
    parameters and a replayed mask (``docs/semantics.md``, "Processed logprobs"), and
    heterogeneous batches (``kernels/heterogeneous.py``: the Triton kernels read a per-row
    temperature, the torch ops run group by group), unless ``fields`` say otherwise."""
    settings: dict[str, Any] = dict(
        support_modes=frozenset(SupportMode),
        supports_row_parameters=True,
    )
    settings.update(fields)
    return LogprobBackendCapability(
        backend_id=backend_id,
        roles=frozenset(LogprobRole),
        dtypes=frozenset(LogprobDType),
        tp_world_sizes=None,
        cp_world_sizes=frozenset({1}),
        supports_vocab_padding=True,
        mask_modes=frozenset({MaskMode.EXPLICIT_ACTIVE_MASK, MaskMode.IGNORE_INDEX}),
        exports_vocab_lse=True,
        determinism_scopes=frozenset({scope}),
        supports_temperature=True,
        exports_entropy=True,
        **settings,
    )


ONLINE_BLOCKS: dict[str, tuple[int, ...]] = {
    "cuda": (2048, 4096),
    "rocm": (2048, 4096),
    "cpu": (16,),
}
"""platform -> the ``BLOCK`` widths ``triton_online``'s row kernel launches with (fp32 and
16-bit inputs; ``triton/launch.py``'s table, which a test holds this to)."""


def _online_order(platform: str) -> AccumulationOrder:
    """``triton_online``'s order: per-lane sums over ``BLOCK``-wide tiles, rescaled at every
    tile, and ``tl.sum`` over the lanes, whose order Triton leaves open."""
    return AccumulationOrder.online(ONLINE_BLOCKS[platform])


_FIXED_POINT = AccumulationOrder.fixed_point()
"""Exact int64 sums of ``floor(exp(z - M) 2^K)``, ``K = 62 - bitlength(V - 1)``."""

TORCH_NATIVE = _capability(
    "torch_native",
    DeterminismScope.FIXED_TOPOLOGY,
    accumulation_order=AccumulationOrder.tree(),
)
"""Each shard summed by ``partials.tree_sum``: a fixed pairwise tree of elementwise adds."""
TORCH_NATIVE_FUSED = dataclasses.replace(
    _capability("torch_native_fused", DeterminismScope.FIXED_TOPOLOGY),
    input_kinds=frozenset({LogprobInputKind.HIDDEN}),
    supports_bias=True,
)
TRITON_FUSED = dataclasses.replace(
    _capability("triton_fused", DeterminismScope.FIXED_TOPOLOGY),
    input_kinds=frozenset({LogprobInputKind.HIDDEN}),
    supports_bias=True,
)
TRITON_FUSED_EXACT_SUM = dataclasses.replace(
    _capability(
        "triton_fused_exact_sum",
        DeterminismScope.CROSS_TP_BITWISE,
        accumulation_order=_FIXED_POINT,
    ),
    input_kinds=frozenset({LogprobInputKind.HIDDEN}),
    supports_bias=True,
)
TRITON_ONLINE = _capability(
    "triton_online", DeterminismScope.FIXED_TOPOLOGY, accumulation_order=_online_order("cuda")
)
"""``triton_online`` on a GPU; on each platform it declares that platform's tiles."""

_RUN_TO_RUN = frozenset({DeterminismScope.RUN_TO_RUN})
ROCM_FUSED_CAPABILITIES = {
    TRITON_FUSED.backend_id: dataclasses.replace(TRITON_FUSED, determinism_scopes=_RUN_TO_RUN),
    TRITON_FUSED_EXACT_SUM.backend_id: dataclasses.replace(
        TRITON_FUSED_EXACT_SUM, determinism_scopes=_RUN_TO_RUN
    ),
}
"""The Triton fused backends on ROCm. Their batch invariance and cross-TP bits rest on a
logit depending on its hidden row and weight row alone; Triton lowers an fp32 ``tl.dot``
to MFMA instructions there, whose per-element summation order AMD does not document
(``triton/fused_kernels.py``), so they claim run-to-run bits only until a device run of
the suite establishes more."""
TRITON_EXACT_SUM = _capability(
    "triton_exact_sum", DeterminismScope.CROSS_TP_BITWISE, accumulation_order=_FIXED_POINT
)
TRITON_PORTABLE = _capability(
    "triton_portable",
    DeterminismScope.CROSS_PLATFORM_BITWISE,
    support_modes=frozenset({SupportMode.FULL}),
    bitwise_platforms=frozenset(PLATFORMS),
    accumulation_order=_FIXED_POINT,
)
"""``triton_exact_sum`` with portable ``exp`` and ``log`` and no fp contraction
(``triton/portable_sum.py``): its forward outputs are the same bits on CPU (the
interpreter), NVIDIA and AMD, and the same as ``torch_portable``'s."""
TORCH_PORTABLE = dataclasses.replace(TRITON_PORTABLE, backend_id="torch_portable")
"""``triton_portable`` in torch (``kernels/portable_sum.py``), registered on CPU: the same
bits, forward and gradient, without the Triton interpreter."""

PLATFORM_TWINS = {
    TRITON_PORTABLE.backend_id: TORCH_PORTABLE.backend_id,
    TORCH_PORTABLE.backend_id: TRITON_PORTABLE.backend_id,
}
"""Backends claiming ``cross_platform_bitwise`` -> the backend that computes the same
operations in another implementation, whose outputs must be the same bits (the property
``platform_twins``, ``properties/test_platforms.py``)."""


def _lazy(module: str, attr: str) -> Callable[[], Any]:
    def factory() -> Any:
        return getattr(importlib.import_module(module), attr)

    factory.__qualname__ = f"lazy({module}:{attr})"
    return factory


def triton_platforms() -> tuple[str, ...]:
    """Where the Triton backends run: GPUs, and the CPU under ``TRITON_INTERPRET=1``."""
    if importlib.util.find_spec("triton") is None:
        return ()
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    return ("cuda", "rocm", "cpu") if interpreted else ("cuda", "rocm")


def register_builtin_backends(registry: Any) -> None:
    """Register torch_native everywhere, the Triton backends where Triton runs, and the
    fused LM-head backends (:func:`register_fused_backends`)."""
    for platform in ("cuda", "rocm", "cpu"):
        registry.register_logprob_backend(
            platform, _lazy("tp_logprob.kernels.native", "torch_native_logprob"), TORCH_NATIVE
        )
    registry.register_logprob_backend(
        "cpu",
        _lazy("tp_logprob.kernels.portable_sum", "torch_portable_logprob"),
        TORCH_PORTABLE,
    )
    for platform in triton_platforms():
        registry.register_logprob_backend(
            platform,
            _lazy("tp_logprob.kernels.triton.online", "triton_online_logprob"),
            dataclasses.replace(TRITON_ONLINE, accumulation_order=_online_order(platform)),
        )
        registry.register_logprob_backend(
            platform,
            _lazy("tp_logprob.kernels.triton.exact_sum", "triton_exact_sum_logprob"),
            TRITON_EXACT_SUM,
        )
        registry.register_logprob_backend(
            platform,
            _lazy("tp_logprob.kernels.triton.portable_sum", "triton_portable_logprob"),
            TRITON_PORTABLE,
        )
    register_fused_backends(registry)


def register_fused_backends(registry: Any) -> None:
    """Register the fused LM-head backends (hidden-state input): ``torch_native_fused``
    everywhere, ``triton_fused`` and ``triton_fused_exact_sum`` where Triton runs. Part
    of the default registry (:func:`register_builtin_backends`)."""
    for platform in ("cuda", "rocm", "cpu"):
        registry.register_logprob_backend(
            platform,
            _lazy("tp_logprob.kernels.native_fused", "torch_native_fused_logprob"),
            TORCH_NATIVE_FUSED,
        )
    for platform in triton_platforms():
        for module, op, capability in (
            ("fused", "triton_fused_logprob", TRITON_FUSED),
            ("fused_exact_sum", "triton_fused_exact_sum_logprob", TRITON_FUSED_EXACT_SUM),
        ):
            if platform == "rocm":
                capability = ROCM_FUSED_CAPABILITIES[capability.backend_id]
            registry.register_logprob_backend(
                platform, _lazy(f"tp_logprob.kernels.triton.{module}", op), capability
            )
