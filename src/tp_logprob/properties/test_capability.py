"""Capability truthfulness: every kind of contract a backend claims, run at least once.

The Hypothesis properties draw their contracts from the capability, so a false
claim fails them sooner or later; this sweep makes it sooner: one small case for
every combination of claimed role, dtype, determinism scope, mask mode, padding
and ``export_lse``, cycling through the claimed TP degrees, and for every claimed
sampling support (``support_modes``) one case per claimed role and dtype, judged
by the processed checks (``judging/processed.py``).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np

from tp_logprob.capability import LogprobBackendCapability
from tp_logprob.contract import (
    DeterminismScope,
    LogprobContract,
    LogprobInputKind,
    MaskMode,
    MaskSpec,
    ReductionSpec,
    ShardingSpec,
)
from tp_logprob.oracle import exact_hidden_logits
from tp_logprob.strategies import HiddenCase, LogprobCase, round_to_dtype
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.draws import drawing_capability
from tp_logprob.suite.expect import (
    expect_exact,
    expect_exact_and_gradient,
    expect_fused_gradients,
    expect_processed_exact,
    expect_processed_gradient,
)
from tp_logprob.suite.outcomes import NotApplicable
from tp_logprob.suite.property import suite_property
from tp_logprob.suite.session import Suite
from tp_logprob.suite.summary import SuiteStats
from tp_logprob.support import SupportMode, SupportSpec

_PADDED, _PADDED_REAL, _ROWS = 24, 21, 5
_HIDDEN_SIZE = 8
_PER_TOKEN_MASK = np.array([True, False, True, True, False])
_SAMPLING_PARAMS = (
    SupportSpec(top_k=3),
    SupportSpec(top_p=0.8),
    SupportSpec(min_p=0.05),
    SupportSpec(min_p=0.02, top_k=8, top_p=0.9),
)


def claimed_contracts(capability: LogprobBackendCapability) -> list[LogprobContract]:
    """One rank-0 contract for every combination of contract kinds ``capability`` claims,
    then, for each claimed sampling support, one per claimed role and dtype (the other
    kinds, the TP degree, the rules and entropy cycling).

    A backend that takes hidden states gets fused LM-head contracts (hidden size 8,
    with and without bias) instead of logits ones.
    """
    found = _raw_contracts(capability)
    if not capability.serves("support_mode", SupportMode.FULL):
        found = []
    for mode in (SupportMode.SAMPLING_PARAMS, SupportMode.REPLAYED_MASK):
        if not capability.serves("support_mode", mode):
            continue
        pairs = itertools.product(
            sorted(capability.served_values("role") or (), key=lambda m: m.value),
            sorted(capability.served_values("dtype") or (), key=lambda m: m.value),
        )
        raw = _raw_contracts(capability)
        entropy = capability.serves("export_entropy", True)
        for index, (role, dtype) in enumerate(pairs):
            base = raw[(5 * index + 1) % len(raw)]
            found.append(
                dataclasses.replace(
                    base,
                    role=role,
                    dtype=dtype,
                    export_entropy=entropy and index % 2 == 0,
                    support=_support(mode, index, base),
                )
            )
    return found


def _support(mode: SupportMode, index: int, contract: LogprobContract) -> SupportSpec:
    """Sampling parameters (cycling through :data:`_SAMPLING_PARAMS`), or a replayed mask
    that keeps two live columns of every three."""
    if mode is SupportMode.SAMPLING_PARAMS:
        return _SAMPLING_PARAMS[index % len(_SAMPLING_PARAMS)]
    real = contract.sharding.real_vocab_size
    return SupportSpec.from_kept_lists(
        [[v for v in range(real) if (v + row) % 3 != 1] for row in range(_ROWS)]
    )


def _raw_contracts(capability: LogprobBackendCapability) -> list[LogprobContract]:
    """:func:`claimed_contracts` without a sampling support."""
    scopes = [scope for scope in DeterminismScope if capability.serves("determinism_scope", scope)]
    if scopes != [DeterminismScope.RUN_TO_RUN]:  # the same code serves a run_to_run request
        scopes.remove(DeterminismScope.RUN_TO_RUN)
    worlds = [w for w in range(1, 9) if capability.serves("tp_world_size", w)]
    if not capability.serves(
        "even_layout", False
    ):  # equal shards: the TP degree divides the vocabulary
        worlds = [w for w in worlds if _PADDED % w == 0]
    combos = itertools.product(
        sorted(capability.served_values("role") or (), key=lambda m: m.value),
        sorted(capability.served_values("dtype") or (), key=lambda m: m.value),
        scopes,
        sorted(capability.served_values("mask_mode") or (), key=lambda m: m.value),
        [p for p in (False, True) if capability.serves("vocab_padding", p)],
        [e for e in (False, True) if capability.serves("export_lse", e)],
    )
    if not worlds:
        return []
    fused = not capability.serves("input_kind", LogprobInputKind.LOGITS)
    found = []
    for index, (role, dtype, scope, mode, padding, export) in enumerate(combos):
        hidden: dict[str, Any] = (
            {
                "input_kind": "hidden",
                "hidden_size": _HIDDEN_SIZE,
                "has_bias": capability.serves("has_bias", True) and index % 2 == 1,
            }
            if fused
            else {}
        )
        world = worlds[index % len(worlds)]
        # Balanced, generally uneven widths; with padding and TP=8 the last shard is all padding.
        # (Equal widths for an even_shards_only backend, since the TP degree divides 24.)
        edges = [round(rank * _PADDED / world) for rank in range(world + 1)]
        mask = _PER_TOKEN_MASK if mode is MaskMode.EXPLICIT_ACTIVE_MASK else None
        found.append(
            LogprobContract(
                role=role,
                dtype=dtype,
                mask=MaskSpec(_ROWS, mask),
                sharding=ShardingSpec(
                    0,
                    world,
                    tuple(itertools.pairwise(edges)),
                    _PADDED_REAL if padding else _PADDED,
                    _PADDED,
                ),
                reduction=ReductionSpec(scope),
                export_lse=export,
                **hidden,
            )
        )
    return found


def _case(contract: LogprobContract, seed: int) -> LogprobCase:
    rng = np.random.default_rng(seed)
    real = contract.sharding.real_vocab_size
    values = 3.0 * rng.standard_normal((_ROWS, _PADDED))
    values[:, real:] = 1e4  # padding that would win the max if it were read
    chosen = rng.integers(0, real, _ROWS)
    support = contract.support
    if support is not None and support.mode is SupportMode.REPLAYED_MASK:
        chosen = np.array([rng.choice(support.kept_row(row)) for row in range(_ROWS)])
    targets = np.where(contract.mask.dense(), chosen, contract.mask.ignore_index)
    if contract.input_kind is LogprobInputKind.HIDDEN:
        return _hidden_case(contract, rng, targets)
    return LogprobCase(contract, round_to_dtype(values, contract.dtype), targets)


def _hidden_case(
    contract: LogprobContract, rng: np.random.Generator, targets: np.ndarray
) -> HiddenCase:
    """Random operands; the weight's padding rows are 1e4 (they would win the max if read).

    With sampling parameters the operands are small integers: exact products, so the
    backend's support is read on the oracle's ``x`` (``judging/processed.py``).
    """
    real = contract.sharding.real_vocab_size
    exact = contract.support_mode is SupportMode.SAMPLING_PARAMS
    draw = (lambda shape: rng.integers(-8, 9, shape)) if exact else rng.standard_normal
    hidden = round_to_dtype(draw((_ROWS, _HIDDEN_SIZE)), contract.dtype)
    weight = round_to_dtype(draw((_PADDED, _HIDDEN_SIZE)), contract.dtype)
    weight[real:] = 1e4
    bias = round_to_dtype(draw(_PADDED), contract.dtype) if contract.has_bias else None
    logits = exact_hidden_logits(hidden, weight, bias).astype(np.float32)
    return HiddenCase(contract, logits, targets, hidden=hidden, weight=weight, bias=bias)


@suite_property("claimed_contract")
def claimed_contract(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """A claimed contract kind agrees with the exact oracle and, for train, backprops; with a
    sampling support, on the backend's (admissible) support."""
    train = case.contract.role.value == "train"
    if case.contract.support is not None:
        prop = "capability truthfulness (sampling support)"
        expect_processed_exact(prop, backend, case, count_ulps=False)
        if train:
            expect_processed_gradient(f"{prop} (train)", case, backend)
        return
    served_wrongly = "capability truthfulness: a claimed contract kind is served wrongly"
    if not isinstance(case, HiddenCase):
        expect_exact_and_gradient(
            served_wrongly, "capability truthfulness (train)", backend, case, count_ulps=False
        )
        return
    expect_exact(served_wrongly, backend, case, count_ulps=False)
    if train:
        expect_fused_gradients(backend, case)


def test_serves_every_claimed_contract_kind(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite
) -> None:
    """Each claimed combination runs, agrees with the exact oracle, and (train) backprops."""
    backend = tp_logprob_backend
    contracts = claimed_contracts(drawing_capability(backend))
    group = backend.group
    if not contracts and group is not None:
        raise NotApplicable(
            f"{backend.backend_id}: no TP degree it claims both splits the sweep's "
            f"{_PADDED} columns and is this group's ({group.world_size} ranks)"
        )
    assert contracts, f"{backend.backend_id} claims no contract at all"
    for seed, contract in enumerate(contracts):
        case = _case(contract, seed)
        tp_logprob_suite.stats.example(backend.backend_id)
        claimed_contract.run(backend, case)
