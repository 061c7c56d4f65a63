"""Meta-tests of tp_logprob.strategies: valid output, every adversarial kind reached, shrinking."""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

import tp_logprob.strategies as strategies
from tp_logprob import (
    LogprobContractError,
    even_shard_bounds,
)
from tp_logprob.kernels.builtin import TORCH_NATIVE, TORCH_NATIVE_FUSED, TRITON_EXACT_SUM
from tp_logprob.strategies import (
    DTYPE_MAX,
    DTYPE_SMALLEST_SUBNORMAL,
    LogprobCase,
    active_masks,
    cases,
    contracts,
    ignore_indices,
    logits,
    round_to_dtype,
    shard_bounds,
    shard_edge_columns,
    targets,
)

FIND = settings(database=None, max_examples=2000, suppress_health_check=list(HealthCheck))
MANY = settings(database=None, max_examples=200, deadline=None)


def _find(strategy: st.SearchStrategy[Any], condition: Any) -> Any:
    return find(strategy, condition, settings=FIND)


def test_all_matches_the_public_names() -> None:
    public = {
        name
        for name, value in vars(strategies).items()
        if not name.startswith("_")
        and getattr(value, "__module__", "") != "builtins"
        and not isinstance(value, type(strategies))
    } - {"annotations"}
    assert set(strategies.__all__) == public


# --- shard bounds ---------------------------------------------------------------


def _is_partition(bounds: tuple[tuple[int, int], ...], padded: int, world: int) -> bool:
    edges = [start for start, _ in bounds] + [bounds[-1][1]]
    return (
        len(bounds) == world
        and edges[0] == 0
        and edges[-1] == padded
        and all(end > start for start, end in bounds)
        and all(bounds[i][1] == bounds[i + 1][0] for i in range(world - 1))
    )


@MANY
@given(st.data())
def test_shard_bounds_partition_the_vocabulary(data: Any) -> None:
    world = data.draw(st.integers(1, 8))
    padded = data.draw(st.integers(world, 70))
    real = data.draw(st.integers(1, padded))
    bounds = data.draw(shard_bounds(padded, world, real_vocab_size=real))
    assert _is_partition(bounds, padded, world)


@pytest.mark.parametrize(
    ("name", "condition"),
    [
        ("uneven", lambda b: len({e - s for s, e in b}) > 2),
        ("width-1 shard", lambda b: any(e - s == 1 for s, e in b) and b[0][1] > 1),
        ("padding-only shard", lambda b: any(s >= 50 for s, _ in b)),
        ("several padding-only shards", lambda b: sum(s >= 50 for s, _ in b) >= 2),
    ],
)
def test_shard_bounds_reach_each_layout(name: str, condition: Any) -> None:
    bounds = _find(shard_bounds(64, 6, real_vocab_size=50), condition)
    assert _is_partition(bounds, 64, 6), name


@pytest.mark.parametrize(("padded", "world"), [(64, 4), (10, 3), (5, 4), (7, 7)])
def test_shard_bounds_shrink_to_the_even_layout(padded: int, world: int) -> None:
    bounds = _find(shard_bounds(padded, world), lambda _: True)
    try:
        expected = even_shard_bounds(padded, world)
    except LogprobContractError:  # ceil widths would leave a rank empty: balanced instead
        widths = {end - start for start, end in bounds}
        assert max(widths) - min(widths) <= 1
    else:
        assert bounds == expected


# --- contracts ------------------------------------------------------------------


def test_contracts_shrink_to_the_plainest_contract() -> None:
    contract = _find(contracts(), lambda _: True)
    assert contract.describe() == (
        "infer fp32 N=1 (active 1) tp=0/1 bounds=[(0, 1)] real=1 padded=1 fixed_topology"
    )
    assert contract.mask.active_mask is None
    assert contract.mask.ignore_index == -100
    assert contract.export_lse


def test_contracts_with_padding_shrink_to_the_even_layout() -> None:
    contract = _find(contracts(tp_world_sizes={3}, padding=True), lambda _: True)
    sharding = contract.sharding
    assert (sharding.real_vocab_size, sharding.padded_vocab_size) == (2, 3)
    assert sharding.vocab_shard_bounds == even_shard_bounds(3, 3)


def test_a_capability_without_bias_is_drawn_no_bias_and_refuses_to_be() -> None:
    no_bias = dataclasses.replace(TORCH_NATIVE_FUSED, supports_bias=False)
    strategy = contracts(capability=no_bias, input_kind="hidden")
    assert _find(strategy, lambda c: True).has_bias is False
    with pytest.raises(InvalidArgument, match="has_bias=True: capability='torch_native_fused'"):
        contracts(capability=no_bias, input_kind="hidden", has_bias=True).example()
    assert _find(
        contracts(capability=TORCH_NATIVE_FUSED, input_kind="hidden"), lambda c: c.has_bias
    ).has_bias


