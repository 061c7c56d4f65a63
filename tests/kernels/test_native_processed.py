"""torch_native with a sampling support: the exact outputs over ``S``, the raw op's bits with
every rule off, a replayed mask equal to the recomputed one, special rows and the results'
fields."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import tp_logprob as tpl
from tests.helpers.native_cases import (
    INF,
    LAYOUTS,
    NAN,
    PADDED,
    REAL,
    SPECIAL_CASES,
    as_float64,
    assert_same_bits,
    oracle_report,
    random_inputs,
)
from tests.helpers.support_cases import (
    live_z32,
    masked_logits,
    reference_support,
    support_contract,
)
from tp_logprob.kernels.builtin import TORCH_NATIVE, TORCH_NATIVE_FUSED
from tp_logprob.kernels.native import torch_native_logprob
from tp_logprob.oracle import exact_entropy, exact_selected_logprob, tolerance

MASK = np.array([True, True, False, True, True, True, False, True])
RULES = {
    "min_p": {"min_p": 0.05},
    "top_k": {"top_k": 4},
    "top_p": {"top_p": 0.75},
    "all-three": {"min_p": 0.01, "top_k": 7, "top_p": 0.9},
    "top_k-1": {"top_k": 1},
}
OFF = {"top_p-1": {"top_p": 1.0}, "min_p-0-top_k-vocab": {"min_p": 0.0, "top_k": REAL}}
OUTPUTS = ("selected_logp", "lse", "entropy")


def run(
    logits: torch.Tensor,
    targets: torch.Tensor,
    layout: str,
    support: tpl.SupportSpec | None,
    **contract_args: Any,
) -> tpl.LogprobResult:
    contract = support_contract(LAYOUTS[layout], support, num_tokens=len(logits), **contract_args)
    return tpl.run_tp(torch_native_logprob, logits, targets, contract)[0]


def kept_targets(logits: torch.Tensor, keep: np.ndarray, seed: int) -> torch.Tensor:
    """A target inside each row's support (as an engine samples), chosen at random."""
    rng = np.random.default_rng(seed)
    return torch.tensor([int(rng.choice(np.flatnonzero(row))) for row in keep])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("rules", list(RULES.values()), ids=list(RULES))
@pytest.mark.parametrize("layout", ["tp1", "tp3-uneven", "tp4-width1-padding"])
def test_outputs_match_the_exact_oracle_over_the_support(
    layout: str, rules: dict[str, float], temperature: float
) -> None:
    logits, targets = random_inputs(17, 8, active_mask=MASK, scale=2.0)
    logits[:, REAL:] = NAN  # padding counts as -inf, whatever it holds
    want = reference_support(live_z32(logits, temperature), **rules)  # type: ignore[arg-type]
    assert (want.margin > 1e-4).all()
    targets[::3] = kept_targets(logits, want.keep, 1)[::3]  # some inside S, others anywhere
    targets[~torch.from_numpy(MASK)] = -100
    result = run(
        logits,
        targets,
        layout,
        tpl.SupportSpec(**rules),  # type: ignore[arg-type]
        active_mask=MASK,
        temperature=temperature,
        entropy=True,
    )
    assert result.support_size.tolist() == want.size.tolist()
    np.testing.assert_array_equal(result.support_threshold.double().numpy(), want.tau)
    masked = masked_logits(logits, want.keep)
    table = tolerance("fp32", REAL, num_shards=len(LAYOUTS[layout]))
    processed = tpl.LogprobResult(result.selected_logp, result.support_lse)
    report = oracle_report(
        processed, masked / np.float32(temperature), targets, active_mask=MASK, table=table
    )
    assert report is None, report
    x, t = as_float64(logits), temperature
    _, full_lse = exact_selected_logprob(
        x, targets.numpy(), active_mask=MASK, real_vocab_size=REAL, temperature=t
    )
    np.testing.assert_allclose(result.lse.double().numpy(), full_lse, rtol=2e-6)
    entropy = exact_entropy(
        as_float64(masked), active_mask=MASK, real_vocab_size=REAL, temperature=t
    )
    np.testing.assert_allclose(result.entropy.double().numpy(), entropy, rtol=1e-5, atol=1e-6)
    outside = MASK & ~want.keep[np.arange(8), np.clip(targets.numpy(), 0, REAL - 1)]
    assert outside.any() and (result.selected_logp.numpy()[outside] == -INF).all()


