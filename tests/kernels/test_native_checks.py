"""torch_native input checking: every bad input raises LogprobContractError before any work."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import tp_logprob as tpl
from tests.helpers.native_cases import LAYOUTS, REAL, assert_same_bits, make_contract, random_inputs
from tp_logprob.emulate import run_tp
from tp_logprob.kernels.native import torch_native_logprob

BOUNDS = LAYOUTS["tp2-width1"]  # rank 1 holds columns [1, 24), 23 wide


class SpyGroup:
    """A rank-1-of-2 group that records whether any collective was attempted."""

    rank, world_size = 1, 2

    def __init__(self) -> None:
        self.calls = 0

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        self.calls += 1
        return [tensor, tensor]


def rank1_inputs() -> tuple[torch.Tensor, torch.Tensor, tpl.LogprobContract]:
    logits, targets = random_inputs(0, 4)
    return logits[:, 1:].contiguous(), targets, make_contract(BOUNDS, num_tokens=4).with_rank(1)


Mutation = Callable[[torch.Tensor, torch.Tensor, tpl.LogprobContract, Any], tuple[Any, ...]]

BAD_INPUTS: dict[str, tuple[Mutation, str]] = {
    "width-too-wide": (
        lambda x, t, c, g: (torch.cat((x, x[:, :1]), dim=1), t, c, g),
        r"width 24 != rank 1's shard width 23",
    ),
    "full-logits-instead-of-shard": (
        lambda x, t, c, g: (torch.zeros(4, 24), t, c, g),
        r"width 24 != rank 1's shard width 23 \(vocab_shard_bounds\[1\]=\(1, 24\)\)",
    ),
    "wrong-rows": (lambda x, t, c, g: (x[:3], t, c, g), r"3 rows != mask.num_tokens=4"),
    "three-dims": (lambda x, t, c, g: (x[None], t, c, g), r"expected 2 dims.*\(1, 4, 23\)"),
    "numpy-logits": (lambda x, t, c, g: (x.numpy(), t, c, g), r"expected a torch.Tensor"),
    "fp64-logits": (lambda x, t, c, g: (x.double(), t, c, g), r"dtype=torch.float64.*'fp32'"),
    "bf16-logits-fp32-contract": (
        lambda x, t, c, g: (x.bfloat16(), t, c, g),
        r"local_logits.dtype=torch.bfloat16",
    ),
    "targets-2d": (lambda x, t, c, g: (x, t[:, None], c, g), r"targets: shape \(4, 1\)"),
    "targets-short": (lambda x, t, c, g: (x, t[:3], c, g), r"targets: shape \(3,\)"),
    "float-targets": (lambda x, t, c, g: (x, t.float(), c, g), r"targets.dtype=torch.float32"),
    "int16-targets": (lambda x, t, c, g: (x, t.short(), c, g), r"targets.dtype=torch.int16"),
    "list-targets": (lambda x, t, c, g: (x, t.tolist(), c, g), r"targets: expected a torch"),
    "active-target-is-padding": (
        lambda x, t, c, g: (x, torch.tensor([0, 1, REAL, 2]), c, g),
        rf"targets\[2\]={REAL}: active target outside \[0, real_vocab_size={REAL}\)",
    ),
    "active-target-negative": (
        lambda x, t, c, g: (x, torch.tensor([-1, 1, 2, 3]), c, g),
        r"targets\[0\]=-1: active target outside",
    ),
    "active-target-ignore-index": (
        lambda x, t, c, g: (x, torch.tensor([0, -100, 2, 3]), c, g),
        r"targets\[1\]=-100",
    ),
    "group-none-at-tp2": (lambda x, t, c, g: (x, t, c, None), r"group=None.*tp_world_size=2"),
    "group-rank-mismatch": (
        lambda x, t, c, g: (x, t, c.with_rank(0), g),
        r"group \(rank=1, world_size=2\) disagrees.*tp_rank=0",
    ),
    "contract-is-a-dict": (lambda x, t, c, g: (x, t, c.to_dict(), g), r"contract=.*expected a"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_raises_before_any_collective(case: str) -> None:
    mutate, message = BAD_INPUTS[case]
    spy = SpyGroup()
    logits, targets, contract = rank1_inputs()
    args = mutate(logits, targets, contract, spy)
    with pytest.raises(tpl.LogprobContractError, match=message):
        torch_native_logprob(*args)
    assert spy.calls == 0


def test_group_world_size_mismatch_names_both() -> None:
    logits, targets, _ = rank1_inputs()
    contract = make_contract(LAYOUTS["tp3-uneven"], num_tokens=4).with_rank(1)
    with pytest.raises(tpl.LogprobContractError, match=re.escape("world_size=2")):
        torch_native_logprob(logits[:, :1], targets, contract, SpyGroup())


def test_bad_input_under_run_tp_raises_on_every_rank_without_hanging() -> None:
    contract = make_contract(LAYOUTS["tp4-even"], num_tokens=2)
    logits, _ = random_inputs(0, 2)
    with pytest.raises(tpl.LogprobContractError, match=r"targets\[1\]=19"):
        run_tp(torch_native_logprob, logits, torch.tensor([0, 19]), contract, timeout=5.0)


def test_non_contiguous_inputs_give_the_contiguous_bits() -> None:
    mask = np.array([True, True, False, True, True, True])
    contract = make_contract(LAYOUTS["tp3-uneven"], num_tokens=6, active_mask=mask, dtype="bf16")
    logits, targets = random_inputs(6, 6, dtype="bf16", active_mask=mask)
    want = run_tp(torch_native_logprob, logits, targets, contract)[0]
    column_major = logits.t().contiguous().t()
    strided_targets = torch.stack((targets, targets), dim=1)[:, 0]
    assert not column_major.is_contiguous() and not strided_targets.is_contiguous()
    got = run_tp(torch_native_logprob, column_major, strided_targets, contract)[0]
    assert_same_bits(got.selected_logp, want.selected_logp, "selected")
    assert_same_bits(got.lse, want.lse, "lse")


def test_int32_targets_give_the_int64_bits() -> None:
    contract = make_contract(LAYOUTS["tp4-even"], num_tokens=5)
    logits, targets = random_inputs(12, 5)
    want = run_tp(torch_native_logprob, logits, targets, contract)[0]
    got = run_tp(torch_native_logprob, logits, targets.int(), contract)[0]
    assert_same_bits(got.selected_logp, want.selected_logp, "selected")
