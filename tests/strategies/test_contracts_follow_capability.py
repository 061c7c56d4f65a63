"""The contract strategies follow the capability rules, both ways.

Served: every contract (and wide or fused case) drawn for a capability is one it
serves. Reached: every kind of contract a capability serves is drawn, one value
of one dimension at a time (``capability.served_values``) and in pairs of values
of two dimensions (inactive tokens with padding, entropy at a temperature, ...).
Capabilities: the built-ins, every peer adapter's honest and "users assume"
variants, and random ones.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import random
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from tp_logprob import (
    DeterminismScope,
    LogprobBackendCapability,
    LogprobContract,
    LogprobInputKind,
    MaskMode,
    SupportMode,
)
from tp_logprob.capability import CAPABILITY_RULES, CONTRACT_DIMENSIONS
from tp_logprob.kernels import builtin
from tp_logprob.strategies import contracts, hidden_cases, wide_cases
from tp_logprob.strategies.contracts import MAX_TP_WORLD_SIZE

SERVED = settings(database=None, max_examples=40, deadline=None)
REACH = settings(
    database=None,
    max_examples=3000,
    phases=[Phase.generate],
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
RUN_TO_RUN = DeterminismScope.RUN_TO_RUN


def _peer_capabilities() -> list[LogprobBackendCapability]:
    """Every capability the conformance catalog runs (the peer libraries are not needed)."""
    from tools.conformance.catalog import PEERS

    found = []
    for peer in PEERS:
        module = importlib.import_module(f"tp_logprob.peers.{peer.module}")
        found += [getattr(module, cell.attr)[1] for cell in peer.cells.values() if cell.attr]
    return found


def _random_capabilities(count: int, seed: int = 0) -> list[LogprobBackendCapability]:
    rng = random.Random(seed)

    def some(values: Iterable[Any]) -> frozenset[Any]:
        pool = list(values)
        return frozenset(rng.sample(pool, rng.randint(1, len(pool))))

    def platforms_for(scopes: frozenset[Any]) -> frozenset[str]:
        claimed = DeterminismScope.CROSS_PLATFORM_BITWISE in scopes
        return some(["cpu", "cuda", "rocm"]) if claimed else frozenset()

    scope_sets = [some(DeterminismScope) for _ in range(count)]
    return [
        LogprobBackendCapability(
            backend_id=f"random_{index}",
            roles=some(["train", "infer"]),
            dtypes=some(["bf16", "fp16", "fp32"]),
            tp_world_sizes=rng.choice([None, some(range(1, 9))]),
            cp_world_sizes=rng.choice([None, frozenset({1}), frozenset({1, 2})]),
            supports_vocab_padding=rng.random() < 0.5,
            mask_modes=some(MaskMode),
            exports_vocab_lse=rng.random() < 0.5,
            determinism_scopes=scope_sets[index],
            bitwise_platforms=platforms_for(scope_sets[index]),
            supports_temperature=rng.random() < 0.5,
            exports_entropy=rng.random() < 0.5,
            even_shards_only=rng.random() < 0.3,
            input_kinds=rng.choice([frozenset({"logits"}), frozenset({"hidden"})]),
            supports_bias=rng.random() < 0.5,
            support_modes=some(SupportMode),
        )
        for index in range(count)
    ]


def _distinct(capabilities: Iterable[LogprobBackendCapability]) -> list[LogprobBackendCapability]:
    """One capability per set of claims (peer variants often repeat one another)."""
    seen: dict[str, LogprobBackendCapability] = {}
    for capability in capabilities:
        claims = capability.to_dict()
        del claims["backend_id"]
        seen.setdefault(repr(sorted(claims.items())), capability)
    return list(seen.values())


BUILTINS = [
    builtin.TORCH_NATIVE,
    builtin.TRITON_ONLINE,
    builtin.TRITON_EXACT_SUM,
    builtin.TORCH_NATIVE_FUSED,
    builtin.TRITON_FUSED,
    builtin.TRITON_FUSED_EXACT_SUM,
    *builtin.ROCM_FUSED_CAPABILITIES.values(),
]
CAPABILITIES = _distinct([*BUILTINS, *_peer_capabilities(), *_random_capabilities(12)])
CASES = [
    pytest.param(capability, kind, id=f"{capability.backend_id}-{kind.value}")
    for capability in CAPABILITIES
    for kind in sorted(capability.input_kinds, key=lambda k: k.value)
    if capability.serves("cp_world_size", 1)  # the only CP size drawn (InvalidArgument else)
]


def _strategy(capability: LogprobBackendCapability, kind: LogprobInputKind, **filters: Any) -> Any:
    return contracts(capability=capability, input_kind=kind, **filters)


# --- served: whatever is drawn is served -----------------------------------------------


@pytest.mark.parametrize(("capability", "kind"), CASES)
def test_every_drawn_contract_is_served(
    capability: LogprobBackendCapability, kind: LogprobInputKind
) -> None:
    @SERVED
    @given(_strategy(capability, kind))
    def check(contract: LogprobContract) -> None:
        assert capability.incompatibilities(contract) == ()
        if capability.served_values("determinism_scope") != {RUN_TO_RUN}:
            assert contract.reduction.determinism_scope is not RUN_TO_RUN

    check()


_scope_sets = st.frozensets(st.sampled_from(list(DeterminismScope)), min_size=1)
_capabilities = _scope_sets.flatmap(
    lambda scopes: _capabilities_claiming(
        scopes,
        st.frozensets(st.sampled_from(["cpu", "cuda", "rocm"]), min_size=1)
        if DeterminismScope.CROSS_PLATFORM_BITWISE in scopes
        else st.just(frozenset()),
    )
)


def _capabilities_claiming(scopes: frozenset[Any], platforms: Any) -> Any:
    return st.builds(
        LogprobBackendCapability,
        backend_id=st.just("drawn"),
        roles=st.frozensets(st.sampled_from(["train", "infer"]), min_size=1),
        dtypes=st.frozensets(st.sampled_from(["bf16", "fp16", "fp32"]), min_size=1),
        tp_world_sizes=st.none() | st.frozensets(st.integers(1, 8), min_size=1),
        cp_world_sizes=st.none() | st.just(frozenset({1})) | st.just(frozenset({1, 4})),
        supports_vocab_padding=st.booleans(),
        mask_modes=st.frozensets(st.sampled_from(list(MaskMode)), min_size=1),
        exports_vocab_lse=st.booleans(),
        determinism_scopes=st.just(scopes),
        bitwise_platforms=platforms,
        supports_temperature=st.booleans(),
        exports_entropy=st.booleans(),
        even_shards_only=st.booleans(),
        input_kinds=st.sampled_from([frozenset({"logits"}), frozenset({"hidden"})]),
        supports_bias=st.booleans(),
        support_modes=st.frozensets(st.sampled_from(list(SupportMode)), min_size=1),
    )


@settings(database=None, max_examples=200, deadline=None)
@given(st.data())
def test_contracts_from_a_drawn_capability_are_all_served(data: Any) -> None:
    capability = data.draw(_capabilities, label="capability")
    kind = next(iter(capability.input_kinds))
    contract = data.draw(_strategy(capability, kind), label="contract")
    assert capability.incompatibilities(contract) == ()
    if capability.served_values("determinism_scope") != {RUN_TO_RUN}:
        assert contract.reduction.determinism_scope is not RUN_TO_RUN


@pytest.mark.parametrize(
    "capability",
    [
        c
        for c in CAPABILITIES
        if c.serves("input_kind", "logits")
        and c.serves("cp_world_size", 1)
        and c.serves("support_mode", "full")
    ],
    ids=lambda c: c.backend_id,
)
def test_every_wide_case_is_served(capability: LogprobBackendCapability) -> None:
    @settings(database=None, max_examples=10, deadline=None)
    @given(wide_cases(capability, max_vocab=1 << 11))
    def check(case: Any) -> None:
        assert capability.incompatibilities(case.contract) == ()

    check()


@pytest.mark.parametrize(
    "capability",
    [c for c in CAPABILITIES if c.serves("input_kind", "hidden") and c.serves("cp_world_size", 1)],
    ids=lambda c: c.backend_id,
)
def test_every_fused_case_is_served(capability: LogprobBackendCapability) -> None:
    @settings(database=None, max_examples=10, deadline=None)
    @given(hidden_cases(capability=capability, max_num_tokens=3, max_hidden_size=4))
    def check(case: Any) -> None:
        assert capability.incompatibilities(case.contract) == ()

    check()


# --- reached: whatever is served is drawn ----------------------------------------------


def _drawable(
    capability: LogprobBackendCapability, dimension: str, kind: LogprobInputKind
) -> set[Any]:
    """The values of ``dimension`` the capability serves that contracts() can draw.

    TP degrees are drawn up to MAX_TP_WORLD_SIZE, CP only as 1, temperatures as 1.0
    or "other"; a logits contract has no bias, and allow_tf32 is never True (no
    backend serves it). run_to_run is drawn only for a backend that serves nothing
    stronger (asked for, it is drawn: checked on its own below). A heterogeneous batch is
    made from a case, its parameters aimed at the logits (strategies.engine_batches,
    tests/strategies/test_engine_batches.py), never by contracts().
    """
    served = capability.served_values(dimension)
    if dimension == "heterogeneous":
        return {False}
    if dimension == "input_kind":
        return {kind}
    if dimension == "has_bias" and kind is LogprobInputKind.LOGITS:
        return {False}  # the contract refuses has_bias=True with logits input
    if dimension == "tp_world_size":
        return {w for w in range(1, MAX_TP_WORLD_SIZE + 1) if served is None or w in served}
    if dimension == "cp_world_size":
        return {1}
    if dimension == "temperature":
        return {"1.0", "other"} if served is None else {"1.0"}
    assert served is not None, dimension
    if dimension == "even_layout" and _drawable(capability, "tp_world_size", kind) == {1}:
        return {True}  # one rank's shard is always the even layout
    if dimension == "determinism_scope" and served != {RUN_TO_RUN}:
        return set(served) - {RUN_TO_RUN}
    if dimension == "support_mode" and SupportMode.FULL in served:
        return {SupportMode.FULL}  # supports are drawn when asked for: checked on their own below
    return set(served)


def _value(dimension: str, contract: LogprobContract) -> Any:
    value = next(r for r in CAPABILITY_RULES if r.dimension == dimension).value_of(contract)
    if dimension == "temperature":
        return "1.0" if value == 1.0 else "other"
    return value


def _impossible(pair: tuple[tuple[str, Any], tuple[str, Any]]) -> bool:
    """Pairs no valid contract holds: one rank's shards are always the even layout."""
    return {("tp_world_size", 1), ("even_layout", False)} <= set(pair)


