"""Temperature and entropy, forward, on all three backends: exact-oracle agreement at TP 1..3,
special rows, padding garbage, the T = 1 and T = 2^k identities, batch invariance,
triton_exact_sum's cross-TP bits, and how results unpack (Triton on the CPU interpreter)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

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
from tests.helpers.rl_cases import (
    BACKEND_PARAMS,
    OPS,
    exact_outputs,
    oracle_report,
    result_bits,
    rl_contract,
)
from tp_logprob.emulate import run_tp

MASK = np.array([True, False, True, True, True, False, True, True, True, True])
TP_LAYOUTS = ["tp1", "tp2-padding-shard", "tp3-uneven"]


@pytest.mark.parametrize(
    ("dtype", "temperature"),
    [("fp32", 0.6), ("bf16", 1.7), ("fp16", 0.3)],
)
@pytest.mark.parametrize("layout", TP_LAYOUTS)
@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_agrees_with_exact_oracle(
    backend: str, layout: str, dtype: str, temperature: float
) -> None:
    contract = rl_contract(
        LAYOUTS[layout], temperature=temperature, num_tokens=10, active_mask=MASK, dtype=dtype
    )
    logits, targets = random_inputs(7, 10, dtype=dtype, active_mask=MASK)
    logits[3, 5] = -INF  # a -inf live logit: p = 0, contributes exactly 0
    results = run_tp(OPS[backend], logits, targets, contract)  # replicated, or it raises
    result = results[0]
    assert result.entropy.dtype == torch.float32 and result.entropy.shape == (10,)
    for rank, other in enumerate(results[1:], start=1):
        assert_same_bits(other.entropy, result.entropy, f"rank {rank} entropy")
    report = oracle_report(backend, result, logits, targets, contract)
    assert report is None, report


@pytest.mark.parametrize(
    "bounds",
    [((0, 40),), ((0, 17), (17, 18), (18, 40)), ((0, 1), (1, 37), (37, 40))],
    ids=["tp1", "tp3-width1", "tp3-padding-shard"],
)
@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_multi_tile_rows_agree_with_exact_oracle(
    backend: str, bounds: tuple[tuple[int, int], ...]
) -> None:
    """40 columns, 37 real: the 16-column CPU tiles rescale the entropy accumulator."""
    contract = rl_contract(bounds, temperature=0.45, num_tokens=4, real=37, dtype="bf16")
    logits, targets = random_inputs(13, 4, dtype="bf16", real=37, padded=40, scale=6.0)
    logits[1, :30] = torch.linspace(-40, 3, 30)  # an increasing row: a new max in every tile
    logits[:, 37:] = NAN
    result = run_tp(OPS[backend], logits, targets, contract)[0]
    report = oracle_report(backend, result, logits, targets, contract, real=37)
    assert report is None, report


# Entropy of each shared special row (docs/semantics.md): "nan", "finite" or exactly 0.0.
SPECIAL_ENTROPY = {
    "nan-in-live-column": "nan",
    "nan-in-target-column": "nan",
    "+inf-in-live-column": "nan",
    "+inf-target": "nan",
    "+inf-in-both-shards": "nan",
    "+inf-and-nan": "nan",
    "-inf-target-finite-max": "finite",
    "all-live-minus-inf": "nan",
    "one-shard-all-minus-inf": "finite",
    "one-finite-column": 0.0,
    "huge-finite-logits": "finite",  # NaN at T < 1, where z = x / T overflows to +inf
    "inactive-row-with-nan": 0.0,
    "inactive-row-all-minus-inf": 0.0,
    "inactive-row-with-+inf": 0.0,
}
# Extra entropy rows (8 live logits, then the same padding garbage).
ENTROPY_ROWS = {
    "one-finite-among-minus-inf": ([-INF, -INF, 2.5, -INF, -INF, -INF, -INF, -INF], 2, 0.0),
    "two-equal-rest-minus-inf": ([-INF, 3.0, -INF, -INF, 3.0, -INF, -INF, -INF], 1, "finite"),
    "minus-inf-in-every-shard": ([-INF, 1.0, 0.5, -INF, 2.0, -INF, 0.0, -INF], 4, "finite"),
}


def test_every_shared_special_row_has_an_entropy_expectation() -> None:
    assert set(SPECIAL_ENTROPY) == set(SPECIAL_CASES)


SPECIAL_LAYOUTS = {
    "tp1": ((0, 10),),
    "tp2": ((0, 4), (4, 10)),
    "tp4-padding-shard": ((0, 1), (1, 4), (4, 8), (8, 10)),
}


@pytest.mark.parametrize(
    ("layout", "temperature"),
    [("tp1", 0.5), ("tp2", 1.0), ("tp4-padding-shard", 1.0), ("tp4-padding-shard", 4.0)],
)
@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_special_rows_follow_design_section_2(
    backend: str, layout: str, temperature: float
) -> None:
    """All rows in one batch, padding columns holding NaN and +inf: entropy NaN exactly where
    docs/semantics.md says, 0.0 for one finite live value and for inactive rows, finite with -inf
    logits; all three outputs within the oracle's tolerance."""
    rows = {
        name: (row, target, active) for name, (row, target, active, *_) in SPECIAL_CASES.items()
    }
    rows |= {name: (row, target, True) for name, (row, target, _) in ENTROPY_ROWS.items()}
    wants = SPECIAL_ENTROPY | {name: want for name, (*_, want) in ENTROPY_ROWS.items()}
    logits = torch.tensor([[*row, NAN, INF] for row, _, _ in rows.values()], dtype=torch.float32)
    targets = torch.tensor([target for _, target, _ in rows.values()])
    mask = np.array([active for _, _, active in rows.values()])
    contract = rl_contract(
        SPECIAL_LAYOUTS[layout],
        temperature=temperature,
        num_tokens=len(rows),
        active_mask=mask,
        real=8,
    )
    result = run_tp(OPS[backend], logits, targets, contract)[0]
    report = oracle_report(backend, result, logits, targets, contract, real=8)
    assert report is None, report
    for index, name in enumerate(rows):
        got = float(result.entropy[index])
        want = wants[name]
        if name == "huge-finite-logits" and temperature < 1.0:
            want = "nan"
        if want == "nan":
            assert math.isnan(got), f"{name}: entropy {got!r}, want NaN"
        elif want == "finite":
            assert math.isfinite(got), f"{name}: entropy {got!r}, want finite"
        else:
            assert bits(result.entropy)[index] == 0, f"{name}: entropy {got!r}, want +0.0"


