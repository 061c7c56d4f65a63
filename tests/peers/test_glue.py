"""The glue every adapter shares: the sign of zero, the LSE of special rows, input copies."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tp_logprob.contract import LogprobDType, MaskMode
from tp_logprob.peers import openrlhf, trl, verl
from tp_logprob.peers._glue import (
    TORCH_HELPER_VARIANTS,
    argmax_logits,
    claiming,
    lse_from_max,
    private_copy,
    selected_from_loss,
    torch_helper_backends,
)
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


def test_a_torch_helpers_variants_claim_one_feature_more_and_no_entropy() -> None:
    backends = torch_helper_backends(len, "helper", supports_temperature=True, exports_entropy=True)
    honest = backends.honest[1]
    assert honest.backend_id == "helper" and honest.supports_temperature and honest.exports_entropy
    assert honest.tp_world_sizes == frozenset({1}) and honest.mask_modes == {MaskMode.ALL_ACTIVE}
    for name in TORCH_HELPER_VARIANTS:
        op, capability = getattr(backends, name)
        assert op is len and capability.backend_id == f"helper.{name}"
        assert not capability.exports_entropy and capability.supports_temperature
    assert backends.assume_padding[1].supports_vocab_padding
    assert backends.assume_16bit[1].dtypes == frozenset(LogprobDType)
    assert backends.assume_inactive_tokens[1].mask_modes == frozenset(MaskMode)


@pytest.mark.parametrize("module", [trl, verl, openrlhf], ids=["trl", "verl", "openrlhf"])
def test_the_torch_helper_adapters_export_their_variants(module: object) -> None:
    exported = set(module.__all__)  # type: ignore[attr-defined]
    assert set(TORCH_HELPER_VARIANTS) <= exported
    for name in exported:
        assert hasattr(module, name), name
    assert module.CAPABILITY is module.honest[1]  # type: ignore[attr-defined]


def test_argmax_logits_is_the_float64_argmax_rounded_once() -> None:
    gen = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(5, 7, generator=gen), torch.randn(11, 7, generator=gen)
    hidden[2, 1] = NAN  # a NaN row: its NaN column, NaN value
    top, value = argmax_logits(hidden, weight)
    exact = hidden.double() @ weight.double().T
    assert top[[0, 1, 3, 4]].tolist() == exact[[0, 1, 3, 4]].argmax(dim=1).tolist()
    assert torch.equal(value[[0, 1, 3, 4]], exact[[0, 1, 3, 4]].amax(dim=1).float())
    assert torch.isnan(value[2])
    empty_top, empty_value = argmax_logits(hidden, weight[:0])
    assert empty_top.tolist() == [0] * 5 and torch.isneginf(empty_value).all()


def test_argmax_logits_adds_the_bias_before_the_argmax() -> None:
    gen = torch.Generator().manual_seed(1)
    hidden, weight = torch.randn(4, 6, generator=gen), torch.randn(9, 6, generator=gen)
    bias = torch.zeros(9)
    bias[7] = 100.0  # every row's argmax is column 7
    top, value = argmax_logits(hidden, weight, bias)
    exact = hidden.double() @ weight.double().T + bias.double()
    assert top.tolist() == [7] * 4
    assert torch.equal(value, exact[:, 7].float())
