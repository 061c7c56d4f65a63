"""The OpenRLHF actor adapter against torch on small cases; skipped where OpenRLHF is absent.

The property suite judges the adapter thoroughly; these tests pin what its glue
promises: the three installed functions run, the actor's steps (fp32 first, one
division by the temperature before both outputs), values and the entropy, untouched
inputs, gradients, and the entropy's NaN beside a -inf logit (a peer bug,
docs/repro_openrlhf_entropy_neg_inf.py).
"""

from __future__ import annotations

import pytest
import torch

import tp_logprob as tpl
from tests.helpers.contracts import whole_vocabulary_contract
from tp_logprob.peers._installed import installed_file

pytest.importorskip("openrlhf", reason="OpenRLHF is installed by nox -s conformance only")

from tp_logprob.peers import openrlhf_actor

INF = float("inf")


def test_the_functions_run_are_the_installed_files() -> None:
    path = installed_file("openrlhf", "models/utils.py")
    lines = path.read_text().splitlines()
    for name, function in openrlhf_actor.installed_definitions().items():
        code = getattr(function, "__wrapped__", function).__code__  # compute_entropy: compiled
        assert code.co_filename == str(path)
        # A decorated function's first line is its decorator's.
        header = [line for line in lines[code.co_firstlineno - 1 :] if not line.startswith("@")]
        assert header[0].startswith(f"def {name}(")


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_matches_torch_at_the_temperature_and_leaves_inputs_alone(temperature: float) -> None:
    logits = torch.randn(5, 33, generator=torch.Generator().manual_seed(2)) * 4
    targets, before = torch.arange(5) * 3, logits.clone()
    contract = whole_vocabulary_contract(33, 5, temperature=temperature, export_entropy=True)
    result = openrlhf_actor.honest[0](logits, targets, contract)
    z = before / torch.tensor(temperature, dtype=torch.float32)
    logp = torch.log_softmax(z, dim=1)
    torch.testing.assert_close(result.selected_logp, logp.gather(1, targets[:, None])[:, 0])
    torch.testing.assert_close(result.lse, torch.logsumexp(z, dim=1))
    # The entropy of the tempered policy, the one the logprobs describe.
    torch.testing.assert_close(result.entropy, -(logp.exp() * logp).sum(dim=1))
    assert torch.equal(logits, before)


def test_16bit_logits_are_upcast_first() -> None:
    """The actor's .to(torch.float32): a bf16 row's logprob is the fp32 one of its values."""
    logits = (torch.randn(3, 50, generator=torch.Generator().manual_seed(4)) * 3).bfloat16()
    targets = torch.tensor([1, 2, 3])
    contract = whole_vocabulary_contract(50, 3, dtype="bf16", temperature=0.7)
    result = openrlhf_actor.honest[0](logits, targets, contract)
    z = logits.float() / torch.tensor(0.7)
    expected = torch.log_softmax(z, dim=1).gather(1, targets[:, None])[:, 0]
    assert result.selected_logp.dtype == torch.float32
    torch.testing.assert_close(result.selected_logp, expected)


def test_gradients_reach_the_callers_logits() -> None:
    logits = torch.linspace(-2.0, 2.0, 32).reshape(4, 8).requires_grad_()
    targets = torch.tensor([0, 7, 3, 4])
    contract = whole_vocabulary_contract(8, 4, "train", temperature=0.6)
    openrlhf_actor.honest[0](logits, targets, contract).selected_logp.sum().backward()
    reference = logits.detach().clone().requires_grad_()
    z = reference / torch.tensor(0.6, dtype=torch.float32)
    torch.log_softmax(z, dim=1).gather(1, targets[:, None]).sum().backward()
    torch.testing.assert_close(logits.grad, reference.grad)


def test_pins_the_entropy_beside_a_neg_inf_logit() -> None:
    logits = torch.tensor([[0.0, -INF, 0.0], [0.0, 0.0, 0.0]])
    contract = whole_vocabulary_contract(3, 2, export_entropy=True)
    result = openrlhf_actor.honest[0](logits, torch.tensor([0, 1]), contract)
    assert result.entropy is not None
    assert torch.isnan(result.entropy[0])
    torch.testing.assert_close(result.entropy[1], torch.log(torch.tensor(3.0)))


def test_an_out_of_range_target_raises() -> None:
    """What assume_inactive_tokens claims away: every label is gathered."""
    op, _ = openrlhf_actor.assume_inactive_tokens
    contract = whole_vocabulary_contract(4, 2, mask=tpl.MaskSpec(2, active_mask=(True, False)))
    with pytest.raises((IndexError, RuntimeError)):
        op(torch.zeros(2, 4), torch.tensor([1, 1 << 40]), contract)