@pytest.mark.parametrize("layout", ["tp1", "tp2-padding-shard", "tp4-width1-padding"])
@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_padding_garbage_is_never_counted(backend: str, layout: str) -> None:
    contract = rl_contract(LAYOUTS[layout], temperature=0.7, num_tokens=len(PADDING_FILLS))
    clean, logits, targets = garbage_padding_inputs()
    want = run_tp(OPS[backend], clean, targets, contract)[0]
    got = run_tp(OPS[backend], logits, targets, contract)[0]
    assert result_bits(got) == result_bits(want)
    assert torch.isfinite(got.entropy).all()


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_temperature_one_is_the_op_without_temperature(backend: str) -> None:
    """``T = 1`` (an int, or a float that rounds to 1 in fp32) gives the bits of a contract
    that never mentions temperature or entropy: exporting entropy changes no other output."""
    bounds = LAYOUTS["tp3-uneven"]
    logits, targets = random_inputs(8, 6, dtype="bf16", scale=6.0)
    plain = make_contract(bounds, num_tokens=6, dtype="bf16")
    assert plain.temperature == 1.0 and not plain.export_entropy
    want = run_tp(OPS[backend], logits, targets, plain)[0]
    entropies = []
    for temperature in (1, 1.0 + 2.0**-30):
        contract = rl_contract(bounds, temperature=temperature, num_tokens=6, dtype="bf16")
        got = run_tp(OPS[backend], logits, targets, contract)[0]
        assert result_bits(got)[:2] == result_bits(want), temperature
        entropies.append(bits(got.entropy).tolist())
    assert entropies[0] == entropies[1]


