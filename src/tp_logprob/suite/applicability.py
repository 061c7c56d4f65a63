"""Which properties apply to a backend, decided from its capability before any test runs.

A property that needs what a backend does not claim (hidden states for a backend
that takes logits, a ``cross_tp_bitwise`` scope, an explicit active mask) never
applies to it: the plugin deselects that test at collection and lists, once per
backend, what it does not claim. A skip is left for what applies but cannot run
here (no real process group, a library not installed). A test declares what it
needs with :func:`applies_to`::

    @applies_to(HIDDEN_INPUT)
    @given(data=st.data())
    def test_fused_oracle(tp_logprob_backend, tp_logprob_suite, data): ...
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from tp_logprob.contract import DeterminismScope, LogprobInputKind, LogprobRole, MaskMode
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.support import SupportMode

__all__ = [
    "BATCH_INVARIANT",
    "CROSS_TP_BITWISE",
    "EXPLICIT_MASK",
    "EXPORTS_ENTROPY",
    "HIDDEN_INPUT",
    "LEAVES_INPUTS",
    "LOGITS_INPUT",
    "RAW_LOGPROB",
    "RECOMPUTED_SUPPORT",
    "REPLAYED_SUPPORT",
    "SAMPLING_SUPPORT",
    "SEVERAL_LAYOUTS",
    "SEVERAL_RANKS",
    "TEMPERATURE_NOT_ONE",
    "TRAIN_ROLE",
    "VOCAB_PADDING",
    "Requirement",
    "applies_to",
    "claims",
    "unclaimed",
]

Requirement = Callable[[BackendUnderTest, Mapping[str, Any]], str | None]
"""``requirement(backend, params)``: what the test needs that ``backend`` does not claim,
named by its capability field (``"input_kind 'hidden'"``), or None when it applies.
``params`` are the test's other parametrized arguments (a pinned case's name)."""

Test = TypeVar("Test", bound=Callable[..., Any])

_ATTRIBUTE = "_tp_logprob_requirements"


def applies_to(*requirements: Requirement) -> Callable[[Test], Test]:
    """Declare what a property test needs of a backend (apply it outermost, above ``@given``)."""

    def mark(test: Test) -> Test:
        setattr(test, _ATTRIBUTE, (*getattr(test, _ATTRIBUTE, ()), *requirements))
        return test

    return mark


def unclaimed(test: object, backend: BackendUnderTest, params: Mapping[str, Any]) -> str | None:
    """The first requirement of ``test`` that ``backend`` does not meet, or None."""
    for requirement in getattr(test, _ATTRIBUTE, ()):
        reason: str | None = requirement(backend, params)
        if reason is not None:
            return reason
    return None


def claims(dimension: str, value: Any) -> Requirement:
    """The backend serves ``value`` in ``dimension`` (see ``LogprobBackendCapability.serves``)."""
    shown = getattr(value, "value", value)

    def requirement(backend: BackendUnderTest, params: Mapping[str, Any]) -> str | None:
        return None if backend.capability.serves(dimension, value) else f"{dimension} {shown!r}"

    return requirement


LOGITS_INPUT = claims("input_kind", LogprobInputKind.LOGITS)
HIDDEN_INPUT = claims("input_kind", LogprobInputKind.HIDDEN)
CROSS_TP_BITWISE = claims("determinism_scope", DeterminismScope.CROSS_TP_BITWISE)
BATCH_INVARIANT = claims("determinism_scope", DeterminismScope.FIXED_TOPOLOGY)
"""A scope with batch invariance (``fixed_topology`` or stronger), not run-to-run bits only."""
EXPLICIT_MASK = claims("mask_mode", MaskMode.EXPLICIT_ACTIVE_MASK)
RECOMPUTED_SUPPORT = claims("support_mode", SupportMode.SAMPLING_PARAMS)
REPLAYED_SUPPORT = claims("support_mode", SupportMode.REPLAYED_MASK)
RAW_LOGPROB = claims("support_mode", SupportMode.FULL)
"""The logprob over the full vocabulary, without a sampling support."""
EXPORTS_ENTROPY = claims("export_entropy", True)
TEMPERATURE_NOT_ONE = claims("temperature", 2.0)
"""A temperature other than 1.0 (``supports_temperature``): 2.0 stands for every other."""
VOCAB_PADDING = claims("vocab_padding", True)
TRAIN_ROLE = claims("role", LogprobRole.TRAIN)
"""A gradient: the ``train`` role."""


def _sampling_support(backend: BackendUnderTest, params: Mapping[str, Any]) -> str | None:
    """The backend serves some sampling support: sampling parameters or a replayed mask."""
    modes = (SupportMode.SAMPLING_PARAMS, SupportMode.REPLAYED_MASK)
    if any(backend.capability.serves("support_mode", mode) for mode in modes):
        return None
    return "support_mode 'sampling_params' or 'replayed_mask'"


SAMPLING_SUPPORT: Requirement = _sampling_support


def _leaves_inputs(backend: BackendUnderTest, params: Mapping[str, Any]) -> str | None:
    """The backend does not declare ``consumes_input`` (it promises to leave its inputs)."""
    return "consumes_input=True" if backend.capability.consumes_input else None


def _several_layouts(backend: BackendUnderTest, params: Mapping[str, Any]) -> str | None:
    """The backend serves more than one shard layout of a vocabulary (another TP degree,
    or uneven bounds at its one degree): a TP-consistency property has something to vary."""
    capability = backend.capability
    worlds = capability.served_values("tp_world_size")
    if worlds is None or len(worlds) > 1:
        return None
    if worlds != {1} and capability.serves("even_layout", False):
        return None
    return f"tp_world_sizes {sorted(worlds)} (one shard layout per vocabulary)"


LEAVES_INPUTS: Requirement = _leaves_inputs
SEVERAL_LAYOUTS: Requirement = _several_layouts


def _several_ranks(backend: BackendUnderTest, params: Mapping[str, Any]) -> str | None:
    """The backend serves a TP degree above 1: a rule computed on one rank's shard instead
    of across the ranks has another rank to differ from."""
    worlds = backend.capability.served_values("tp_world_size")
    if worlds is None or any(world > 1 for world in worlds):
        return None
    return f"tp_world_sizes {sorted(worlds)} (no TP degree above 1)"


SEVERAL_RANKS: Requirement = _several_ranks
