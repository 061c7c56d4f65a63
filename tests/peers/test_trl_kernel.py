"""TRL's Triton logprob-and-entropy adapter against torch on small cases; skipped without trl.

On CPU the kernel runs under the Triton interpreter (``TRITON_INTERPRET=1``, as the
test sessions set it). The property suite judges the adapter thoroughly; these tests
pin values, the temperature, the entropy, the row mask, 16-bit inputs, untouched
inputs, gradients and the two peer bugs (docs/repro_trl_kernel_*.py).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

import tp_logprob as tpl
from tests.helpers.contracts import whole_vocabulary_contract
from tp_logprob.peers import trl_kernel

INF = float("inf")
VOCAB, TOKENS = 37, 5


def _op() -> Any:
    pytest.importorskip("trl.kernels")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("TRL's Triton kernel runs on CPU only with TRITON_INTERPRET=1")
    return trl_kernel.honest[0]


def _logits(seed: int, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randn(TOKENS, vocab, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
def test_matches_torch_and_leaves_inputs_alone(temperature: float) -> None:
    op = _op()
    logits, targets = _logits(1), torch.tensor([0, 5, 36, 17, 2])
    before = (logits.clone(), targets.clone(), logits._version)
    contract = whole_vocabulary_contract(
        VOCAB, TOKENS, temperature=temperature, export_entropy=True
    )
    result = tpl.run_tp(op, logits, targets, contract)[0]
    z = logits / torch.tensor(temperature, dtype=torch.float32)
    logp = torch.log_softmax(z, dim=1)
    torch.testing.assert_close(result.selected_logp, logp.gather(1, targets[:, None])[:, 0])
    torch.testing.assert_close(result.lse, torch.logsumexp(z, dim=1))
    torch.testing.assert_close(result.entropy, -(logp.exp() * logp).sum(dim=1))
    assert torch.equal(logits, before[0]) and torch.equal(targets, before[1])
    assert logits._version == before[2]


def test_inactive_rows_are_zero_and_their_targets_never_read() -> None:
    """The contract's mask goes in as row_mask: an inactive row's target may be anything,
    its logprob and entropy are +0.0, and its LSE is still the row's."""
    op = _op()
    logits, targets = _logits(2), torch.tensor([3, -100, 2**40, 7, 1])
    active = [True, False, False, True, True]
    contract = whole_vocabulary_contract(
        VOCAB, TOKENS, mask=tpl.MaskSpec(TOKENS, active_mask=active), export_entropy=True
    )
    result = tpl.run_tp(op, logits, targets, contract)[0]
    for row in (1, 2):
        for value in (result.selected_logp[row], result.entropy[row]):
            assert value.item() == 0.0 and not value.signbit()
    logp = torch.log_softmax(logits, dim=1)
    kept = [0, 3, 4]
    torch.testing.assert_close(
        result.selected_logp[kept], logp[kept].gather(1, targets[kept, None])[:, 0]
    )
    torch.testing.assert_close(result.lse, torch.logsumexp(logits, dim=1))


def test_16bit_logits_are_taken_in_fp32() -> None:
    op = _op()
    logits, targets = _logits(3).bfloat16(), torch.tensor([1, 2, 3, 4, 5])
    contract = whole_vocabulary_contract(VOCAB, TOKENS, dtype="bf16", export_entropy=True)
    result = tpl.run_tp(op, logits, targets, contract)[0]
    logp = torch.log_softmax(logits.float(), dim=1)
    assert result.selected_logp.dtype == torch.float32
    torch.testing.assert_close(result.selected_logp, logp.gather(1, targets[:, None])[:, 0])
    torch.testing.assert_close(result.entropy, -(logp.exp() * logp).sum(dim=1))


def test_gradients_reach_the_callers_logits_and_skip_inactive_rows() -> None:
    op = _op()
    logits = _logits(4).requires_grad_()
    targets = torch.tensor([0, 7, 3, 4, 9])
    active = [True, True, False, True, True]
    contract = whole_vocabulary_contract(
        VOCAB, TOKENS, "train", mask=tpl.MaskSpec(TOKENS, active_mask=active), temperature=0.8
    )
    result = tpl.run_tp(op, logits, targets, contract)[0]
    upstream = torch.linspace(-1.0, 2.0, TOKENS)
    (result.selected_logp * upstream).sum().backward()
    reference = logits.detach().clone().requires_grad_()
    logp = torch.log_softmax(reference / 0.8, dim=1).gather(1, targets[:, None])[:, 0]
    (logp * upstream * torch.tensor(active)).sum().backward()
    assert logits.grad is not None
    torch.testing.assert_close(logits.grad, reference.grad)
    assert torch.equal(logits.grad[2], torch.zeros(VOCAB))


def test_pins_the_entropy_beside_a_neg_inf_logit() -> None:
    """0 * -inf in the kernel's weighted sum: NaN where the entropy is log 2 (a peer bug,
    docs/repro_trl_kernel_entropy_neg_inf.py); the logprob is right."""
    op = _op()
    logits = torch.tensor([[0.0, -INF, 0.0]])
    contract = whole_vocabulary_contract(3, 1, export_entropy=True)
    result = tpl.run_tp(op, logits, torch.tensor([0]), contract)[0]
    assert torch.isnan(result.entropy).all()
    torch.testing.assert_close(result.selected_logp, torch.log(torch.tensor([0.5])))


def test_pins_a_leading_block_of_neg_inf() -> None:
    """The online softmax starts from -inf: a row whose first 1024 columns are -inf is
    NaN, one column fewer is right (a peer bug, docs/repro_trl_kernel_leading_neg_inf_block.py)."""
    op = _op()
    logits = torch.zeros(2, 2048)
    logits[0, :1024] = -INF
    logits[1, :1023] = -INF
    contract = whole_vocabulary_contract(2048, 2)
    result = tpl.run_tp(op, logits, torch.tensor([2047, 2047]), contract)[0]
    assert torch.isnan(result.selected_logp[0])
    torch.testing.assert_close(result.selected_logp[1], torch.log_softmax(logits[1], 0)[-1])


def test_refuses_a_cpu_run_without_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    contract = whole_vocabulary_contract(VOCAB, TOKENS)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        trl_kernel.honest[0](_logits(0), torch.arange(TOKENS), contract)
