"""Triton backends, forward: oracle and torch_native agreement at TP 1..8, determinism,
batch invariance, padding, inactive rows, special values (CPU interpreter)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tp_logprob as tpl
from tests.helpers.native_cases import (
    INF,
    LAYOUTS,
    NAN,
    PADDED,
    PADDING_FILLS,
    REAL,
    SPECIAL_CASES,
    assert_same_bits,
    bits,
    garbage_padding_inputs,
    make_contract,
    random_inputs,
)
from tests.helpers.triton_cases import BACKENDS, bits_of, native_report, online_merge, oracle_report
from tp_logprob.emulate import run_tp
from tp_logprob.kernels.merge import merge_partials, pack_partial
from tp_logprob.kernels.native import torch_native_logprob
from tp_logprob.kernels.triton.inputs import prepare

pytestmark = pytest.mark.triton

MASK = np.array([True, False, True, True, True, False, True, True, True, True])


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_agrees_with_oracle_and_native_at_every_tp_degree(backend: str, layout: str) -> None:
    contract = make_contract(LAYOUTS[layout], num_tokens=10, active_mask=MASK)
    logits, targets = random_inputs(7, 10, active_mask=MASK)
    result = run_tp(BACKENDS[backend], logits, targets, contract)[0]  # replicated, or it raises
    assert result.selected_logp.dtype == torch.float32 and result.lse.dtype == torch.float32
    assert oracle_report(backend, result, logits, targets, contract) is None
    assert native_report(backend, result, logits, targets, contract) is None


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("layout", ["tp1", "tp3-padding-shard", "tp8-mixed"])
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_half_inputs_agree_with_oracle(backend: str, layout: str, dtype: str) -> None:
    contract = make_contract(LAYOUTS[layout], num_tokens=6, dtype=dtype)
    logits, targets = random_inputs(5, 6, dtype=dtype, scale=8.0)
    result = run_tp(BACKENDS[backend], logits, targets, contract)[0]
    assert oracle_report(backend, result, logits, targets, contract) is None
    assert native_report(backend, result, logits, targets, contract) is None


def test_wide_rows_span_many_tiles() -> None:
    """64 columns, 60 real: 4 tiles per row at TP=1, uneven shards at TP=3."""
    bounds_by_tp = {1: ((0, 64),), 3: ((0, 17), (17, 50), (50, 64))}
    logits, targets = random_inputs(12, 5, real=60, padded=64, scale=5.0)
    for bounds in bounds_by_tp.values():
        contract = make_contract(bounds, num_tokens=5, real=60)
        for backend, op in BACKENDS.items():
            result = run_tp(op, logits, targets, contract)[0]
            assert oracle_report(backend, result, logits, targets, contract, real=60) is None


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_run_to_run_bitwise(backend: str) -> None:
    contract = make_contract(LAYOUTS["tp4-width1-padding"], num_tokens=6, dtype="bf16")
    logits, targets = random_inputs(5, 6, dtype="bf16")
    first = run_tp(BACKENDS[backend], logits, targets, contract)[0]
    for _ in range(2):
        again = run_tp(BACKENDS[backend], logits, targets, contract)[0]
        assert bits_of(again) == bits_of(first)


@pytest.mark.parametrize("layout", ["tp1", "tp3-uneven"])
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_batch_invariant_alone_batched_and_permuted(backend: str, layout: str) -> None:
    n, op = 8, BACKENDS[backend]
    logits, targets = random_inputs(11, n, scale=6.0)
    batched = run_tp(op, logits, targets, make_contract(LAYOUTS[layout], num_tokens=n))[0]
    order = torch.from_numpy(np.random.default_rng(2).permutation(n))
    permuted = run_tp(
        op, logits[order], targets[order], make_contract(LAYOUTS[layout], num_tokens=n)
    )[0]
    assert_same_bits(permuted.selected_logp, batched.selected_logp[order], "permuted selected")
    assert_same_bits(permuted.lse, batched.lse[order], "permuted lse")
    for row in (0, n - 1):
        contract = make_contract(LAYOUTS[layout], num_tokens=1)
        alone = run_tp(op, logits[row : row + 1], targets[row : row + 1], contract)[0]
        assert_same_bits(alone.selected_logp, batched.selected_logp[row : row + 1], "alone")
        assert_same_bits(alone.lse, batched.lse[row : row + 1], "alone lse")


@pytest.mark.parametrize("layout", ["tp1", "tp4-width1-padding"])
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_padding_contents_never_change_an_output(backend: str, layout: str) -> None:
    contract = make_contract(LAYOUTS[layout], num_tokens=len(PADDING_FILLS))
    clean, logits, targets = garbage_padding_inputs()
    want = run_tp(BACKENDS[backend], clean, targets, contract)[0]
    got = run_tp(BACKENDS[backend], logits, targets, contract)[0]
    assert bits_of(got) == bits_of(want)


@pytest.mark.parametrize("target_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("layout", ["tp1", "tp4-width1-padding"])
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_inactive_rows_give_positive_zero_whatever_the_target(
    backend: str, layout: str, target_dtype: torch.dtype
) -> None:
    info = torch.iinfo(target_dtype)
    garbage = [-100, -1, info.min, REAL, PADDED, info.max]
    mask = np.array([True] + [False] * len(garbage) + [False])
    contract = make_contract(LAYOUTS[layout], num_tokens=len(mask), active_mask=mask)
    logits, targets = random_inputs(9, len(mask), active_mask=mask)
    logits[-1, 3] = float("nan")  # an inactive row holding NaN still gives 0.0
    targets = targets.to(target_dtype)
    targets[1 : 1 + len(garbage)] = torch.tensor(garbage, dtype=target_dtype)
    result = run_tp(BACKENDS[backend], logits, targets, contract)[0]
    assert (bits(result.selected_logp)[1:] == 0).all()
    assert math.isfinite(result.selected_logp[0]) and result.selected_logp[0] < 0
    assert math.isnan(result.lse[-1])  # an inactive row's lse is still the row's LSE
    assert torch.isfinite(result.lse[:-1]).all()


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_int32_and_int64_targets_give_the_same_bits(backend: str) -> None:
    contract = make_contract(LAYOUTS["tp3-uneven"], num_tokens=5)
    logits, targets = random_inputs(6, 5)
    wide = run_tp(BACKENDS[backend], logits, targets, contract)[0]
    narrow = run_tp(BACKENDS[backend], logits, targets.to(torch.int32), contract)[0]
    assert bits_of(narrow) == bits_of(wide)


@pytest.mark.parametrize(
    "bounds",
    [((0, 10),), ((0, 4), (4, 10)), ((0, 1), (1, 4), (4, 8), (8, 10))],
    ids=["tp1", "tp2", "tp4-padding-shard"],
)
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_special_values_follow_design_section_2(
    backend: str, bounds: tuple[tuple[int, int], ...]
) -> None:
    """All cases in one batch (rows are independent); each row checked against docs/semantics.md and
    against float64 torch, and bitwise on special values against torch_native."""
    cases = list(SPECIAL_CASES.values())
    logits = torch.tensor([[*row, NAN, INF] for row, *_ in cases], dtype=torch.float32)
    targets = torch.tensor([target for _, target, *_ in cases])
    mask = np.array([active for _, _, active, *_ in cases])
    contract = make_contract(bounds, num_tokens=len(cases), active_mask=mask, real=8)
    result = run_tp(BACKENDS[backend], logits, targets, contract)[0]
    native = run_tp(torch_native_logprob, logits, targets, contract)[0]
    for index, (name, (row, target, active, want_selected, want_lse)) in enumerate(
        SPECIAL_CASES.items()
    ):
        live = torch.tensor([row], dtype=torch.float64)
        torch_lse = float(torch.logsumexp(live, dim=1)[0])
        torch_selected = float(torch.log_softmax(live, dim=1)[0, target]) if active else 0.0
        magnitude = max([abs(v) for v in row if math.isfinite(v)], default=0.0)
        for output, want, torch_value in (
            ("selected_logp", want_selected, torch_selected),
            ("lse", want_lse, torch_lse),
        ):
            got = float(getattr(result, output)[index])
            label = f"{name}: {output}={got!r}"
            if want == "nan":
                assert math.isnan(got), f"{label}, want NaN"
            elif want == "finite":
                assert math.isfinite(got), f"{label}, want finite"
            else:
                assert got == want and math.copysign(1, got) == math.copysign(1, want), label
            assert (math.isnan(got) and math.isnan(torch_value)) or math.isclose(
                got, torch_value, rel_tol=1e-6, abs_tol=2.0**-22 * magnitude
            ), f"{label}, float64 torch gives {torch_value!r}"
            native_value = float(getattr(native, output)[index])
            if not math.isfinite(native_value):
                assert bits(getattr(result, output))[index] == bits(getattr(native, output))[
                    index
                ] or (math.isnan(got) and math.isnan(native_value)), f"{label} vs native"


def test_shards_with_no_live_column_are_the_identity() -> None:
    """Every shard but one holds only -inf or padding: the result is exact."""
    contract = make_contract(LAYOUTS["tp8-mixed"], num_tokens=1)
    logits = torch.full((1, PADDED), float("-inf"))
    logits[0, 5] = 2.5
    logits[0, REAL:] = float("nan")
    for op in BACKENDS.values():
        result = run_tp(op, logits, torch.tensor([5]), contract)[0]
        assert float(result.selected_logp[0]) == 0.0 and float(result.lse[0]) == 2.5


@pytest.mark.parametrize("output_dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_output_dtype_is_a_final_cast_of_the_fp32_result(backend: str, output_dtype: str) -> None:
    logits, targets = random_inputs(3, 6)
    reference = run_tp(
        BACKENDS[backend], logits, targets, make_contract(LAYOUTS["tp3-uneven"], num_tokens=6)
    )[0]
    cast = make_contract(LAYOUTS["tp3-uneven"], num_tokens=6, output_dtype=output_dtype)
    result = run_tp(BACKENDS[backend], logits, targets, cast)[0]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[output_dtype]
    assert result.selected_logp.dtype == dtype and result.lse.dtype == dtype
    assert_same_bits(result.selected_logp, reference.selected_logp.to(dtype), "selected")
    assert_same_bits(result.lse, reference.lse.to(dtype), "lse")


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_export_lse_false_returns_none(backend: str) -> None:
    contract = make_contract(LAYOUTS["tp2-width1"], num_tokens=3, export_lse=False)
    logits, targets = random_inputs(1, 3)
    results = run_tp(BACKENDS[backend], logits, targets, contract)
    assert all(result.lse is None for result in results)
    full = run_tp(
        BACKENDS[backend], logits, targets, make_contract(LAYOUTS["tp2-width1"], num_tokens=3)
    )[0]
    assert_same_bits(results[0].selected_logp, full.selected_logp, "selected")


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_wrong_shard_width_raises_a_contract_error(backend: str) -> None:
    contract = make_contract(LAYOUTS["tp1"], num_tokens=2)
    logits, targets = random_inputs(0, 2)
    with pytest.raises(tpl.LogprobContractError, match="width 23"):
        BACKENDS[backend](logits[:, :-1], targets, contract)


def test_no_rows_gives_empty_outputs() -> None:
    contract = make_contract(LAYOUTS["tp3-uneven"], num_tokens=0)
    for op in BACKENDS.values():
        result = run_tp(op, torch.zeros((0, PADDED)), torch.zeros(0, dtype=torch.long), contract)[0]
        assert result.selected_logp.shape == (0,) and result.lse.shape == (0,)


def test_online_merge_matches_merge_partials() -> None:
    """The merge kernel and merge.merge_partials give the same results on the same partials,
    special partials included: identity (-inf, 0), NaN max, +inf max (sum 0)."""
    rng = np.random.default_rng(3)
    ranks, rows = 3, 7
    maxima = torch.from_numpy(rng.normal(0, 3, (ranks, rows)).astype(np.float32))
    sums = torch.from_numpy(rng.uniform(1, 20, (ranks, rows)).astype(np.float32))
    maxima[0, 1], sums[0, 1] = float("-inf"), 0.0  # a shard without live columns
    maxima[:, 2], sums[:, 2] = float("-inf"), 0.0  # an all -inf row
    maxima[1, 3] = float("nan")
    maxima[2, 4], sums[2, 4] = float("inf"), 0.0
    bounds = ((0, 6), (6, 12), (12, 20))
    targets = torch.from_numpy(rng.integers(0, 19, rows))
    target_logits = maxima - 1.0
    gathered = torch.stack([pack_partial(maxima[r], sums[r], target_logits[r]) for r in range(3)])
    contract = make_contract(bounds, num_tokens=rows, real=19)
    active = torch.ones(rows, dtype=torch.bool)
    inputs = prepare(torch.zeros((rows, 6)), targets, active, contract)
    got = online_merge(gathered, inputs, contract)
    owners = torch.bucketize(targets, torch.tensor([6, 12, 20]), right=True)
    want_selected, want_lse = merge_partials(list(gathered), owners, active)
    for name, a, b in (("lse", got.lse, want_lse), ("selected", got.selected, want_selected)):
        special = ~torch.isfinite(b)
        assert torch.equal(torch.isnan(a), torch.isnan(b)), name
        assert torch.equal(a[special & ~torch.isnan(b)], b[special & ~torch.isnan(b)]), name
        assert torch.allclose(a[~special], b[~special], rtol=4e-7, atol=0), name