@pytest.mark.parametrize(("dtype", "k"), [("fp32", 1), ("bf16", 3), ("fp16", -2)])
@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_power_of_two_temperature_equals_prescaled_logits(backend: str, dtype: str, k: int) -> None:
    """``x / 2^k`` is exact, so ``T = 2^k`` on ``x`` and ``T = 1`` on ``x * 2^-k`` agree bitwise."""
    bounds = LAYOUTS["tp3-uneven"]
    logits, targets = random_inputs(9, 6, dtype=dtype, scale=5.0)
    logits[logits.abs() < 2.0**-6] = 0.0  # keeps x * 2^-k normal (exact) in fp16
    logits[2, 4] = -INF
    scaled = logits * 2.0**-k
    assert torch.equal(scaled.float() * 2.0**k, logits.float()), "the scaling must be exact"
    divided = run_tp(
        OPS[backend],
        logits,
        targets,
        rl_contract(bounds, temperature=2.0**k, num_tokens=6, dtype=dtype),
    )[0]
    prescaled = run_tp(
        OPS[backend],
        scaled,
        targets,
        rl_contract(bounds, temperature=1.0, num_tokens=6, dtype=dtype),
    )[0]
    assert result_bits(divided) == result_bits(prescaled)


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_temperature_is_one_ieee_division_per_logit(backend: str) -> None:
    """A row with one finite live logit has ``lse = z`` exactly, so ``lse`` shows the bits of
    ``fp32(x) / fp32(T)``: a multiplication by a rounded ``1/T`` (or an approximate division)
    is off by an ulp for about a tenth to a third of these values."""
    rng = np.random.default_rng(31)
    n = 24
    values = (rng.uniform(1, 2, n) * 2.0 ** rng.integers(-20, 40, n)).astype(np.float32)
    values *= np.where(rng.integers(0, 2, n) == 1, 1, -1).astype(np.float32)
    logits = torch.full((n, PADDED), -INF)
    columns = torch.from_numpy(rng.integers(0, REAL, n))
    logits[torch.arange(n), columns] = torch.from_numpy(values)
    logits[:, REAL:] = NAN
    for temperature in (0.7, 1.7):
        contract = rl_contract(LAYOUTS["tp2-width1"], temperature=temperature, num_tokens=n)
        result = run_tp(OPS[backend], logits, columns, contract)[0]
        want = torch.from_numpy(values / np.float32(temperature))
        assert_same_bits(result.lse, want, f"lse at T={temperature}")
        assert (bits(result.selected_logp) == 0).all() and (bits(result.entropy) == 0).all()


@pytest.mark.parametrize("layout", ["tp1", "tp3-uneven"])
@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_entropy_is_batch_invariant(backend: str, layout: str) -> None:
    n, op = 8, OPS[backend]
    logits, targets = random_inputs(11, n, scale=6.0)
    logits[3, :6] = -INF

    def contract(rows: int) -> object:
        return rl_contract(LAYOUTS[layout], temperature=0.7, num_tokens=rows)

    batched = run_tp(op, logits, targets, contract(n))[0]
    order = torch.from_numpy(np.random.default_rng(2).permutation(n))
    permuted = run_tp(op, logits[order], targets[order], contract(n))[0]
    assert_same_bits(permuted.entropy, batched.entropy[order], "permuted entropy")
    for row in (0, 3, n - 1):
        alone = run_tp(op, logits[row : row + 1], targets[row : row + 1], contract(1))[0]
        assert_same_bits(alone.entropy, batched.entropy[row : row + 1], f"row {row} alone")
        assert_same_bits(alone.lse, batched.lse[row : row + 1], f"row {row} lse alone")