def test_support_lse_minus_lse_is_the_log_of_the_kept_mass() -> None:
    logits, targets = random_inputs(23, 8, scale=3.0)
    rules = {"top_k": 6, "top_p": 0.8}
    result = run(logits, targets, "tp3-uneven", tpl.SupportSpec(**rules))  # type: ignore[arg-type]
    z = live_z32(logits)
    keep = reference_support(z, **rules).keep  # type: ignore[arg-type]
    probs = np.exp(z - z.max(axis=1, keepdims=True))
    kept_mass = (probs * keep).sum(axis=1) / probs.sum(axis=1)
    got = (result.support_lse - result.lse).double().numpy()
    np.testing.assert_allclose(got, np.log(kept_mass), rtol=0, atol=4e-6)
    assert (got < 0).all()


def special_rows() -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """The special-value rows of every backend's tests, on 8 live columns of 12."""
    logits = torch.zeros((len(SPECIAL_CASES), 12))
    logits[:, 8:] = NAN
    logits[:, -1] = INF
    targets = torch.zeros(len(SPECIAL_CASES), dtype=torch.int64)
    active = np.zeros(len(SPECIAL_CASES), dtype=bool)
    for row, (values, target, is_active, _, _) in enumerate(SPECIAL_CASES.values()):
        logits[row, :8] = torch.tensor(values)
        targets[row], active[row] = target, is_active
    return logits, targets, active


SPECIAL_LAYOUTS = {"tp1": ((0, 12),), "tp2": ((0, 4), (4, 12)), "tp3": ((0, 3), (3, 8), (8, 12))}


def special_contract(
    bounds: tuple[tuple[int, int], ...],
    support: tpl.SupportSpec | None,
    active: np.ndarray,
    role: str = "infer",
) -> tpl.LogprobContract:
    return support_contract(
        bounds,
        support,
        num_tokens=len(active),
        active_mask=active,
        real=8,
        temperature=0.5,
        entropy=True,
        role=role,
    )


@pytest.mark.parametrize("rules", list(OFF.values()), ids=list(OFF))
@pytest.mark.parametrize("layout", list(SPECIAL_LAYOUTS))
def test_every_rule_off_is_bitwise_the_raw_op(layout: str, rules: dict[str, float]) -> None:
    """Special rows included: the outputs are the raw op's bits; ``support_lse`` is ``lse``
    where the support is defined and NaN where it is not."""
    logits, targets, active = special_rows()
    bounds = SPECIAL_LAYOUTS[layout]
    support = tpl.SupportSpec(**rules)  # type: ignore[arg-type]
    raw = tpl.run_tp(torch_native_logprob, logits, targets, special_contract(bounds, None, active))
    got = tpl.run_tp(
        torch_native_logprob, logits, targets, special_contract(bounds, support, active)
    )
    for name in OUTPUTS:
        assert_same_bits(getattr(got[0], name), getattr(raw[0], name), name)
    defined = torch.isfinite(raw[0].lse)
    assert_same_bits(got[0].support_lse[defined], raw[0].lse[defined], "support_lse")
    assert torch.isnan(got[0].support_lse[~defined]).all()
    assert got[0].support_size.tolist() == torch.where(defined, 8, 0).tolist()
    live = logits[:, :8]
    assert_same_bits(got[0].support_threshold[defined], live.amin(dim=1)[defined], "threshold")


