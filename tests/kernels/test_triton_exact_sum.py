"""triton_exact_sum: bitwise equal outputs for every TP degree and shard layout, and the
fixed-point construction behind it (CPU interpreter)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.native_cases import LAYOUTS, REAL, make_contract, random_inputs
from tests.helpers.triton_cases import BACKENDS, bits_of, fraction_bits, oracle_report
from tp_logprob.emulate import run_tp

pytestmark = pytest.mark.triton

exact_sum = BACKENDS["triton_exact_sum"]
NAN, INF = float("nan"), float("inf")
MASK = np.array([True, True, True, True, True, True, False, True])


def adversarial_inputs(dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Random rows, a near-tie row, wide ranges, and the special rows of docs/semantics.md."""
    logits, targets = random_inputs(17, len(MASK), dtype=dtype, scale=6.0, active_mask=MASK)
    logits[1, :REAL] = 3.0  # every term exactly 2^K: the largest possible sum
    logits[1, 4] = 3.0078125  # one bf16 ulp above
    logits[2, :REAL] = torch.linspace(-90, 9, REAL)
    logits[3, 7] = NAN
    logits[4, 2] = INF
    logits[5, :REAL] = -INF
    logits[5, 11] = 0.5
    targets[5] = 11
    logits[6, :] = -INF  # inactive, all -inf
    logits[7, targets[7]] = -INF
    logits[:, REAL:] = NAN
    return logits, targets


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_bitwise_equal_across_every_tp_degree_and_layout(dtype: str) -> None:
    logits, targets = adversarial_inputs(dtype)
    reference = None
    for name, bounds in LAYOUTS.items():
        contract = make_contract(bounds, num_tokens=len(MASK), active_mask=MASK, dtype=dtype)
        result = run_tp(exact_sum, logits, targets, contract)[0]
        if reference is None:
            reference = result
            assert oracle_report("triton_exact_sum", result, logits, targets, contract) is None
        assert bits_of(result) == bits_of(reference), f"layout {name} differs from tp1"


@st.composite
def shard_bounds(draw: st.DrawFn, padded: int) -> tuple[tuple[int, int], ...]:
    """Random contiguous shards of [0, padded): 1 to 8 of them, any widths."""
    world = draw(st.integers(1, 8), label="tp_world_size")
    cuts = draw(
        st.lists(st.integers(1, padded - 1), min_size=world - 1, max_size=world - 1, unique=True),
        label="cuts",
    )
    edges = [0, *sorted(cuts), padded]
    return tuple(itertools.pairwise(edges))


@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_random_layouts_of_a_multi_tile_vocabulary_give_the_same_bits(data: st.DataObject) -> None:
    real, padded = 37, 40
    bounds = data.draw(shard_bounds(padded), label="bounds")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    logits, targets = random_inputs(seed, 3, dtype="bf16", real=real, padded=padded, scale=8.0)
    layouts = (((0, padded),), bounds)
    results = [
        run_tp(exact_sum, logits, targets, make_contract(b, num_tokens=3, real=real, dtype="bf16"))[
            0
        ]
        for b in layouts
    ]
    assert bits_of(results[1]) == bits_of(results[0])


@pytest.mark.parametrize(
    ("padded", "bits"), [(1, 61), (2, 61), (3, 60), (24, 57), (32000, 47), (152064, 44)]
)
def test_fraction_bits_leave_room_for_the_whole_vocabulary(padded: int, bits: int) -> None:
    assert fraction_bits(padded) == bits
    # Every term is at most 2^K, so the sum of all of them fits in int64 with room to spare.
    assert padded * 2**bits <= 2**62


def test_the_largest_possible_sum_is_exact() -> None:
    """A row of equal values sums to padded * 2^K: no overflow, LSE = x + log(n) closely."""
    real = padded = 64
    logits = torch.full((2, padded), 7.0)
    logits[1, :] = -3.0e38
    targets = torch.tensor([5, 9])
    for bounds in (((0, 64),), ((0, 1), (1, 33), (33, 64))):
        contract = make_contract(bounds, num_tokens=2, real=real)
        result = run_tp(exact_sum, logits, targets, contract)[0]
        assert float(result.lse[0]) == pytest.approx(7.0 + math.log(64), abs=1e-6)
        assert float(result.selected_logp[0]) == pytest.approx(-math.log(64), abs=1e-6)
        assert float(result.lse[1]) == np.float32(-3.0e38 + math.log(64))


def test_terms_below_the_fixed_point_resolution_stay_within_tolerance() -> None:
    """Terms exp(x - M) < 2^-K round to 0: the error bound of the oracle still holds."""
    logits, targets = random_inputs(2, 3, scale=1.0)
    logits[:, :REAL] -= 60.0
    logits[:, 0] = 0.0  # exp(-60) ~ 2^-86.6, far below 2^-57
    contract = make_contract(LAYOUTS["tp3-uneven"], num_tokens=3)
    result = run_tp(exact_sum, logits, targets, contract)[0]
    assert oracle_report("triton_exact_sum", result, logits, targets, contract) is None
    assert bool((result.lse == 0.0).all())


def test_online_backend_is_not_claimed_bitwise_across_layouts() -> None:
    """The cross-layout tests have power: the one-pass backend's bits do depend on the layout."""
    logits, targets = random_inputs(5, 8, scale=6.0)
    bits = [
        bits_of(
            run_tp(BACKENDS["triton_online"], logits, targets, make_contract(b, num_tokens=8))[0]
        )
        for b in (LAYOUTS["tp1"], LAYOUTS["tp8-mixed"], LAYOUTS["tp3-uneven"])
    ]
    assert bits[0] != bits[1] or bits[0] != bits[2]
