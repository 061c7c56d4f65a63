"""triton_online and triton_exact_sum with a sampling support: torch_native's support and values,
the exact oracle over ``S``, the raw op's bits with every rule off, a replayed mask equal to
the recomputed one, triton_exact_sum's bits across layouts, special rows (CPU interpreter)."""

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
    assert_same_bits,
    random_inputs,
)
from tests.helpers.processed_cases import (
    PROCESSED_OUTPUTS,
    kept_targets,
    processed_report,
    scattered_keep,
)
from tests.helpers.support_cases import (
    live_z32,
    masked_logits,
    reference_support,
    support_contract,
)
from tests.helpers.triton_cases import BACKENDS, oracle_report
from tests.kernels.test_native_processed import SPECIAL_LAYOUTS, special_contract, special_rows
from tp_logprob.kernels.builtin import TRITON_EXACT_SUM, TRITON_ONLINE
from tp_logprob.kernels.native import torch_native_logprob

pytestmark = pytest.mark.triton

MASK = np.array([True, True, False, True, True, True, False, True])
RULES: dict[str, dict[str, Any]] = {
    "min_p": {"min_p": 0.05},
    "top_k": {"top_k": 4},
    "top_p": {"top_p": 0.75},
    "all-three": {"min_p": 0.01, "top_k": 7, "top_p": 0.9},
    "top_k-1": {"top_k": 1},
}
OFF = {"top_p-1": {"top_p": 1.0}, "min_p-0-top_k-vocab": {"min_p": 0.0, "top_k": REAL}}
TEMPERATURE = 0.7


def run(
    backend: str,
    logits: torch.Tensor,
    targets: torch.Tensor,
    layout: str,
    support: tpl.SupportSpec | None,
    **contract_args: Any,
) -> tpl.LogprobResult:
    contract = support_contract(LAYOUTS[layout], support, num_tokens=len(logits), **contract_args)
    op = torch_native_logprob if backend == "torch_native" else BACKENDS[backend]
    return tpl.run_tp(op, logits, targets, contract)[0]


def supports(logits: torch.Tensor, rules: str) -> tuple[tpl.SupportSpec, np.ndarray]:
    """The support named ``rules`` and its mask: a rule set (recomputed), or ``scattered``,
    a replayed mask that is no upper set."""
    if rules == "scattered":
        keep = scattered_keep(3, len(logits))
        return tpl.SupportSpec.from_mask(keep), keep
    keep = reference_support(live_z32(logits, TEMPERATURE), **RULES[rules]).keep
    return tpl.SupportSpec(**RULES[rules]), keep


@pytest.mark.parametrize("rules", [*RULES, "scattered"])
@pytest.mark.parametrize("layout", ["tp1", "tp3-uneven", "tp4-width1-padding"])
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_agrees_with_torch_native_and_the_exact_oracle_over_the_support(
    backend: str, layout: str, rules: str
) -> None:
    logits, _ = random_inputs(17, 8, active_mask=MASK, scale=2.0)
    logits[:, REAL:] = NAN  # padding counts as -inf, whatever it holds
    support, keep = supports(logits, rules)
    targets = kept_targets(keep, 1, MASK)
    outside = np.flatnonzero(~keep[3])
    if rules != "scattered" and outside.size:  # a target outside S: selected_logp -inf
        targets[3] = int(outside[0])
    args = {"active_mask": MASK, "temperature": TEMPERATURE, "entropy": True}
    contract = support_contract(LAYOUTS[layout], support, num_tokens=8, **args)
    got = run(backend, logits, targets, layout, support, **args)
    want = run("torch_native", logits, targets, layout, support, **args)
    assert processed_report(backend, got, want, contract) is None
    assert got.support_size.tolist() == keep.sum(axis=1).tolist()
    masked = masked_logits(logits, keep) / np.float32(TEMPERATURE)
    over_s = tpl.LogprobResult(got.selected_logp, got.support_lse)
    assert oracle_report(backend, over_s, masked, targets, contract) is None


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_half_inputs_agree_with_torch_native(backend: str, dtype: str) -> None:
    logits, targets = random_inputs(19, 6, dtype=dtype, scale=4.0)
    support = tpl.SupportSpec(min_p=0.02, top_k=6, top_p=0.85)
    args = {"dtype": dtype, "temperature": TEMPERATURE, "entropy": True}
    targets = torch.argmax(logits[:, :REAL].float(), dim=1)  # the maximum is always kept
    contract = support_contract(LAYOUTS["tp3-uneven"], support, num_tokens=6, **args)
    got = run(backend, logits, targets, "tp3-uneven", support, **args)
    want = run("torch_native", logits, targets, "tp3-uneven", support, **args)
    assert processed_report(backend, got, want, contract) is None


