"""The glue every adapter shares: the sign of zero, the LSE of special rows, input copies."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tp_logprob.peers._glue import claiming, lse_from_max, private_copy, selected_from_loss
from tp_logprob.peers.megatron import CAPABILITY

INF, NAN = float("inf"), float("nan")


def _bits(tensor: torch.Tensor) -> list[int]:
    return tensor.float().view(torch.int32).tolist()


def test_a_zero_loss_gives_positive_zero() -> None:
    loss = torch.tensor([0.0, -0.0, 1.5, -2.0, INF])
    assert _bits(selected_from_loss(loss)) == _bits(torch.tensor([0.0, 0.0, -1.5, 2.0, -INF]))
    assert _bits(-loss[:1]) != _bits(selected_from_loss(loss[:1]))  # what -loss would give


def test_a_nan_loss_stays_nan() -> None:
    assert torch.isnan(selected_from_loss(torch.tensor([NAN]))).all()


@pytest.mark.parametrize(
    ("row_max", "log_sum", "expected"),
    [
        (3.0, 0.5, 3.5),
        (INF, NAN, INF),  # a +inf logit: x - M is NaN, the contract says +inf
        (-INF, NAN, -INF),  # no finite live logit: the contract says -inf
        (NAN, 0.0, NAN),
    ],
    ids=["finite", "+inf max", "-inf max", "nan max"],
)
def test_lse_from_max_on_special_rows(row_max: float, log_sum: float, expected: float) -> None:
    lse = lse_from_max(torch.tensor([row_max]), torch.tensor([log_sum]))
    assert lse.dtype == torch.float32
    torch.testing.assert_close(lse, torch.tensor([expected]), equal_nan=True)


def test_private_copy_is_separate_and_differentiable() -> None:
    logits = torch.randn(2, 3, requires_grad=True)
    copy = private_copy(logits)
    assert copy.data_ptr() != logits.data_ptr()
    (copy * 2).sum().backward()
    assert torch.equal(logits.grad, torch.full((2, 3), 2.0))


def test_claiming_changes_only_the_claim_and_the_id() -> None:
    op = object()
    variant_op, capability = claiming(
        (op, CAPABILITY), "assume_padding", supports_vocab_padding=True
    )
    assert variant_op is op
    assert capability.backend_id == "megatron_vp_ce.assume_padding"
    assert (
        dataclasses.replace(
            capability, backend_id=CAPABILITY.backend_id, supports_vocab_padding=False
        )
        == CAPABILITY
    )