@pytest.mark.parametrize(
    ("name", "condition"),
    [
        ("tp 8", lambda c: c.sharding.tp_world_size == 8),
        ("padding", lambda c: c.sharding.has_padding),
        (
            "no active token",
            lambda c: c.mask.active_mask is not None and not c.mask.active_token_count,
        ),
        (
            "every token active, explicit mask",
            lambda c: (
                c.mask.active_mask is not None and c.mask.active_token_count == c.num_tokens > 1
            ),
        ),
        ("positive ignore_index", lambda c: c.mask.ignore_index >= c.sharding.real_vocab_size),
        (
            "bf16 train cross_tp",
            lambda c: (
                (c.dtype.value, c.role.value, c.reduction.determinism_scope.value)
                == ("bf16", "train", "cross_tp_bitwise")
            ),
        ),
        ("export_lse False", lambda c: not c.export_lse),
        ("rank > 0", lambda c: c.sharding.tp_rank > 0),
    ],
)
def test_contracts_reach_each_kind(name: str, condition: Any) -> None:
    assert condition(_find(contracts(), condition)), name


def test_contracts_honour_narrow_filters() -> None:
    capability = dataclasses.replace(TRITON_EXACT_SUM, tp_world_sizes=frozenset({2, 4}))
    strategy = contracts(capability=capability, dtypes={"bf16"}, padding=False)
    contract = _find(strategy, lambda c: c.sharding.tp_world_size == 4)
    assert contract.dtype.value == "bf16"
    assert not contract.sharding.has_padding


@pytest.mark.parametrize(
    "make",
    [
        lambda: shard_bounds(0, 1),
        lambda: shard_bounds(4, 5),
        lambda: shard_bounds(8, 2, real_vocab_size=9),
        lambda: shard_bounds(8, 2, layouts={"diagonal"}),
        lambda: contracts(roles="train"),
        lambda: contracts(dtypes=[]),
        lambda: contracts(dtypes={"fp8"}),
        lambda: contracts(tp_world_sizes={0}),
        lambda: contracts(min_num_tokens=5, max_num_tokens=2),
        lambda: contracts(max_padded_vocab_size=1, padding=True),
        lambda: contracts(
            capability=TORCH_NATIVE, padding=True, determinism_scopes={"cross_tp_bitwise"}
        ),
        lambda: contracts(
            capability=dataclasses.replace(TORCH_NATIVE, cp_world_sizes=frozenset({2}))
        ),
        lambda: contracts(capability="torch_native"),  # type: ignore[arg-type]
        lambda: active_masks(-1),
        lambda: active_masks(3, mask_modes=[]),
        lambda: ignore_indices(0),
        lambda: cases(contracts(), dtypes={"bf16"}),
    ],
)
def test_invalid_arguments_raise(make: Any) -> None:
    with pytest.raises(InvalidArgument):
        make().validate()


# --- logits and targets -----------------------------------------------------------


@MANY
@given(st.data())
def test_logits_are_exact_in_the_dtype_and_finite_unless_asked(data: Any) -> None:
    contract = data.draw(contracts(), label="contract")
    special = data.draw(st.booleans(), label="special_values")
    values = data.draw(logits(contract, special_values=special), label="logits")
    assert values.dtype == np.float32
    assert values.shape == (contract.num_tokens, contract.sharding.padded_vocab_size)
    np.testing.assert_array_equal(round_to_dtype(values, contract.dtype), values)
    if not special:
        assert not np.isnan(values).any()
        assert not np.isposinf(values).any()
        live = values[:, : contract.sharding.real_vocab_size]
        assert np.isfinite(live).any(axis=1).all()  # no row of only -inf
    assert np.all(np.abs(values[np.isfinite(values)]) <= DTYPE_MAX[contract.dtype])


def _rows(dtype: str = "fp32", padding: bool | None = None, special: bool = False) -> Any:
    def draw_rows(contract: Any) -> Any:
        return logits(contract, special_values=special).map(lambda x: (contract, x))

    return contracts(dtypes={dtype}, padding=padding, min_num_tokens=1).flatmap(draw_rows)


def _any_row(test: Any) -> Any:
    return lambda pair: any(test(pair[0], row) for row in pair[1])


def _live(contract: Any, row: Any) -> Any:
    return row[: contract.sharding.real_vocab_size].astype(np.float64)