def _exact_sum_rows(dtype: str) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Random rows, a near-tie, a wide range, -inf logits and the special rows."""
    mask = np.array([True, True, True, True, True, True, False, True])
    logits, targets = random_inputs(17, len(mask), dtype=dtype, scale=6.0, active_mask=mask)
    logits[1, :REAL] = 3.0  # every shifted term exp(0) * 0 = 0 and exp(0) = 1: H = log(REAL)
    logits[1, 4] = 3.0078125
    logits[2, :REAL] = torch.linspace(-90, 9, REAL)
    logits[3, 7] = NAN
    logits[4, 2] = INF
    logits[5, :REAL] = -INF
    logits[5, 11] = 0.5  # one finite live value: H = 0
    targets[5] = 11
    logits[6, :] = -INF  # inactive
    logits[7, ::3] = -INF
    targets[7] = 1
    logits[:, REAL:] = NAN
    return logits, targets, mask


CROSS_TP_LAYOUTS = ["tp1", "tp2-width1", "tp2-padding-shard", "tp3-uneven", "tp4-width1-padding"]


@pytest.mark.triton
@pytest.mark.parametrize(("dtype", "temperature"), [("fp32", 0.7), ("bf16", 1.0)])
def test_exact_sum_entropy_is_bitwise_equal_across_tp_degrees(
    dtype: str, temperature: float
) -> None:
    """TP 1..4: uneven shards, width-one shards, a shard of padding only."""
    logits, targets, mask = _exact_sum_rows(dtype)
    reference = None
    for name in CROSS_TP_LAYOUTS:
        bounds = LAYOUTS[name]
        contract = rl_contract(
            bounds, temperature=temperature, num_tokens=len(mask), active_mask=mask, dtype=dtype
        )
        result = run_tp(OPS["triton_exact_sum"], logits, targets, contract)[0]
        if reference is None:
            reference = result
            report = oracle_report("triton_exact_sum", result, logits, targets, contract)
            assert report is None, report
        assert result_bits(result) == result_bits(reference), f"layout {name} differs from tp1"


@pytest.mark.triton
def test_exact_sum_entropy_is_bitwise_equal_across_multi_tile_layouts() -> None:
    real, padded = 37, 40
    logits, targets = random_inputs(23, 4, dtype="bf16", real=real, padded=padded, scale=8.0)
    logits[2, ::4] = -INF
    layouts = [
        ((0, 40),),
        ((0, 1), (1, 40)),
        ((0, 13), (13, 29), (29, 40)),
        ((0, 16), (16, 17), (17, 37), (37, 40)),
    ]
    results = [
        run_tp(
            OPS["triton_exact_sum"],
            logits,
            targets,
            rl_contract(b, temperature=0.3, num_tokens=4, real=real, dtype="bf16"),
        )[0]
        for b in layouts
    ]
    for bounds, result in zip(layouts[1:], results[1:], strict=True):
        assert result_bits(result) == result_bits(results[0]), bounds


@pytest.mark.triton
def test_online_entropy_is_not_claimed_bitwise_across_layouts() -> None:
    """The cross-layout tests have power: the one-pass backend's entropy bits do move."""
    logits, targets = random_inputs(5, 8, scale=6.0)
    entropies = [
        bits(
            run_tp(
                OPS["triton_online"], logits, targets, rl_contract(b, temperature=0.7, num_tokens=8)
            )[0].entropy
        ).tolist()
        for b in (LAYOUTS["tp1"], LAYOUTS["tp3-uneven"], LAYOUTS["tp4-width1-padding"])
    ]
    assert entropies[0] != entropies[1] or entropies[0] != entropies[2]


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_results_unpack_with_and_without_entropy(backend: str) -> None:
    bounds = LAYOUTS["tp2-width1"]
    logits, targets = random_inputs(1, 3)
    op = OPS[backend]
    plain = run_tp(op, logits, targets, make_contract(bounds, num_tokens=3))[0]
    selected, lse = plain  # the pair callers have always unpacked
    assert plain.entropy is None and len(plain) == 2
    results = run_tp(op, logits, targets, rl_contract(bounds, num_tokens=3))
    selected_e, lse_e, entropy = results[0]
    assert entropy is results[0].entropy
    assert entropy.dtype == torch.float32 and entropy.shape == (3,)
    assert_same_bits(selected_e, selected, "selected")
    assert_same_bits(lse_e, lse, "lse")
    for rank, result in enumerate(results):
        assert_same_bits(result.entropy, entropy, f"rank {rank} entropy")
    hidden = run_tp(op, logits, targets, rl_contract(bounds, num_tokens=3, export_lse=False))
    assert all(result.lse is None for result in hidden)
    assert_same_bits(hidden[0].entropy, entropy, "entropy without lse")
    want = exact_outputs(logits, targets, rl_contract(bounds, num_tokens=3))[2]
    assert np.allclose(entropy.double().numpy(), want, rtol=1e-5, atol=0)


@pytest.mark.parametrize("output_dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_half_output_entropy_is_a_final_cast(backend: str, output_dtype: str) -> None:
    bounds = LAYOUTS["tp3-uneven"]
    logits, targets = random_inputs(3, 6)
    reference = run_tp(
        OPS[backend], logits, targets, rl_contract(bounds, temperature=0.6, num_tokens=6)
    )[0]
    cast = rl_contract(bounds, temperature=0.6, num_tokens=6, output_dtype=output_dtype)
    result = run_tp(OPS[backend], logits, targets, cast)[0]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[output_dtype]
    for name in ("selected_logp", "lse", "entropy"):
        got = getattr(result, name)
        assert got.dtype == dtype, name
        assert_same_bits(got, getattr(reference, name).to(dtype), name)
