"""verl's fused LM-head adapter against torch in float64 on tiny cases; skipped without verl.

The adapter takes hidden states and weight rows (``input_kind="hidden"``) and runs
``FusedLinearForPPO``'s torch path; only the argument checks run without verl. The
property suite judges the adapter thoroughly; these tests pin values, the LSE glue,
the temperature, entropy, untouched inputs, gradients, and that the Triton path
cannot run on CPU.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

import pytest
import torch

import tp_logprob as tpl
from tests.helpers.contracts import whole_vocabulary_contract, whole_vocabulary_hidden_contract
from tp_logprob.peers import verl_fused

VOCAB, SIZE, TOKENS = 19, 16, 6


def _op() -> Any:
    pytest.importorskip("verl.utils.experimental.torch_functional")
    return verl_fused.honest[0]


def _contract(role: str = "infer", **fields: Any) -> tpl.LogprobContract:
    return whole_vocabulary_hidden_contract(VOCAB, SIZE, TOKENS, role, **fields)


def _case(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(TOKENS, SIZE, generator=gen)
    hidden[1] = 0.0  # a row of ties
    hidden[4] *= 30.0  # a peaked row
    weight = torch.randn(VOCAB, SIZE, generator=gen) * 0.5
    return hidden, weight, torch.randint(0, VOCAB, (TOKENS,), generator=gen)


def _tempered(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    return (hidden.double() @ weight.double().T) / temperature


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_matches_float64_torch_and_leaves_inputs_alone(temperature: float) -> None:
    op = _op()
    hidden, weight, targets = _case(seed=3)
    before = [t.clone() for t in (hidden, weight, targets)]
    contract = _contract(temperature=temperature, export_entropy=True)
    result = tpl.run_tp_hidden(op, hidden, weight, targets, contract)[0]
    z = _tempered(hidden, weight, temperature)
    logp = torch.log_softmax(z, dim=1)
    expected = logp.gather(1, targets[:, None])[:, 0]
    torch.testing.assert_close(result.selected_logp.double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(result.lse.double(), torch.logsumexp(z, dim=1), rtol=1e-6, atol=0)
    entropy = -(logp.exp() * logp).sum(dim=1)
    torch.testing.assert_close(result.entropy.double(), entropy, rtol=1e-5, atol=1e-5)
    assert result.selected_logp.dtype == result.lse.dtype == torch.float32
    for now, then in zip((hidden, weight, targets), before, strict=True):
        assert torch.equal(now, then)


def test_gradients_reach_hidden_and_weight() -> None:
    op = _op()
    hidden, weight, targets = _case(seed=8)
    hidden.requires_grad_()
    weight.requires_grad_()
    result = tpl.run_tp_hidden(op, hidden, weight, targets, _contract("train"))[0]
    result.selected_logp.sum().backward()
    h, w = hidden.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    torch.log_softmax(h @ w.T, dim=1).gather(1, targets[:, None]).sum().backward()
    torch.testing.assert_close(hidden.grad.double(), h.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(weight.grad.double(), w.grad, rtol=1e-4, atol=1e-5)


def test_16bit_logits_are_formed_in_the_input_dtype() -> None:
    """What assume_16bit claims away: the matmul's bf16 output is the softmax's input."""
    op, _ = verl_fused.assume_16bit
    _op()
    hidden, weight, targets = (t.bfloat16() if t.is_floating_point() else t for t in _case(4))
    result = op(hidden, targets, _contract(dtype="bf16"), weight=weight)
    logits = (hidden @ weight.T).float()
    expected = torch.log_softmax(logits, dim=1).gather(1, targets[:, None])[:, 0]
    if tuple(map(int, version("verl").split(".")[:2])) < (0, 8):  # the logprob: cast to bf16
        expected = expected.bfloat16().float()
    assert torch.equal(result.selected_logp, expected)


def test_an_out_of_range_target_raises() -> None:
    """What assume_inactive_tokens claims away: every label is gathered."""
    op, _ = verl_fused.assume_inactive_tokens
    _op()
    hidden, weight, targets = _case(seed=1)
    targets[2] = 1 << 40
    active = [True] * TOKENS
    active[2] = False
    with pytest.raises((IndexError, RuntimeError)):
        op(hidden, targets, _contract(mask=tpl.MaskSpec(TOKENS, active_mask=active)), weight=weight)


def test_the_triton_path_cannot_run_on_cpu() -> None:
    """Why the report has no column for verl's Triton linear_cross_entropy."""
    pytest.importorskip("verl.utils.kernel.linear_cross_entropy")
    if torch.cuda.is_available():
        pytest.skip("a GPU runs the Triton path")
    function = verl_fused.triton_linear_cross_entropy()
    hidden, weight, targets = _case(seed=2)
    with pytest.raises(RuntimeError, match="NVTX"):
        function(hidden, weight, targets, 1.0, "none", None)


def test_bad_inputs_are_refused_before_the_library_runs() -> None:
    op = verl_fused.honest[0]
    hidden, weight, targets = _case(seed=0)
    with pytest.raises(tpl.LogprobContractError, match="weights alone"):
        op(hidden, targets, _contract(has_bias=True), weight=weight, bias=torch.zeros(VOCAB))
    with pytest.raises(tpl.LogprobContractError, match="weight: shape"):
        op(hidden, targets, _contract(), weight=weight[:-1])
    logits_contract = whole_vocabulary_contract(VOCAB, TOKENS)
    with pytest.raises(tpl.LogprobContractError, match="input_kind='logits'"):
        op(hidden, targets, logits_contract, weight=weight)
