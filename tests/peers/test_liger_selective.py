"""Liger's fused_selective_log_softmax adapter against torch on small cases; skipped without Liger.

On CPU the kernel runs under the Triton interpreter (``TRITON_INTERPRET=1``, as the test
sessions set it). The property suite judges the adapter thoroughly; these tests pin
values, the temperature, the mask, 16-bit inputs, untouched inputs, that nothing flows
back, and the leading -inf block (a peer bug,
docs/repro_liger_selective_leading_neg_inf_block.py).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

import tp_logprob as tpl
from tests.helpers.contracts import whole_vocabulary_contract
from tp_logprob.peers import liger_selective

INF = float("inf")
VOCAB, TOKENS = 37, 5


def _op() -> Any:
    pytest.importorskip("liger_kernel.ops.grpo_loss")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Liger's Triton kernel runs on CPU only with TRITON_INTERPRET=1")
    return liger_selective.honest[0]


def _logits(seed: int) -> torch.Tensor:
    return torch.randn(TOKENS, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_torch_and_leaves_inputs_alone(temperature: float) -> None:
    op = _op()
    logits, targets = _logits(1), torch.tensor([0, 5, 36, 17, 2])
    before = (logits.clone(), targets.clone(), logits._version)
    contract = whole_vocabulary_contract(VOCAB, TOKENS, temperature=temperature)
    result = tpl.run_tp(op, logits, targets, contract)[0]
    z = logits / torch.tensor(temperature, dtype=torch.float32)
    expected = torch.log_softmax(z, dim=1).gather(1, targets[:, None])[:, 0]
    torch.testing.assert_close(result.selected_logp, expected)
    torch.testing.assert_close(result.lse, torch.logsumexp(z, dim=1))
    assert torch.equal(logits, before[0]) and torch.equal(targets, before[1])
    assert logits._version == before[2]


def test_inactive_rows_are_zero_and_their_targets_never_read() -> None:
    op = _op()
    logits, targets = _logits(2), torch.tensor([3, -100, 2**40, 7, 1])
    active = [True, False, False, True, True]
    contract = whole_vocabulary_contract(
        VOCAB, TOKENS, mask=tpl.MaskSpec(TOKENS, active_mask=active)
    )
    result = tpl.run_tp(op, logits, targets, contract)[0]
    for row in (1, 2):
        value = result.selected_logp[row]
        assert value.item() == 0.0 and not value.signbit()
    kept = [0, 3, 4]
    logp = torch.log_softmax(logits[kept], dim=1)
    torch.testing.assert_close(
        result.selected_logp[kept], logp.gather(1, targets[kept, None])[:, 0]
    )
    torch.testing.assert_close(result.lse, torch.logsumexp(logits, dim=1))


def test_16bit_logits_are_taken_in_fp32() -> None:
    op = _op()
    logits, targets = _logits(3).half(), torch.tensor([1, 2, 3, 4, 5])
    contract = whole_vocabulary_contract(VOCAB, TOKENS, dtype="fp16")
    result = tpl.run_tp(op, logits, targets, contract)[0]
    expected = torch.log_softmax(logits.float(), dim=1).gather(1, targets[:, None])[:, 0]
    assert result.selected_logp.dtype == torch.float32
    torch.testing.assert_close(result.selected_logp, expected)


def test_nothing_flows_back() -> None:
    """Why the capability claims infer only: the function runs under torch.no_grad."""
    op = _op()
    logits = _logits(4).requires_grad_()
    result = op(logits, torch.arange(TOKENS), whole_vocabulary_contract(VOCAB, TOKENS))
    assert not result.selected_logp.requires_grad


def test_pins_a_leading_block_of_neg_inf() -> None:
    op = _op()
    logits = torch.zeros(2, 4096)
    logits[0, :2048] = -INF
    logits[1, :2047] = -INF
    result = tpl.run_tp(op, logits, torch.tensor([4095, 4095]), whole_vocabulary_contract(4096, 2))
    assert torch.isnan(result[0].selected_logp[0])
    torch.testing.assert_close(result[0].selected_logp[1], torch.log_softmax(logits[1], 0)[-1])


def test_refuses_a_cpu_run_without_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    contract = whole_vocabulary_contract(VOCAB, TOKENS)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        liger_selective.honest[0](_logits(0), torch.arange(TOKENS), contract)
