"""A stand-in backend claiming cross_platform_bitwise, for testing what the claim binds.

It is torch_native's op under a capability that claims the scope on chosen platforms:
the replay and corpus comparisons are under test, not the op (which makes no such promise).
"""

from __future__ import annotations

import dataclasses

import tp_logprob as tpl
from tp_logprob.contract import DeterminismScope
from tp_logprob.kernels.builtin import TORCH_NATIVE
from tp_logprob.suite.backends import BackendUnderTest

PORTABLE = "claims_platform_bits"


def portable_backend(platforms: frozenset[str] = frozenset({"cpu", "cuda"})) -> BackendUnderTest:
    """The stand-in on cpu, claiming cross_platform_bitwise on ``platforms``."""
    from tp_logprob.kernels.native import torch_native_logprob

    capability = dataclasses.replace(
        TORCH_NATIVE,
        backend_id=PORTABLE,
        determinism_scopes=frozenset({DeterminismScope.CROSS_PLATFORM_BITWISE}),
        bitwise_platforms=platforms,
    )
    registry = tpl.KernelRegistry()
    registry.register_logprob_backend("cpu", lambda: torch_native_logprob, capability)
    return BackendUnderTest(PORTABLE, capability, registry, "cpu")