def _reach(
    strategy: Any, wanted: set[Any], seen_in: Callable[[LogprobContract], set[Any]]
) -> set[Any]:
    """Draw until every wanted item was seen (or the budget runs out); return the missing."""
    missing = set(wanted)

    def condition(contract: LogprobContract) -> bool:
        missing.difference_update(seen_in(contract))
        return not missing

    with contextlib.suppress(NoSuchExample):  # the budget ran out: report what is missing
        find(strategy, condition, settings=REACH)
    return missing


def _values_of(contract: LogprobContract) -> set[tuple[str, Any]]:
    return {(d, _value(d, contract)) for d in CONTRACT_DIMENSIONS}


@pytest.mark.parametrize(("capability", "kind"), CASES)
def test_every_served_value_is_drawn(
    capability: LogprobBackendCapability, kind: LogprobInputKind
) -> None:
    wanted = {
        (dimension, value)
        for dimension in CONTRACT_DIMENSIONS
        for value in _drawable(capability, dimension, kind)
    }
    assert _reach(_strategy(capability, kind), wanted, _values_of) == set()


def _pairs_of(contract: LogprobContract) -> set[Any]:
    values = {
        (d, v if d != "tp_world_size" else min(v, 2)) for d, v in _values_of(contract)
    }  # TP degrees in pairs: 1 or "2 and more"
    return set(itertools.combinations(sorted(values, key=repr), 2))


