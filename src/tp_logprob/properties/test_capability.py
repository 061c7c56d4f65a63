"""Capability truthfulness: every kind of contract a backend claims, run at least once.

The Hypothesis properties draw their contracts from the capability, so a false
claim fails them sooner or later; this sweep makes it sooner: one small case for
every combination of claimed role, dtype, determinism scope, mask mode, padding
and ``export_lse``, cycling through the claimed TP degrees.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

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
from tp_logprob.properties.draws import drawing_capability
from tp_logprob.properties.gradients import expect_gradient
from tp_logprob.properties.lm_head import expect_fused_gradients
from tp_logprob.properties.measuring import expect_exact
from tp_logprob.properties.registry import run_property, suite_property
from tp_logprob.properties.report import SuiteStats
from tp_logprob.properties.running import real_group
from tp_logprob.strategies import HiddenCase, LogprobCase, round_to_dtype

_PADDED, _PADDED_REAL, _ROWS = 24, 21, 5
_HIDDEN_SIZE = 8
_PER_TOKEN_MASK = np.array([True, False, True, True, False])


def claimed_contracts(capability: LogprobBackendCapability) -> list[LogprobContract]:
    """One rank-0 contract for every combination of contract kinds ``capability`` claims.

    A backend that takes hidden states gets fused LM-head contracts (hidden size 8,
    with and without bias) instead of logits ones.
    """
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
    targets = np.where(
        contract.mask.dense(), rng.integers(0, real, _ROWS), contract.mask.ignore_index
    )
    if contract.input_kind is LogprobInputKind.HIDDEN:
        return _hidden_case(contract, rng, targets)
    return LogprobCase(contract, round_to_dtype(values, contract.dtype), targets)


def _hidden_case(
    contract: LogprobContract, rng: np.random.Generator, targets: np.ndarray
) -> HiddenCase:
    """Random operands; the weight's padding rows are 1e4 (they would win the max if read)."""
    real = contract.sharding.real_vocab_size
    hidden = round_to_dtype(rng.standard_normal((_ROWS, _HIDDEN_SIZE)), contract.dtype)
    weight = round_to_dtype(rng.standard_normal((_PADDED, _HIDDEN_SIZE)), contract.dtype)
    weight[real:] = 1e4
    bias = (
        round_to_dtype(rng.standard_normal(_PADDED), contract.dtype) if contract.has_bias else None
    )
    logits = exact_hidden_logits(hidden, weight, bias).astype(np.float32)
    return HiddenCase(contract, logits, targets, hidden=hidden, weight=weight, bias=bias)


@suite_property("claimed_contract")
def claimed_contract(
    backend: Any, case: LogprobCase, params: Mapping[str, Any], *, stats: SuiteStats | None = None
) -> None:
    """A claimed contract kind agrees with the exact oracle and, for train, backprops."""
    expect_exact(
        "capability truthfulness: a claimed contract kind is served wrongly",
        backend,
        case,
        count_ulps=False,
    )
    if case.contract.role.value != "train":
        return
    if isinstance(case, HiddenCase):
        expect_fused_gradients(backend, case)
    else:
        expect_gradient("capability truthfulness (train)", case, backend)


def test_serves_every_claimed_contract_kind(tp_logprob_backend: Any, tp_logprob_suite: Any) -> None:
    """Each claimed combination runs, agrees with the exact oracle, and (train) backprops."""
    backend = tp_logprob_backend
    contracts = claimed_contracts(drawing_capability(backend))
    if not contracts and real_group() is not None:
        pytest.skip(
            f"{backend.backend_id}: no TP degree it claims both splits the sweep's "
            f"{_PADDED} columns and is this group's ({real_group().world_size} ranks)"
        )
    assert contracts, f"{backend.backend_id} claims no contract at all"
    for seed, contract in enumerate(contracts):
        case = _case(contract, seed)
        tp_logprob_suite.stats.example(backend.backend_id)
        run_property("claimed_contract", backend, case)