def _ranks_of(contract: Any, columns: Any) -> set[int]:
    """The ranks whose live columns hold ``columns``."""
    sharding = contract.sharding
    bounds = [sharding.live_bounds(rank) for rank in range(sharding.tp_world_size)]
    return {rank for column in columns for rank, (a, b) in enumerate(bounds) if a <= column < b}


@pytest.mark.parametrize(
    ("kind", "strategy", "condition"),
    [
        (
            "tie at the maximum",
            _rows(),
            lambda c, r: len(_live(c, r)) > 2 and np.sum(_live(c, r) == _live(c, r).max()) >= 2,
        ),
        (
            "tie below the maximum, over two ranks",
            _rows(),
            lambda c, r: any(
                len(_ranks_of(c, np.flatnonzero(_live(c, r) == value))) >= 2
                for value in np.unique(_live(c, r)[np.isfinite(_live(c, r))])[:-1]
            ),
        ),
        (
            "-inf column",
            _rows(),
            lambda c, r: np.isneginf(_live(c, r)).any() and np.isfinite(_live(c, r)).any(),
        ),
        (
            "huge dynamic range",
            _rows(),
            lambda c, r: np.ptp(_live(c, r)[np.isfinite(_live(c, r))]) > 1e30,
        ),
        ("bf16 maximum", _rows("bf16"), lambda c, r: (_live(c, r) == DTYPE_MAX[c.dtype]).any()),
        (
            "fp16 maximum",
            _rows("fp16"),
            lambda c, r: (np.abs(_live(c, r)) == DTYPE_MAX[c.dtype]).any(),
        ),
        (
            "near uniform",
            _rows(),
            lambda c, r: (
                len(_live(c, r)) > 3
                and np.ptp(_live(c, r)) < 1e-5 * max(1.0, float(np.abs(_live(c, r)).max()))
                and np.unique(_live(c, r)).size > 1
            ),
        ),
        (
            "one dominant logit",
            _rows(),
            lambda c, r: (
                len(_live(c, r)) > 1 and np.sort(_live(c, r))[-1] - np.sort(_live(c, r))[-2] >= 20
            ),
        ),
        (
            "maximum hidden in padding",
            _rows(padding=True),
            lambda c, r: r[c.sharding.real_vocab_size :].max() > _live(c, r).max() + 50,
        ),
        ("subnormal", _rows("fp16"), lambda c, r: ((np.abs(r) > 0) & (np.abs(r) < 2.0**-14)).any()),
        (
            "fp32 subnormal",
            _rows("fp32"),
            lambda c, r: ((np.abs(r) > 0) & (np.abs(r) < 2.0**-126)).any(),
        ),
        ("NaN", _rows(special=True), lambda c, r: np.isnan(_live(c, r)).any()),
        ("+inf", _rows(special=True), lambda c, r: np.isposinf(_live(c, r)).any()),
        ("all -inf", _rows(special=True), lambda c, r: np.isneginf(_live(c, r)).all()),
        (
            "NaN only in padding",
            _rows(padding=True, special=True),
            lambda c, r: np.isnan(r).any() and not np.isnan(_live(c, r)).any(),
        ),
    ],
)
def test_logits_reach_each_adversarial_kind(kind: str, strategy: Any, condition: Any) -> None:
    contract, values = _find(strategy, _any_row(condition))
    assert any(condition(contract, row) for row in values), kind


def test_smallest_subnormals_are_representable() -> None:
    for dtype, tiny in DTYPE_SMALLEST_SUBNORMAL.items():
        assert round_to_dtype([tiny], dtype)[0] == np.float32(tiny)
        assert round_to_dtype([tiny * 0.4], dtype)[0] == 0.0


def _case_targets() -> Any:
    return contracts(max_num_tokens=8).flatmap(lambda c: targets(c).map(lambda t: (c, t)))


@MANY
@given(_case_targets())
def test_active_targets_are_live_columns(pair: Any) -> None:
    contract, drawn = pair
    assert drawn.dtype == np.int64
    active = contract.mask.dense()
    assert np.all((drawn[active] >= 0) & (drawn[active] < contract.sharding.real_vocab_size))