@pytest.mark.parametrize(("capability", "kind"), CASES)
def test_every_served_pair_of_values_is_drawn(
    capability: LogprobBackendCapability, kind: LogprobInputKind
) -> None:
    single = {
        (dimension, value if dimension != "tp_world_size" else min(value, 2))
        for dimension in CONTRACT_DIMENSIONS
        for value in _drawable(capability, dimension, kind)
    }
    wanted = {
        pair
        for pair in itertools.combinations(sorted(single, key=repr), 2)
        if pair[0][0] != pair[1][0] and not _impossible(pair)
    }
    missing = _reach(_strategy(capability, kind), wanted, _pairs_of)
    assert missing == set(), sorted(missing, key=repr)[:5]


@pytest.mark.parametrize(("capability", "kind"), CASES)
def test_run_to_run_is_drawn_when_asked_for(
    capability: LogprobBackendCapability, kind: LogprobInputKind
) -> None:
    scopes = capability.served_values("determinism_scope")
    assert scopes is not None and RUN_TO_RUN in scopes  # the weakest scope: always served
    asked = _strategy(capability, kind, determinism_scopes={RUN_TO_RUN})
    assert _reach(asked, {RUN_TO_RUN}, lambda c: {c.reduction.determinism_scope}) == set()


def test_the_capabilities_cover_every_claim() -> None:
    """The capabilities above make and withhold every claim, so both tests see each rule."""
    for dimension in CONTRACT_DIMENSIONS:
        answers = {frozenset(_drawable(c, dimension, k)) for c, k in (p.values for p in CASES)}
        fixed = ("allow_tf32", "cp_world_size", "support_mode", "heterogeneous")
        assert len(answers) > 1 or dimension in fixed, dimension


@pytest.mark.parametrize(("capability", "kind"), CASES)
def test_supports_are_drawn_when_asked_for(
    capability: LogprobBackendCapability, kind: LogprobInputKind
) -> None:
    """Asked for every mode, contracts() draws every support mode the capability serves
    (and each with every other served value of the other dimensions)."""
    served = capability.served_values("support_mode")
    assert served is not None
    asked = _strategy(capability, kind, support_modes=set(SupportMode))
    wanted = {
        (dimension, value)
        for dimension in CONTRACT_DIMENSIONS
        for value in (
            served if dimension == "support_mode" else _drawable(capability, dimension, kind)
        )
    }
    assert _reach(asked, wanted, _values_of) == set()