@pytest.mark.parametrize("rules", list(OFF.values()), ids=list(OFF))
@pytest.mark.parametrize("layout", list(SPECIAL_LAYOUTS))
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_every_rule_off_is_bitwise_the_raw_op(
    backend: str, layout: str, rules: dict[str, Any]
) -> None:
    """Special rows included: the outputs are the raw op's bits; ``support_lse`` is ``lse``
    where the support is defined and NaN where it is not."""
    logits, targets, active = special_rows()
    bounds, op = SPECIAL_LAYOUTS[layout], BACKENDS[backend]
    raw = tpl.run_tp(op, logits, targets, special_contract(bounds, None, active))[0]
    off = special_contract(bounds, tpl.SupportSpec(**rules), active)
    got = tpl.run_tp(op, logits, targets, off)[0]
    for name in ("selected_logp", "lse", "entropy"):
        assert_same_bits(getattr(got, name), getattr(raw, name), name)
    defined = torch.isfinite(raw.lse)
    assert_same_bits(got.support_lse[defined], raw.lse[defined], "support_lse")
    assert torch.isnan(got.support_lse[~defined]).all()
    assert got.support_size.tolist() == torch.where(defined, 8, 0).tolist()
    live = logits[:, :8] / torch.tensor(0.5)
    assert_same_bits(got.support_threshold[defined], live.amin(dim=1)[defined], "threshold")
    assert torch.isnan(got.support_threshold[~defined]).all()


# Every rule set at TP 1 and on uneven shards; TP 8 (mixed widths) with every rule on.
REPLAYED_CASES = [
    *((layout, rules) for layout in ("tp1", "tp3-uneven") for rules in RULES),
    ("tp8-mixed", "all-three"),
]


@pytest.mark.parametrize(("layout", "rules"), REPLAYED_CASES)
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_replayed_mask_equal_to_the_recomputed_one_gives_the_same_bits(
    backend: str, layout: str, rules: str
) -> None:
    logits, _ = random_inputs(29, 8, active_mask=MASK, scale=3.0)
    recomputed = tpl.SupportSpec(**RULES[rules])
    args = {"active_mask": MASK, "temperature": 0.8, "entropy": True}
    probe = run(backend, logits, torch.zeros(8, dtype=torch.int64), layout, recomputed, **args)
    keep = (logits[:, :REAL] / torch.tensor(0.8)) >= probe.support_threshold.unsqueeze(1)
    targets = kept_targets(keep.numpy(), 7)
    replayed = tpl.SupportSpec.from_mask(keep.numpy())
    a = run(backend, logits, targets, layout, recomputed, **args)
    b = run(backend, logits, targets, layout, replayed, **args)
    for name in PROCESSED_OUTPUTS[:5]:
        assert_same_bits(getattr(b, name), getattr(a, name), name)
    assert b.support_threshold is None


