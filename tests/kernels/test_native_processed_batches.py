"""torch_native on heterogeneous engine batches: per-row temperature, per-row rules,
greedy rows beside sampled ones (docs/semantics.md, "Heterogeneous batches")."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import tp_logprob as tpl
from tests.helpers.native_cases import LAYOUTS, REAL, assert_same_bits, random_inputs
from tests.helpers.support_cases import support_contract
from tp_logprob.kernels.builtin import TORCH_NATIVE
from tp_logprob.kernels.native import torch_native_logprob
from tp_logprob.row_groups import row_groups

MASK = np.array([True, True, False, True, True, True, True, True])
TEMPERATURES = (0.7, 0.0, 1.3, 0.7, 0.0, 1.0, 0.7, 2.0)
SUPPORT = tpl.SupportSpec(
    top_k=[4, 2, None, 4, None, None, 4, 6],
    top_p=[None, 0.5, 0.8, None, None, 0.9, None, 0.9],
    min_p=[0.01, None, None, 0.01, None, None, 0.01, None],
)
OUTPUTS = ("selected_logp", "lse", "entropy", "support_lse", "support_size", "support_threshold")


def _mixed(layout: str, **changes: object) -> tpl.LogprobContract:
    contract = support_contract(
        LAYOUTS[layout], SUPPORT, num_tokens=8, active_mask=MASK, entropy=True
    )
    return dataclasses.replace(contract, temperature=TEMPERATURES, **changes)


def _run(logits: torch.Tensor, targets: torch.Tensor, contract: tpl.LogprobContract):  # type: ignore[no-untyped-def]
    return tpl.run_tp(torch_native_logprob, logits, targets, contract)[0]


@pytest.mark.parametrize("layout", ["tp1", "tp3-uneven", "tp4-width1-padding"])
def test_each_row_has_the_bits_of_its_group_alone(layout: str) -> None:
    logits, targets = random_inputs(11, 8, active_mask=MASK)
    contract = _mixed(layout)
    mixed = _run(logits, targets, contract)
    groups = row_groups(contract)
    assert [group.rows.tolist() for group in groups] == [[0, 3, 6], [1, 4], [2], [5], [7]]
    for group in groups:
        rows = torch.from_numpy(group.rows)
        alone = _run(logits[rows], targets[rows], group.contract)
        for name in OUTPUTS:
            assert_same_bits(getattr(mixed, name)[rows], getattr(alone, name), name)


def test_a_greedy_row_is_the_raw_op_at_temperature_one() -> None:
    """Rows 1 and 4 are greedy; row 1's request named top_k=2 and top_p=0.5, both off."""
    logits, targets = random_inputs(12, 8, active_mask=MASK)
    mixed = _run(logits, targets, _mixed("tp3-uneven"))
    raw_contract = support_contract(
        LAYOUTS["tp3-uneven"], None, num_tokens=8, active_mask=MASK, entropy=True
    )
    raw = _run(logits, targets, raw_contract)
    for row in (1, 4):
        for name in ("selected_logp", "lse", "entropy"):
            assert_same_bits(getattr(mixed, name)[row], getattr(raw, name)[row], name)
        assert_same_bits(mixed.support_lse[row], raw.lse[row], "support_lse")
        assert mixed.support_size[row].item() == REAL


def test_per_row_temperature_without_a_support_divides_each_row_by_its_own() -> None:
    logits, targets = random_inputs(13, 8, active_mask=MASK)
    contract = dataclasses.replace(_mixed("tp2-padding-shard"), support=None)
    mixed = _run(logits, targets, contract)
    assert mixed.support_lse is None
    for row, temperature in enumerate(TEMPERATURES):
        alone_contract = support_contract(
            LAYOUTS["tp2-padding-shard"],
            None,
            num_tokens=1,
            active_mask=MASK[row : row + 1],
            entropy=True,
            temperature=temperature or 1.0,
        )
        alone = _run(logits[row : row + 1], targets[row : row + 1], alone_contract)
        assert_same_bits(mixed.selected_logp[row : row + 1], alone.selected_logp, f"row {row}")


def test_a_replayed_mask_takes_per_row_temperatures() -> None:
    logits, targets = random_inputs(14, 8, active_mask=MASK)
    kept = [[0, 3, 5], [1, 2], [4], [0, 1, 2, 3], [7], [3, 9], [2, 8, 11], [6]]
    targets = torch.tensor([row[0] for row in kept])
    contract = dataclasses.replace(_mixed("tp1"), support=tpl.SupportSpec.from_kept_lists(kept))
    mixed = _run(logits, targets, contract)
    assert mixed.support_size.tolist() == [len(row) for row in kept]
    assert len(row_groups(contract)) == 4  # T in {0.7, 1 (greedy and 1.0), 1.3, 2.0}


def test_gradients_reach_the_trainers_3d_tensor_through_the_shift_slice() -> None:
    """A trainer's logits ``[B, T + 1, V]``, shifted (``[:, :-1]``, a non-contiguous view) and
    flattened: the gradient lands on the leaf it holds, row for row the groups' own."""
    logits, targets = random_inputs(15, 8, active_mask=MASK)
    leaf = torch.zeros(2, 5, logits.shape[1]).index_put(
        (torch.arange(2)[:, None], torch.arange(4)[None, :]), logits.view(2, 4, -1)
    )
    leaf.requires_grad_(True)
    shifted = leaf[:, :-1]
    assert not shifted.is_contiguous()
    contract = _mixed("tp1", role="train")
    result = torch_native_logprob(shifted.reshape(8, -1), targets, contract)
    (result.selected_logp.sum() + 0.5 * result.entropy.sum()).backward()
    assert leaf.grad is not None
    assert torch.equal(leaf.grad[:, -1], torch.zeros_like(leaf.grad[:, -1]))
    expected = torch.zeros(8, logits.shape[1])
    for group in row_groups(contract):
        rows = torch.from_numpy(group.rows)
        own = logits[rows].clone().requires_grad_(True)
        alone = torch_native_logprob(own, targets[rows], group.contract)
        (alone.selected_logp.sum() + 0.5 * alone.entropy.sum()).backward()
        expected[rows] = own.grad
    assert_same_bits(leaf.grad[:, :-1].reshape(8, -1), expected, "gradient")


def test_dispatch_refuses_a_heterogeneous_batch_without_row_parameters() -> None:
    contract = _mixed("tp1")
    assert TORCH_NATIVE.supports(contract)
    refusing = dataclasses.replace(TORCH_NATIVE, supports_row_parameters=False)
    reasons = refusing.incompatibilities(contract)
    assert any("supports_row_parameters=False" in reason for reason in reasons), reasons
    assert refusing.supports(dataclasses.replace(contract, temperature=0.7, support=None))


def test_a_heterogeneous_batch_with_bad_inputs_is_refused_for_the_whole_batch() -> None:
    logits, targets = random_inputs(16, 7)
    with pytest.raises(tpl.LogprobContractError, match="num_tokens"):
        torch_native_logprob(logits, targets, _mixed("tp1"))


def test_an_empty_heterogeneous_batch_gives_empty_outputs() -> None:
    contract = dataclasses.replace(
        support_contract(LAYOUTS["tp1"], None, num_tokens=0), temperature=()
    )
    result = torch_native_logprob(torch.zeros(0, 24), torch.zeros(0, dtype=torch.int64), contract)
    assert result.selected_logp.shape == (0,) and result.lse.shape == (0,)
