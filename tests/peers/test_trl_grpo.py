"""TRL's GRPO trainer's ``_get_per_token_logps`` adapter on the installed release; skipped
without trl.

The adapter calls the trainer's own method on a model that returns the given logits;
these tests hold its logprobs and LSE glue to torch's ``log_softmax``, its gradients
to the caller's logits, and pin the release whose method ignores the temperature
(0.15, a peer bug: docs/history/repro_trl_grpo_temperature.py).
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

import pytest
import torch

import tp_logprob as tpl
from tp_logprob.peers._releases import UnservedReleaseError, parse_release

VOCAB, TOKENS = 9, 5


def _op() -> Any:
    pytest.importorskip("trl")
    from tp_logprob.peers import trl_grpo

    try:
        trl_grpo.SERVED.installed()
    except UnservedReleaseError as refused:  # its refusal is tests/peers/test_releases.py's
        pytest.skip(f"the installed trl is not served: {refused}")
    return trl_grpo.honest[0]


def _contract(role: str = "infer", tokens: int = TOKENS, **fields: Any) -> tpl.LogprobContract:
    sharding = tpl.ShardingSpec(0, 1, ((0, VOCAB),), VOCAB, VOCAB)
    return tpl.LogprobContract(
        role, "fp32", tpl.MaskSpec(tokens), sharding, tpl.ReductionSpec("fixed_topology"), **fields
    )


def _case() -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.randn(TOKENS, VOCAB, generator=torch.Generator().manual_seed(7)) * 2.0
    return logits, torch.tensor([8, 0, 3, 3, 5])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_torch_log_softmax_and_leaves_inputs_alone(temperature: float) -> None:
    op = _op()
    logits, targets = _case()
    before = (logits.clone(), targets.clone())
    result = tpl.run_tp(op, logits, targets, _contract(temperature=temperature))[0]
    # 0.15's method samples at the temperature but scores without it (fixed in 0.16).
    applied = temperature if parse_release(version("trl")) >= (0, 16) else 1.0
    z = logits.double() / applied
    expected = torch.log_softmax(z, dim=1).gather(1, targets[:, None])[:, 0]
    torch.testing.assert_close(result.selected_logp.double(), expected, rtol=1e-5, atol=1e-5)
    assert result.lse is not None
    # The LSE glue divides by the contract's temperature; on 0.15 it reads the method's
    # untempered logprob of the argmax, so it is exact only where they agree.
    if applied == temperature:
        torch.testing.assert_close(result.lse.double(), z.logsumexp(dim=1), rtol=1e-5, atol=1e-5)
    assert torch.equal(logits, before[0]) and torch.equal(targets, before[1])


def test_gradients_reach_the_callers_logits() -> None:
    op = _op()
    logits = torch.linspace(-2.0, 2.0, TOKENS * VOCAB).reshape(TOKENS, VOCAB).requires_grad_()
    targets = torch.tensor([1, 2, 8, 0, 4])
    result = tpl.run_tp(op, logits, targets, _contract("train"))[0]
    result.selected_logp.sum().backward()
    reference = logits.detach().clone().requires_grad_()
    torch.log_softmax(reference, dim=1).gather(1, targets[:, None]).sum().backward()
    torch.testing.assert_close(logits.grad, reference.grad)


def test_no_rows_make_no_call() -> None:
    result = tpl.run_tp(_op(), torch.zeros(0, VOCAB), torch.zeros(0, dtype=torch.long),
                        _contract(tokens=0))[0]  # fmt: skip
    assert (
        result.selected_logp.shape == (0,) and result.lse is not None and result.lse.shape == (0,)
    )
