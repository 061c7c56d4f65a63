"""Liger's chunk_forward adapter against torch in float64 on tiny cases; skipped without Liger.

The adapter takes hidden states, weight rows and a bias (``input_kind="hidden"``) and
runs ``LigerFusedLinearPPOBase.chunk_forward``, the logprobs of Liger's GRPO loss; only
the argument checks run without liger-kernel. The property suite judges the adapter
thoroughly; these tests pin values, the LSE glue, the temperature, untouched inputs,
gradients, the vocabulary chunks and what the variants claim away.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import tp_logprob as tpl
from tests.helpers.contracts import whole_vocabulary_contract, whole_vocabulary_hidden_contract
from tp_logprob.peers import liger_ppo

VOCAB, SIZE, TOKENS = 19, 16, 6


def _op() -> Any:
    pytest.importorskip("liger_kernel.chunked_loss.fused_linear_ppo")
    return liger_ppo.honest[0]


def _contract(role: str = "infer", vocab: int = VOCAB, **fields: Any) -> tpl.LogprobContract:
    return whole_vocabulary_hidden_contract(vocab, SIZE, TOKENS, role, **fields)


def _case(seed: int, vocab: int = VOCAB) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(TOKENS, SIZE, generator=gen)
    hidden[1] = 0.0  # a row of ties on the bias
    hidden[4] *= 30.0  # a peaked row
    weight = torch.randn(vocab, SIZE, generator=gen) * 0.5
    bias = torch.randn(vocab, generator=gen)
    return hidden, weight, bias, torch.randint(0, vocab, (TOKENS,), generator=gen)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_matches_float64_torch_and_leaves_inputs_alone(temperature: float, with_bias: bool) -> None:
    op = _op()
    hidden, weight, bias, targets = _case(seed=3)
    before = [t.clone() for t in (hidden, weight, bias, targets)]
    contract = _contract(temperature=temperature, has_bias=with_bias)
    biases = bias if with_bias else None
    result = tpl.run_tp_hidden(op, hidden, weight, targets, contract, bias=biases)[0]
    x = hidden.double() @ weight.double().T + (bias.double() if with_bias else 0.0)
    expected = torch.log_softmax(x / temperature, dim=1).gather(1, targets[:, None])[:, 0]
    torch.testing.assert_close(result.selected_logp.double(), expected, rtol=1e-5, atol=1e-5)
    lse = torch.logsumexp(x / temperature, dim=1)
    torch.testing.assert_close(result.lse.double(), lse, rtol=1e-6, atol=1e-6)
    assert result.entropy is None
    assert result.selected_logp.dtype == result.lse.dtype == torch.float32
    for now, then in zip((hidden, weight, bias, targets), before, strict=True):
        assert torch.equal(now, then)


def test_a_vocabulary_of_several_chunks() -> None:
    """4096 columns a chunk: a target in the second chunk, and the online logsumexp."""
    op = _op()
    vocab = 4096 + 37
    hidden, weight, _, targets = _case(seed=6, vocab=vocab)
    targets[0], targets[3] = 4096 + 5, 4095
    result = tpl.run_tp_hidden(op, hidden, weight, targets, _contract(vocab=vocab))[0]
    x = hidden.double() @ weight.double().T
    expected = torch.log_softmax(x, dim=1).gather(1, targets[:, None])[:, 0]
    torch.testing.assert_close(result.selected_logp.double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(result.lse.double(), torch.logsumexp(x, 1), rtol=1e-6, atol=1e-6)


def test_gradients_reach_hidden_weight_and_bias() -> None:
    op = _op()
    hidden, weight, bias, targets = _case(seed=8)
    hidden[4] /= 30.0  # keep every softmax weight visible in fp32
    params = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    contract = _contract("train", temperature=0.7, has_bias=True)
    result = tpl.run_tp_hidden(op, params[0], params[1], targets, contract, bias=params[2])[0]
    upstream = torch.linspace(-1.0, 2.0, TOKENS)
    (result.selected_logp * upstream).sum().backward()
    reference = [t.detach().double().requires_grad_() for t in (hidden, weight, bias)]
    z = (reference[0] @ reference[1].T + reference[2]) / 0.7
    logp = torch.log_softmax(z, dim=1).gather(1, targets[:, None])[:, 0]
    (logp * upstream.double()).sum().backward()
    for name, got, want in zip(("hidden", "weight", "bias"), params, reference, strict=True):
        assert got.grad is not None and want.grad is not None
        torch.testing.assert_close(
            got.grad.double(), want.grad, rtol=1e-4, atol=1e-5, msg=f"d {name}"
        )


def test_an_out_of_range_target_is_in_no_chunk() -> None:
    """What assume_inactive_tokens claims away: no mask, and a target outside [0, V)
    adds no logit, so the row's logprob is -lse, not the contract's 0."""
    op, _ = liger_ppo.assume_inactive_tokens
    _op()
    hidden, weight, _, targets = _case(seed=1)
    targets[2] = VOCAB + 3
    active = [True] * TOKENS
    active[2] = False
    contract = _contract(mask=tpl.MaskSpec(TOKENS, active_mask=active))
    result = op(hidden, targets, contract, weight=weight)
    lse = torch.logsumexp(hidden.double() @ weight.double().T, dim=1)
    torch.testing.assert_close(result.selected_logp[2].double(), -lse[2], rtol=1e-5, atol=1e-5)


def test_bad_inputs_are_refused_before_the_library_runs() -> None:
    op = liger_ppo.honest[0]
    hidden, weight, bias, targets = _case(seed=0)
    with pytest.raises(tpl.LogprobContractError, match="has_bias=False"):
        op(hidden, targets, _contract(), weight=weight, bias=bias)
    with pytest.raises(tpl.LogprobContractError, match="weight: shape"):
        op(hidden, targets, _contract(), weight=weight[:-1])
    logits_contract = whole_vocabulary_contract(VOCAB, TOKENS)
    with pytest.raises(tpl.LogprobContractError, match="input_kind='logits'"):
        op(hidden, targets, logits_contract, weight=weight)