@pytest.mark.parametrize("support", ["recomputed", "scattered"])
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_lse_is_the_raw_ops_bits(backend: str, support: str) -> None:
    """The full partial that rides with the support's is the raw op's, bit for bit."""
    logits, _ = random_inputs(37, 8, scale=3.0)
    spec, keep = supports(logits, "all-three" if support == "recomputed" else "scattered")
    targets = kept_targets(keep, 2)
    for layout in ("tp1", "tp3-uneven"):
        raw = run(backend, logits, targets, layout, None, temperature=TEMPERATURE)
        got = run(backend, logits, targets, layout, spec, temperature=TEMPERATURE, entropy=True)
        assert_same_bits(got.lse, raw.lse, f"{layout} lse")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_exact_sum_is_bitwise_across_every_layout_support_included(dtype: str) -> None:
    """TP 1..8, uneven shards, width-1 and padding-only shards: every output the same bits,
    the recomputed support's size and threshold too."""
    logits, _ = random_inputs(41, 8, dtype=dtype, active_mask=MASK, scale=3.0)
    logits[:, REAL:] = NAN
    logits[2, 5] = NAN  # an undefined support
    logits[4, :REAL] = -INF
    logits[4, 9] = 1.0  # one finite value
    keep = scattered_keep(5, 8)
    keep[4, 9] = True
    for support in (
        tpl.SupportSpec(min_p=0.01, top_k=9, top_p=0.8),
        tpl.SupportSpec.from_mask(keep),
    ):
        targets = (
            kept_targets(keep, 3, MASK) if support.kept_ids is not None else torch.full((8,), 9)
        )
        targets[~torch.from_numpy(MASK)] = -100
        args = {"dtype": dtype, "active_mask": MASK, "temperature": TEMPERATURE, "entropy": True}
        reference = run("triton_exact_sum", logits, targets, "tp1", support, **args)
        for layout in LAYOUTS:
            got = run("triton_exact_sum", logits, targets, layout, support, **args)
            for name in PROCESSED_OUTPUTS:
                a, b = getattr(got, name), getattr(reference, name)
                if a is None:
                    assert b is None, name
                    continue
                assert_same_bits(a, b, f"{support.mode.value} {layout} {name}")


def test_columns_outside_a_replayed_support_reach_lse_only() -> None:
    logits, _ = random_inputs(31, 4)
    keep = np.zeros((4, REAL), dtype=bool)
    keep[:, :5] = True
    targets = torch.tensor([0, 1, 2, 4])
    support = tpl.SupportSpec.from_mask(keep)
    dirty = logits.clone()
    dirty[0, 7], dirty[1, 12], dirty[2, 18] = NAN, INF, NAN
    for backend in BACKENDS:
        clean_result = run(backend, logits, targets, "tp3-uneven", support, entropy=True)
        dirty_result = run(backend, dirty, targets, "tp3-uneven", support, entropy=True)
        for name in ("selected_logp", "entropy", "support_lse"):
            assert_same_bits(getattr(dirty_result, name), getattr(clean_result, name), name)
        assert torch.isnan(dirty_result.lse[[0, 2]]).all() and dirty_result.lse[1] == INF
        assert_same_bits(dirty_result.lse[3:], clean_result.lse[3:], "lse of the clean row")


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_special_rows_inside_a_replayed_support(backend: str) -> None:
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
    result = run(backend, logits, targets, "tp2-width1", support, active_mask=active, entropy=True)
    selected, support_lse, entropy = result.selected_logp, result.support_lse, result.entropy
    assert torch.isnan(selected[[0, 1, 3]]).all() and selected[2] == -INF
    assert torch.isnan(support_lse[0]) and support_lse[1] == INF and support_lse[2] == 3.0
    assert support_lse[3] == -INF and support_lse[4] == -INF
    assert torch.isnan(entropy[[0, 1, 3]]).all() and entropy[2] == 0.0
    assert_same_bits(selected[4:], torch.zeros(1), "inactive selected_logp is +0.0")
    assert_same_bits(entropy[4:], torch.zeros(1), "inactive entropy is +0.0")
    assert result.support_size.tolist() == [3, 3, 3, 3, 0]


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_undefined_recomputed_support_gives_nan(backend: str) -> None:
    logits = torch.zeros(4, PADDED)
    logits[0, 2], logits[1, 5] = NAN, INF
    logits[2, :REAL] = -INF
    logits[3, :REAL] = torch.arange(REAL, dtype=torch.float32)
    active = np.array([True, True, True, False])
    logits = torch.cat([logits, logits])
    active = np.concatenate([active, ~active])
    targets = torch.where(torch.from_numpy(active), 1, -100)
    support = tpl.SupportSpec(top_p=0.5, top_k=3)
    args = {"active_mask": active, "entropy": True}
    result = run(backend, logits, targets, "tp3-uneven", support, **args)
    undefined = torch.tensor([True, True, True, False] * 2)
    assert torch.isnan(result.support_lse[undefined]).all()
    assert torch.isnan(result.support_threshold[undefined]).all()
    assert (result.support_size[undefined] == 0).all()
    on = torch.from_numpy(active) & undefined
    assert torch.isnan(result.selected_logp[on]).all() and torch.isnan(result.entropy[on]).all()
    off = ~torch.from_numpy(active)
    assert (result.selected_logp[off] == 0).all() and (result.entropy[off] == 0).all()
    assert result.support_size[3] == result.support_size[7] == 1  # masses 1, 1/e, 1/e^2
    assert result.lse[2] == -INF and torch.isnan(result.lse[0]) and result.lse[1] == INF