def test_every_rule_off_random_rows_bitwise_on_every_layout() -> None:
    logits, targets = random_inputs(5, 8, active_mask=MASK)
    for layout in LAYOUTS:
        raw = run(logits, targets, layout, None, active_mask=MASK, entropy=True)
        off = run(
            logits, targets, layout, tpl.SupportSpec(top_p=1.0), active_mask=MASK, entropy=True
        )
        for name in OUTPUTS:
            assert_same_bits(getattr(off, name), getattr(raw, name), f"{layout} {name}")
        assert_same_bits(off.support_lse, raw.lse, f"{layout} support_lse")


@pytest.mark.parametrize("rules", list(RULES.values()), ids=list(RULES))
@pytest.mark.parametrize("layout", ["tp1", "tp3-uneven", "tp8-mixed"])
def test_replayed_mask_equal_to_the_recomputed_one_gives_the_same_bits(
    layout: str, rules: dict[str, float]
) -> None:
    logits, _ = random_inputs(29, 8, active_mask=MASK, scale=3.0)
    recomputed = tpl.SupportSpec(**rules)  # type: ignore[arg-type]
    args = {"active_mask": MASK, "temperature": 0.8, "entropy": True}
    probe = run(logits, torch.zeros(8, dtype=torch.int64), layout, recomputed, **args)
    keep = (logits[:, :REAL] / torch.tensor(0.8)) >= probe.support_threshold.unsqueeze(1)
    targets = kept_targets(logits, keep.numpy(), 7)
    replayed = tpl.SupportSpec.from_mask(keep.numpy())
    a = run(logits, targets, layout, recomputed, **args)
    b = run(logits, targets, layout, replayed, **args)
    for name in (*OUTPUTS, "support_lse", "support_size"):
        assert_same_bits(getattr(b, name), getattr(a, name), name)
    assert b.support_threshold is None


def test_columns_outside_a_replayed_support_reach_lse_only() -> None:
    logits, targets = random_inputs(31, 4)
    keep = np.zeros((4, REAL), dtype=bool)
    keep[:, :5] = True
    targets = torch.tensor([0, 1, 2, 4])
    support = tpl.SupportSpec.from_mask(keep)
    clean = run(logits, targets, "tp3-uneven", support, entropy=True)
    logits[0, 7], logits[1, 12], logits[2, 18] = NAN, INF, NAN
    dirty = run(logits, targets, "tp3-uneven", support, entropy=True)
    for name in ("selected_logp", "entropy", "support_lse"):
        assert_same_bits(getattr(dirty, name), getattr(clean, name), name)
    assert torch.isnan(dirty.lse[[0, 2]]).all() and dirty.lse[1] == INF
    assert_same_bits(dirty.lse[3:], clean.lse[3:], "lse of the clean row")


def test_special_rows_inside_a_replayed_support() -> None:
    rows = [
        [1.0, NAN, 2.0],  # a NaN in S
        [1.0, INF, 2.0],  # +inf in S
        [-INF, -INF, 3.0],  # a -inf target in S
        [-INF, -INF, -INF],  # S all -inf
    ]
    logits = torch.zeros(5, PADDED)
    for row, values in enumerate(rows):
        logits[row, :3] = torch.tensor(values)
    keep = np.zeros((5, REAL), dtype=bool)
    keep[:4, :3] = True
    active = np.array([True, True, True, True, False])
    targets = torch.tensor([0, 0, 0, 0, -100])
    support = tpl.SupportSpec.from_mask(keep)  # the inactive row keeps no id
    result = run(logits, targets, "tp2-width1", support, active_mask=active, entropy=True)
    selected, support_lse, entropy = result.selected_logp, result.support_lse, result.entropy
    assert torch.isnan(selected[[0, 1, 3]]).all() and selected[2] == -INF
    assert torch.isnan(support_lse[0]) and support_lse[1] == INF and support_lse[2] == 3.0
    assert support_lse[3] == -INF and support_lse[4] == -INF
    assert torch.isnan(entropy[[0, 1, 3]]).all() and entropy[2] == 0.0
    assert_same_bits(selected[4:], torch.zeros(1), "inactive selected_logp is +0.0")
    assert_same_bits(entropy[4:], torch.zeros(1), "inactive entropy is +0.0")
    assert result.support_size.tolist() == [3, 3, 3, 3, 0]


