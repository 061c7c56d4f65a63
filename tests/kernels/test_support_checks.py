"""A replayed support at the op: an active target outside its row's kept ids is a
LogprobContractError naming the row, raised before any collective, logits and fused alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tp_logprob as tpl
from tests.helpers.fused_cases import fused_case, fused_contract
from tests.helpers.native_cases import LAYOUTS, random_inputs
from tests.helpers.support_cases import support_contract
from tests.kernels.test_native_checks import SpyGroup
from tp_logprob.kernels.native import torch_native_logprob
from tp_logprob.kernels.native_fused import torch_native_fused_logprob

BOUNDS = LAYOUTS["tp2-width1"]
KEPT = [[0, 3, 5], [1, 2], [7], list(range(2, 14))]


def replayed(rows: list[list[int]] = KEPT) -> tpl.SupportSpec:
    return tpl.SupportSpec.from_kept_lists(rows)


# Each case: targets, active mask, and the message it must raise (None: accepted).
CASES: dict[str, tuple[list[int], list[bool] | None, str | None]] = {
    "every-target-kept": ([3, 2, 7, 13], None, None),
    "first-row-outside": (
        [4, 2, 7, 13],
        None,
        r"targets\[0\]=4: active target outside row 0's replayed support "
        r"\(support.kept_ids\[row 0\]=\[0, 3, 5\]; 1 such active tokens\)",
    ),
    "last-row-long-kept-list": (
        [0, 1, 7, 1],
        None,
        r"targets\[3\]=1: .*row 3's.*=\[2, 3, 4, 5, 6, 7, 8, 9, \.\.\.\]; 1 such",
    ),
    "two-rows-outside": ([3, 0, 6, 13], None, r"targets\[1\]=0: .*2 such active tokens"),
    "another-rows-id": ([7, 2, 7, 13], None, r"targets\[0\]=7"),
    "inactive-row-outside-is-not-read": ([3, -100, 7, 13], [True, False, True, True], None),
    "inactive-target-past-the-vocabulary": ([3, 10_000, 7, 13], [True, False, True, True], None),
}


@pytest.mark.parametrize(("targets", "active", "message"), list(CASES.values()), ids=list(CASES))
def test_active_targets_must_be_kept(
    targets: list[int], active: list[bool] | None, message: str | None
) -> None:
    logits, _ = random_inputs(0, 4)
    contract = support_contract(
        BOUNDS, replayed(), num_tokens=4, active_mask=None if active is None else np.array(active)
    ).with_rank(1)
    group = SpyGroup()
    local = logits[:, 1:].contiguous()
    if message is None:
        torch_native_logprob(local, torch.tensor(targets), contract, group)
        return
    with pytest.raises(tpl.LogprobContractError, match=message):
        torch_native_logprob(local, torch.tensor(targets), contract, group)
    assert group.calls == 0, "raised after a collective"


def test_the_fused_op_checks_its_targets_too() -> None:
    hidden, weight, _, _ = fused_case("fp32", seed=1, num_tokens=4)
    contract = fused_contract(BOUNDS, num_tokens=4, support=replayed()).with_rank(1)
    group = SpyGroup()
    with pytest.raises(tpl.LogprobContractError, match=r"targets\[2\]=6: .*row 2's"):
        torch_native_fused_logprob(
            hidden, torch.tensor([0, 1, 6, 2]), contract, group, weight=weight[1:]
        )
    assert group.calls == 0


def test_the_check_is_vectorised() -> None:
    """Ten thousand rows of a thousand-id vocabulary check in one pass (no per-row loop)."""
    rows, real = 10_000, 1000
    rng = np.random.default_rng(0)
    keep = rng.random((rows, real)) < 0.05
    keep[:, 0] = True
    targets = torch.from_numpy(np.array([rng.choice(np.flatnonzero(row)) for row in keep]))
    contract = support_contract(
        ((0, real),), tpl.SupportSpec.from_mask(keep), num_tokens=rows, real=real
    )
    logits = torch.zeros(rows, real)
    result = torch_native_logprob(logits, targets, contract)
    assert result.support_size.tolist() == keep.sum(axis=1).tolist()
    targets[rows - 1] = int(np.flatnonzero(~keep[-1])[0])
    with pytest.raises(tpl.LogprobContractError, match=rf"targets\[{rows - 1}\]"):
        torch_native_logprob(logits, targets, contract)