@pytest.mark.parametrize("support", ["recomputed", "scattered"])
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_export_lse_false_does_not_change_the_other_outputs(backend: str, support: str) -> None:
    """Without ``lse`` the partial carries the support's fields alone: the same bits."""
    logits, _ = random_inputs(9, 6, scale=3.0)
    spec, keep = supports(logits, "all-three" if support == "recomputed" else "scattered")
    targets = kept_targets(keep, 4)
    args = {"temperature": TEMPERATURE, "entropy": True}
    with_lse = run(backend, logits, targets, "tp3-uneven", spec, **args)
    without = run(backend, logits, targets, "tp3-uneven", spec, export_lse=False, **args)
    assert without.lse is None
    for name in PROCESSED_OUTPUTS:
        if name != "lse" and getattr(with_lse, name) is not None:
            assert_same_bits(getattr(without, name), getattr(with_lse, name), name)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_batch_invariant_with_a_support(backend: str) -> None:
    logits, _ = random_inputs(43, 6, scale=3.0)
    spec, keep = supports(logits, "all-three")
    targets = kept_targets(keep, 5)
    whole = run(backend, logits, targets, "tp3-uneven", spec, entropy=True)
    for row in (0, 3, 5):
        alone = run(
            backend, logits[row : row + 1], targets[row : row + 1], "tp3-uneven", spec, entropy=True
        )
        for name in PROCESSED_OUTPUTS:
            assert_same_bits(getattr(alone, name), getattr(whole, name)[row : row + 1], name)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_wide_rows_span_many_tiles(backend: str) -> None:
    """64 columns, 60 real: 4 tiles a row at TP 1; a scattered replayed mask makes a shard's
    support maximum trail its running maximum across tiles."""
    bounds = {"tp1": ((0, 64),), "tp3": ((0, 17), (17, 50), (50, 64))}
    logits, _ = random_inputs(12, 5, real=60, padded=64, scale=5.0)
    keep = scattered_keep(6, 5, real=60, kept=9)
    targets = kept_targets(keep, 6)
    for spec in (tpl.SupportSpec(top_k=20, top_p=0.95), tpl.SupportSpec.from_mask(keep)):
        for layout in bounds.values():
            contract = support_contract(
                layout, spec, num_tokens=5, real=60, temperature=TEMPERATURE, entropy=True
            )
            got = tpl.run_tp(BACKENDS[backend], logits, targets, contract)[0]
            want = tpl.run_tp(torch_native_logprob, logits, targets, contract)[0]
            assert processed_report(backend, got, want, contract, real=60) is None


def test_result_fields_and_dtypes() -> None:
    logits, targets = random_inputs(2, 3)
    for backend in BACKENDS:
        bf16 = {"output_dtype": "bf16"}
        recomputed = run(backend, logits, targets, "tp2-width1", tpl.SupportSpec(top_k=3), **bf16)
        assert recomputed.selected_logp.dtype == recomputed.support_lse.dtype == torch.bfloat16
        assert recomputed.support_threshold.dtype == torch.float32
        assert recomputed.support_size.dtype == torch.int64
        keep = np.ones((3, REAL), dtype=bool)
        replayed = run(
            backend, logits, targets, "tp1", tpl.SupportSpec.from_mask(keep), export_lse=False
        )
        assert replayed.lse is None and replayed.support_threshold is None
        assert replayed.support_size.tolist() == [REAL] * 3
        raw = run(backend, logits, targets, "tp1", None)
        assert (raw.support_lse, raw.support_size, raw.support_threshold) == (None, None, None)
        assert len(recomputed) == 2, "the support's outputs never change the iteration"


@pytest.mark.parametrize(
    "capability", [TRITON_ONLINE, TRITON_EXACT_SUM], ids=lambda c: c.backend_id
)
def test_triton_backends_serve_every_support_mode(capability: tpl.LogprobBackendCapability) -> None:
    assert capability.served_values("support_mode") == set(tpl.SupportMode)
