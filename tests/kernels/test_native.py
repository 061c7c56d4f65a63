"""torch_native forward: oracle agreement at TP 1..8, replication, determinism, special values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.native_cases import (
    INF,
    LAYOUTS,
    NAN,
    PADDED,
    REAL,
    SPECIAL_CASES,
    assert_same_bits,
    bits,
    make_contract,
    oracle_report,
    random_inputs,
)
from tp_logprob.emulate import run_tp
from tp_logprob.kernels.native import torch_native_logprob
from tp_logprob.kernels.partials import tree_sum
from tp_logprob.oracle import tolerance

MASK = np.array([True, False, True, True, True, False, True, True, True, True])


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_agrees_with_exact_oracle_at_every_tp_degree(layout: str, dtype: str) -> None:
    contract = make_contract(LAYOUTS[layout], num_tokens=10, active_mask=MASK, dtype=dtype)
    logits, targets = random_inputs(7, 10, dtype=dtype, active_mask=MASK)
    results = run_tp(torch_native_logprob, logits, targets, contract)
    for rank, result in enumerate(results):
        assert result.selected_logp.dtype == torch.float32
        assert_same_bits(result.selected_logp, results[0].selected_logp, f"rank {rank} selected")
        assert_same_bits(result.lse, results[0].lse, f"rank {rank} lse")
    table = tolerance(dtype, REAL, num_shards=len(LAYOUTS[layout]))
    report = oracle_report(results[0], logits, targets, active_mask=MASK, table=table)
    assert report is None, report


@pytest.mark.parametrize("output_dtype", ["bf16", "fp16"])
def test_output_dtype_is_a_final_cast_of_the_fp32_result(output_dtype: str) -> None:
    contract = make_contract(LAYOUTS["tp3-uneven"], num_tokens=6)
    logits, targets = random_inputs(3, 6)
    reference = run_tp(torch_native_logprob, logits, targets, contract)[0]
    cast = make_contract(LAYOUTS["tp3-uneven"], num_tokens=6, output_dtype=output_dtype)
    result = run_tp(torch_native_logprob, logits, targets, cast)[0]
    dtype = result.selected_logp.dtype
    assert dtype == {"bf16": torch.bfloat16, "fp16": torch.float16}[output_dtype]
    assert_same_bits(result.selected_logp, reference.selected_logp.to(dtype), "selected")
    assert_same_bits(result.lse, reference.lse.to(dtype), "lse")


def test_export_lse_false_returns_none() -> None:
    contract = make_contract(LAYOUTS["tp2-width1"], num_tokens=3, export_lse=False)
    logits, targets = random_inputs(1, 3)
    results = run_tp(torch_native_logprob, logits, targets, contract)
    assert all(result.lse is None for result in results)
    assert all(result.selected_logp.shape == (3,) for result in results)


@pytest.mark.parametrize("layout", ["tp1", "tp3-uneven", "tp8-mixed"])
def test_batch_invariant_alone_batched_and_permuted(layout: str) -> None:
    n = 16
    logits, targets = random_inputs(11, n, scale=6.0)
    batched = run_tp(
        torch_native_logprob, logits, targets, make_contract(LAYOUTS[layout], num_tokens=n)
    )[0]
    order = torch.from_numpy(np.random.default_rng(2).permutation(n))
    permuted = run_tp(
        torch_native_logprob,
        logits[order],
        targets[order],
        make_contract(LAYOUTS[layout], num_tokens=n),
    )[0]
    assert_same_bits(permuted.selected_logp, batched.selected_logp[order], "permuted selected")
    assert_same_bits(permuted.lse, batched.lse[order], "permuted lse")
    for row in (0, 5, 15):
        alone = run_tp(
            torch_native_logprob,
            logits[row : row + 1],
            targets[row : row + 1],
            make_contract(LAYOUTS[layout], num_tokens=1),
        )[0]
        assert_same_bits(alone.selected_logp, batched.selected_logp[row : row + 1], "alone")
        assert_same_bits(alone.lse, batched.lse[row : row + 1], "alone lse")


@settings(max_examples=15, deadline=None)
@given(
    width=st.integers(1, 70),
    rows=st.integers(1, 9),
    row=st.integers(0, 8),
    seed=st.integers(0, 2**32 - 1),
)
def test_tree_sum_row_bits_do_not_depend_on_the_batch(
    width: int, rows: int, row: int, seed: int
) -> None:
    row = min(row, rows - 1)
    rng = np.random.default_rng(seed)
    values = torch.from_numpy(rng.exponential(1.0, (rows, width)).astype(np.float32))
    batched = tree_sum(values)
    alone = tree_sum(values[row : row + 1].clone())
    assert bits(alone)[0] == bits(batched)[row]
    assert math.isclose(float(batched[row]), float(values[row].double().sum()), rel_tol=1e-5)


def test_run_to_run_bitwise() -> None:
    contract = make_contract(LAYOUTS["tp4-width1-padding"], num_tokens=8, dtype="bf16")
    logits, targets = random_inputs(5, 8, dtype="bf16")
    first = run_tp(torch_native_logprob, logits, targets, contract)[0]
    for _ in range(3):
        again = run_tp(torch_native_logprob, logits, targets, contract)[0]
        assert_same_bits(again.selected_logp, first.selected_logp, "selected")
        assert_same_bits(again.lse, first.lse, "lse")


@pytest.mark.parametrize(
    "target",
    [-100, -1, -(2**40), REAL, PADDED, 2**40],
    ids=["ignore_index", "negative", "very-negative", "padding-id", "past-padded", "huge"],
)
@pytest.mark.parametrize("layout", ["tp1", "tp4-width1-padding"])
def test_inactive_rows_give_positive_zero_whatever_the_target(target: int, layout: str) -> None:
    mask = np.array([True, False, False, True])
    contract = make_contract(LAYOUTS[layout], num_tokens=4, active_mask=mask)
    logits, targets = random_inputs(9, 4, active_mask=mask)
    logits[2, 3] = float("nan")
    targets[~torch.from_numpy(mask)] = target
    result = run_tp(torch_native_logprob, logits, targets, contract)[0]
    assert bits(result.selected_logp)[1] == 0 and bits(result.selected_logp)[2] == 0
    assert math.isnan(result.lse[2])  # the lse of an inactive row is still the row's LSE
    assert math.isfinite(result.lse[1]) and math.isfinite(result.selected_logp[0])


def test_inactive_targets_accept_int32_extremes() -> None:
    mask = np.array([False, True])
    contract = make_contract(num_tokens=2, active_mask=mask)
    logits, _ = random_inputs(0, 2)
    targets = torch.tensor([2**31 - 1, 4], dtype=torch.int32)
    result = torch_native_logprob(logits, targets, contract)
    assert bits(result.selected_logp)[0] == 0
    assert result.selected_logp[1] < 0


@pytest.mark.parametrize(
    "fill",
    [float("nan"), float("inf"), float("-inf"), 3.0e38, "random"],
    ids=["nan", "+inf", "-inf", "huge", "random"],
)
@pytest.mark.parametrize("layout", ["tp1", "tp2-padding-shard", "tp8-mixed"])
def test_padding_contents_never_change_an_output(fill: float | str, layout: str) -> None:
    contract = make_contract(LAYOUTS[layout], num_tokens=6)
    logits, targets = random_inputs(4, 6)
    clean = logits.clone()
    clean[:, REAL:] = 0.0
    if fill == "random":
        logits[:, REAL:] = torch.randn(6, PADDED - REAL) * 100
    else:
        logits[:, REAL:] = fill
    want = run_tp(torch_native_logprob, clean, targets, contract)[0]
    got = run_tp(torch_native_logprob, logits, targets, contract)[0]
    assert_same_bits(got.selected_logp, want.selected_logp, "selected")
    assert_same_bits(got.lse, want.lse, "lse")


@pytest.mark.parametrize("case", list(SPECIAL_CASES))
@pytest.mark.parametrize("bounds", [((0, 4), (4, 8)), ((0, 8),)], ids=["tp2", "tp1"])
def test_special_values_follow_design_section_2(
    case: str, bounds: tuple[tuple[int, int], ...]
) -> None:
    row, target, active, want_selected, want_lse = SPECIAL_CASES[case]
    padded_row = [*row, NAN, INF]  # padding columns 8 and 9 must be ignored
    bounds = (*bounds[:-1], (bounds[-1][0], 10))
    contract = make_contract(bounds, num_tokens=1, active_mask=np.array([active]), real=8)
    logits = torch.tensor([padded_row], dtype=torch.float32)
    result = run_tp(torch_native_logprob, logits, torch.tensor([target]), contract)[0]
    live = torch.tensor([row], dtype=torch.float64)
    torch_lse = float(torch.logsumexp(live, dim=1)[0])
    torch_selected = float(torch.log_softmax(live, dim=1)[0, target]) if active else 0.0
    # fp32 `target - LSE` is exact only to an ulp of the row's magnitude
    # (docs/semantics.md, "Outputs and replication").
    magnitude = max([abs(v) for v in row if math.isfinite(v)], default=0.0)
    for name, got, want, torch_value in (
        ("selected_logp", float(result.selected_logp[0]), want_selected, torch_selected),
        ("lse", float(result.lse[0]), want_lse, torch_lse),
    ):
        if want == "nan":
            assert math.isnan(got), f"{name}: {got!r}, want NaN"
        elif want == "finite":
            assert math.isfinite(got), f"{name}: {got!r}, want a finite value"
        else:
            assert got == want, f"{name}: {got!r}, want {want!r}"
            if want == 0.0:
                assert math.copysign(1.0, got) == 1.0, f"{name}: -0.0, want +0.0"
        # docs/semantics.md: lse follows torch.logsumexp and selected follows log_softmax.
        assert (math.isnan(got) and math.isnan(torch_value)) or math.isclose(
            got, torch_value, rel_tol=1e-6, abs_tol=2.0**-22 * magnitude
        ), f"{name}: {got!r} but torch float64 gives {torch_value!r}"


def test_tp_partials_merge_without_exp_of_minus_inf_minus_minus_inf() -> None:
    """Every shard but one holds only -inf or padding: the result is still exact."""
    bounds = LAYOUTS["tp8-mixed"]
    contract = make_contract(bounds, num_tokens=1)
    logits = torch.full((1, PADDED), float("-inf"))
    logits[0, 5] = 2.5
    result = run_tp(torch_native_logprob, logits, torch.tensor([5]), contract)[0]
    assert float(result.selected_logp[0]) == 0.0 and float(result.lse[0]) == 2.5


@pytest.mark.parametrize(
    "bounds", [((0, 70000),), ((0, 30000), (30000, 70000))], ids=["tp1", "tp2"]
)
def test_batch_invariant_on_a_wide_vocabulary(bounds: tuple[tuple[int, int], ...]) -> None:
    """Wide rows are where torch.sum's bits depend on N.

    Measured on the 2-thread CPU torch 2.13 build: with ``tree_sum`` replaced by
    ``.sum(1)`` this test fails (row bits differ between N=16 and N=1).
    """
    n, real = 16, 69000
    rng = np.random.default_rng(5)
    logits = torch.from_numpy(rng.normal(0.0, 2.0, (n, 70000)).astype(np.float32))
    targets = torch.from_numpy(rng.integers(0, real, n))
    batched = run_tp(
        torch_native_logprob, logits, targets, make_contract(bounds, num_tokens=n, real=real)
    )[0]
    for row in range(n):
        alone = run_tp(
            torch_native_logprob,
            logits[row : row + 1],
            targets[row : row + 1],
            make_contract(bounds, num_tokens=1, real=real),
        )[0]
        assert_same_bits(alone.lse, batched.lse[row : row + 1], f"row {row} lse")
        assert_same_bits(alone.selected_logp, batched.selected_logp[row : row + 1], f"row {row}")
