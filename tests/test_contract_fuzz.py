"""Fuzz the constructors and the dispatcher with Hypothesis.

Any arguments either build a valid object or raise LogprobContractError (never a
TypeError, IndexError or KeyError), every rank computes the same fingerprint, and
dispatch only ever returns a backend whose capability supports the contract.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import tp_logprob as tpl

ANYTHING = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 300)
    | st.floats(allow_nan=True)
    | st.text(max_size=4)
    | st.sampled_from(
        [
            "train",
            "infer",
            "bf16",
            "fp16",
            "fp32",
            "fixed_topology",
            "cross_tp_bitwise",
            "explicit_active_mask",
            "ignore_index",
            "auto",
        ]
    ),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.frozensets(
            st.integers(0, 9)
            | st.sampled_from(["train", "bf16", "ignore_index", "fixed_topology"]),
            max_size=3,
        )
    ),
    max_leaves=8,
)


def small_int(lo: int, hi: int) -> st.SearchStrategy[Any]:
    return st.integers(lo, hi) | ANYTHING


@st.composite
def sharding_args(draw: st.DrawFn) -> dict[str, Any]:
    world = draw(small_int(1, 4), label="tp_world_size")
    padded = draw(small_int(1, 40), label="padded_vocab_size")
    bounds: Any
    if isinstance(world, int) and isinstance(padded, int) and 1 <= world <= padded:
        cuts = (
            draw(
                st.lists(
                    st.integers(1, padded - 1), min_size=world - 1, max_size=world - 1, unique=True
                ).map(sorted),
                label="cuts",
            )
            if world > 1
            else []
        )
        edges = [0, *cuts, padded]
        bounds = tuple(itertools.pairwise(edges))
        if draw(st.booleans(), label="corrupt bounds"):
            bounds = draw(ANYTHING)
    else:
        bounds = draw(ANYTHING)
    return {
        "tp_rank": draw(small_int(0, 4), label="tp_rank"),
        "tp_world_size": world,
        "vocab_shard_bounds": bounds,
        "real_vocab_size": draw(small_int(1, 40), label="real_vocab_size"),
        "padded_vocab_size": padded,
    }


@given(sharding_args())
def test_sharding_builds_or_raises_contract_error(args: dict[str, Any]) -> None:
    try:
        spec = tpl.ShardingSpec(**args)
    except tpl.LogprobContractError:
        return
    assert spec.vocab_shard_bounds[0][0] == 0
    assert spec.vocab_shard_bounds[-1][1] == spec.padded_vocab_size
    assert spec.real_vocab_size <= spec.padded_vocab_size
    assert 0 <= spec.tp_rank < spec.tp_world_size


@given(
    num_tokens=small_int(0, 6),
    mask=st.none() | st.lists(st.booleans(), max_size=6) | ANYTHING,
    ignore_index=small_int(-200, 50),
)
def test_mask_builds_or_raises_contract_error(
    num_tokens: Any, mask: Any, ignore_index: Any
) -> None:
    try:
        spec = tpl.MaskSpec(num_tokens, mask, ignore_index)
    except tpl.LogprobContractError:
        return
    assert spec.dense().shape == (spec.num_tokens,)


@given(
    backend_id=st.text(max_size=6) | ANYTHING,
    roles=ANYTHING,
    dtypes=ANYTHING,
    tp_world_sizes=st.none() | ANYTHING,
    padding=ANYTHING,
    mask_modes=ANYTHING,
    scopes=ANYTHING,
)
def test_capability_builds_or_raises_contract_error(
    backend_id: Any,
    roles: Any,
    dtypes: Any,
    tp_world_sizes: Any,
    padding: Any,
    mask_modes: Any,
    scopes: Any,
) -> None:
    try:
        capability = tpl.LogprobBackendCapability(
            backend_id, roles, dtypes, tp_world_sizes, None, padding, mask_modes, True, scopes
        )
    except tpl.LogprobContractError:
        return
    assert capability.roles and capability.dtypes and capability.determinism_scopes
    assert capability.backend_id == capability.backend_id.strip()


@st.composite
def contracts(draw: st.DrawFn) -> tpl.LogprobContract:
    world = draw(st.integers(1, 4), label="tp")
    padded = draw(st.integers(world, 40), label="padded")
    real = draw(st.integers(1, padded), label="real")
    cuts = (
        sorted(draw(st.sets(st.integers(1, padded - 1), min_size=world - 1, max_size=world - 1)))
        if world > 1
        else []
    )
    edges = [0, *cuts, padded]
    n = draw(st.integers(0, 5), label="N")
    mask = draw(st.none() | st.lists(st.booleans(), min_size=n, max_size=n).map(np.array))
    return tpl.LogprobContract(
        role=draw(st.sampled_from(tpl.LogprobRole)),
        dtype=draw(st.sampled_from(tpl.LogprobDType)),
        mask=tpl.MaskSpec(n, mask, draw(st.integers(-300, -1))),
        sharding=tpl.ShardingSpec(
            draw(st.integers(0, world - 1)),
            world,
            tuple(itertools.pairwise(edges)),
            real,
            padded,
        ),
        reduction=tpl.ReductionSpec(draw(st.sampled_from(tpl.DeterminismScope))),
        export_lse=draw(st.booleans()),
    )


@given(contracts())
def test_fingerprint_is_the_same_on_every_rank(contract: tpl.LogprobContract) -> None:
    fingerprints = {
        contract.with_rank(rank).cross_rank_fingerprint()
        for rank in range(contract.sharding.tp_world_size)
    }
    assert len(fingerprints) == 1


def _bitwise_platforms(scopes: frozenset[tpl.DeterminismScope]) -> st.SearchStrategy[Any]:
    """Registered on ``cpu``, a cross-platform claim must include it."""
    if tpl.DeterminismScope.CROSS_PLATFORM_BITWISE not in scopes:
        return st.just(frozenset())
    return st.frozensets(st.sampled_from(["cuda", "rocm"])).map(lambda p: p | {"cpu"})


capabilities = st.frozensets(st.sampled_from(tpl.DeterminismScope), min_size=1).flatmap(
    lambda scopes: _bitwise_platforms(scopes).flatmap(
        lambda platforms: _capabilities(scopes, platforms)
    )
)


def _capabilities(scopes: frozenset[Any], platforms: frozenset[str]) -> Any:
    return st.builds(
        tpl.LogprobBackendCapability,
        backend_id=st.sampled_from(["a", "b", "c", "d"]),
        roles=st.frozensets(st.sampled_from(tpl.LogprobRole), min_size=1),
        dtypes=st.frozensets(st.sampled_from(tpl.LogprobDType), min_size=1),
        tp_world_sizes=st.none() | st.frozensets(st.integers(1, 4), min_size=1),
        supports_vocab_padding=st.booleans(),
        mask_modes=st.frozensets(st.sampled_from(tpl.MaskMode)),
        exports_vocab_lse=st.booleans(),
        determinism_scopes=st.just(scopes),
        bitwise_platforms=st.just(platforms),
        implementation_kind=st.sampled_from(tpl.ImplementationKind),
    )


@given(
    contracts(),
    st.lists(capabilities, max_size=4, unique_by=lambda c: c.backend_id),
    st.sampled_from(["auto", "production", "reference", "a", "b"]),
)
def test_dispatch_returns_only_capable_backends(
    contract: tpl.LogprobContract, caps: list[tpl.LogprobBackendCapability], request: str
) -> None:
    registry = tpl.KernelRegistry()
    for cap in caps:
        registry.register_logprob_backend("cpu", lambda name=cap.backend_id: lambda: name, cap)
    try:
        result = registry.get_logprob_op(contract, request, platform="cpu", preflighted=True)
    except tpl.LogprobDispatchError as error:
        for cap in caps:
            eligible = request in (cap.backend_id, "auto") or request == cap.implementation_kind
            if eligible:
                assert cap.incompatibilities(contract), cap
                assert cap.backend_id in str(error)
        return
    assert result.capability.supports(contract)
    assert result.capability.incompatibilities(contract) == ()
    assert result.op() == result.capability.backend_id
    for backend_id, reasons in result.provenance.rejected:
        assert reasons, backend_id