def test_undefined_recomputed_support_gives_nan() -> None:
    logits = torch.zeros(4, PADDED)
    logits[0, 2], logits[1, 5] = NAN, INF
    logits[2, :REAL] = -INF
    logits[3, :REAL] = torch.arange(REAL, dtype=torch.float32)
    active = np.array([True, True, True, False])
    logits = torch.cat([logits, logits])
    active = np.concatenate([active, ~active])
    targets = torch.where(torch.from_numpy(active), 1, -100)
    result = run(
        logits,
        targets,
        "tp3-uneven",
        tpl.SupportSpec(top_p=0.5, top_k=3),
        active_mask=active,
        entropy=True,
    )
    undefined = torch.tensor([True, True, True, False] * 2)
    assert torch.isnan(result.support_lse[undefined]).all()
    assert torch.isnan(result.support_threshold[undefined]).all()
    assert (result.support_size[undefined] == 0).all()
    on = torch.from_numpy(active) & undefined
    assert torch.isnan(result.selected_logp[on]).all() and torch.isnan(result.entropy[on]).all()
    off = ~torch.from_numpy(active)
    assert (result.selected_logp[off] == 0).all() and (result.entropy[off] == 0).all()
    assert result.support_size[3] == result.support_size[7] == 1  # masses 1, 1/e, 1/e^2


def test_result_fields_and_dtypes() -> None:
    logits, targets = random_inputs(2, 3)
    bf16 = {"output_dtype": "bf16"}
    recomputed = run(logits, targets, "tp2-width1", tpl.SupportSpec(top_k=3), **bf16)
    assert recomputed.selected_logp.dtype == recomputed.support_lse.dtype == torch.bfloat16
    assert recomputed.support_threshold.dtype == torch.float32
    assert recomputed.support_size.dtype == torch.int64
    keep = np.ones((3, REAL), dtype=bool)
    replayed = run(logits, targets, "tp1", tpl.SupportSpec.from_mask(keep), export_lse=False)
    assert replayed.lse is None and replayed.support_threshold is None
    assert replayed.support_lse is not None and replayed.support_size.tolist() == [REAL] * 3
    raw = run(logits, targets, "tp1", None)
    assert (raw.support_lse, raw.support_size, raw.support_threshold) == (None, None, None)
    assert len(recomputed) == 2, "the support's outputs never change the iteration"


def test_export_lse_false_does_not_change_the_other_outputs() -> None:
    logits, targets = random_inputs(9, 6, scale=3.0)
    support = tpl.SupportSpec(min_p=0.02, top_p=0.9)
    with_lse = run(logits, targets, "tp3-uneven", support, entropy=True)
    without = run(logits, targets, "tp3-uneven", support, entropy=True, export_lse=False)
    for name in ("selected_logp", "entropy", "support_lse", "support_size", "support_threshold"):
        assert_same_bits(getattr(without, name), getattr(with_lse, name), name)


@pytest.mark.parametrize(
    "capability", [TORCH_NATIVE, TORCH_NATIVE_FUSED], ids=lambda c: c.backend_id
)
def test_torch_backends_serve_every_support_mode(capability: tpl.LogprobBackendCapability) -> None:
    assert capability.served_values("support_mode") == set(tpl.SupportMode)


def test_dispatch_sends_a_support_contract_to_torch_native() -> None:
    contract = support_contract(LAYOUTS["tp1"], tpl.SupportSpec(top_k=2))
    dispatched = tpl.registry.get_logprob_op(contract, platform="cpu")
    assert dispatched.capability.backend_id == "torch_native"
    logits, targets = random_inputs(1, 4)
    assert dispatched.op(logits, targets, contract).support_size.tolist() == [2] * 4