@pytest.mark.parametrize(
    ("kind", "condition"),
    [
        (
            "first live column of a later shard",
            lambda c, t, a: any(
                a[i] and t[i] == c.sharding.live_bounds(r)[0] > 0
                for i in range(len(t))
                for r in range(c.sharding.tp_world_size)
            ),
        ),
        (
            "last live column of a shard",
            lambda c, t, a: any(
                a[i]
                and t[i] == c.sharding.live_bounds(r)[1] - 1
                and t[i] != c.sharding.real_vocab_size - 1
                for i in range(len(t))
                for r in range(c.sharding.tp_world_size)
            ),
        ),
        (
            "inactive ignore_index",
            lambda c, t, a: any(not a[i] and t[i] == c.mask.ignore_index for i in range(len(t))),
        ),
        (
            "inactive negative id",
            lambda c, t, a: any(
                not a[i] and t[i] < 0 and t[i] != c.mask.ignore_index for i in range(len(t))
            ),
        ),
        (
            "inactive id past the vocabulary",
            lambda c, t, a: any(
                not a[i] and t[i] >= c.sharding.padded_vocab_size for i in range(len(t))
            ),
        ),
    ],
)
def test_targets_reach_each_kind(kind: str, condition: Any) -> None:
    def holds(pair: Any) -> bool:
        contract, drawn = pair
        return bool(condition(contract, drawn, contract.mask.dense()))

    assert holds(_find(_case_targets(), holds)), kind


def test_shard_edge_columns_skip_padding_only_shards() -> None:
    contract = _find(
        contracts(padding=True, tp_world_sizes={3}, layouts={"padding_only"}),
        lambda c: c.sharding.vocab_shard_bounds[-1][0] >= c.sharding.real_vocab_size,
    )
    edges = shard_edge_columns(contract)
    assert all(0 <= edge < contract.sharding.real_vocab_size for edge in edges)


def test_targets_can_aim_at_the_row_maximum() -> None:
    def dominant_target(case: LogprobCase) -> bool:
        live = case.logits[:, : case.contract.sharding.real_vocab_size]
        return any(
            case.active[i]
            and live.shape[1] > 1
            and case.targets[i] == np.argmax(live[i])
            and np.sort(live[i])[-1] - np.sort(live[i])[-2] >= 20
            for i in range(case.contract.num_tokens)
        )

    assert dominant_target(_find(cases(), dominant_target))


# --- rounding and cases -------------------------------------------------------------


@MANY
@given(st.lists(st.floats(width=32), min_size=1, max_size=50))
def test_bf16_rounding_matches_a_hardware_cast(values: list[float]) -> None:
    array = np.array(values, dtype=np.float32)
    expected = array.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(round_to_dtype(array, "bf16"), expected)


def test_bf16_rounding_ties_to_even() -> None:
    halfway_down = 1.0 + 2.0**-8  # exactly between 1 and 1 + 2^-7: the even neighbour is 1
    halfway_up = 1.0 + 3 * 2.0**-8  # between 1 + 2^-7 and 1 + 2^-6: the even one is 1 + 2^-6
    assert round_to_dtype([halfway_down, halfway_up], "bf16").tolist() == [1.0, 1.0 + 2.0**-6]
    assert np.isnan(round_to_dtype([np.float32(np.nan)], "bf16")[0])


def test_fp16_rounding_is_numpy_half() -> None:
    values = np.array([1.0 + 2.0**-11, 65520.0, 1e-8, -3.14159], dtype=np.float32)
    with np.errstate(over="ignore"):  # 65520 rounds past the fp16 maximum to inf
        expected = values.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(round_to_dtype(values, "fp16"), expected)
    assert expected[1] == np.inf


def test_case_is_frozen_and_checked() -> None:
    case = _find(cases(dtypes={"bf16"}, tp_world_sizes={2}), lambda c: c.contract.num_tokens > 1)
    with pytest.raises(ValueError, match="read-only"):
        case.logits[0, 0] = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        case.targets = case.targets  # type: ignore[misc]
    with pytest.raises(LogprobContractError, match="logits: shape"):
        case.replace(logits=case.logits[:, :-1])
    with pytest.raises(LogprobContractError, match="targets: shape"):
        case.replace(targets=case.targets[:-1])
    assert "\n" not in case.describe() and case.contract.describe() in case.describe()
    assert repr(case) == f"LogprobCase({case.describe()})"
    assert case == case.replace() and hash(case) == hash(case.replace())
    assert case != case.replace(logits=np.zeros_like(case.logits))


def test_torch_logits_are_an_exact_cast() -> None:
    torch = pytest.importorskip("torch")
    case = _find(cases(dtypes={"bf16"}), lambda c: np.isfinite(c.logits).all())
    tensor = case.torch_logits()
    assert tensor.dtype == torch.bfloat16
    np.testing.assert_array_equal(tensor.float().numpy(), case.logits)
    assert case.torch_targets().dtype == torch.int64
