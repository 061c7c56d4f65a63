"""Liger's vocab-parallel cross entropy adapter: what its glue and capability rest on.

Needs liger-kernel 0.8.1 or later and, on CPU, ``TRITON_INTERPRET=1`` (``nox -s
conformance``); skipped otherwise.
"""

from __future__ import annotations

import os

import pytest
import torch

import tp_logprob as tpl
from tp_logprob.errors import LogprobContractError

pytest.importorskip("liger_kernel.transformers.vocab_parallel_cross_entropy")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip(
        "Liger's Triton kernels run on CPU only with TRITON_INTERPRET=1", allow_module_level=True
    )

from tp_logprob.peers import liger_vocab_parallel as adapter


def _contract(
    tp: int = 1, dtype: str = "fp32", ignore_index: int = -100, active: list[bool] | None = None
) -> tpl.LogprobContract:
    sharding = tpl.ShardingSpec(0, tp, tpl.even_shard_bounds(8, tp), 8, 8)
    return tpl.LogprobContract(
        "infer",
        dtype,
        tpl.MaskSpec(3, active, ignore_index=ignore_index),
        sharding,
        tpl.ReductionSpec("fixed_topology"),
    )


def _logits(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.linspace(-5.0, 6.0, 24).reshape(3, 8).sin().mul(7.0).to(dtype)


def test_both_smoothing_modes_give_the_same_bits_without_smoothing() -> None:
    logits, targets = _logits(), torch.tensor([0, 5, 7])
    global_loss = adapter.liger_loss(logits, targets, None, mode="global")
    partition_loss = adapter.liger_loss(logits, targets, None, mode="partition")
    assert torch.equal(global_loss, partition_loss)
    result = adapter.honest[0](logits, targets, _contract())
    assert torch.equal(result.selected_logp, 0.0 - global_loss)


def test_the_contracts_ignore_index_is_the_one_liger_skips() -> None:
    logits, targets = _logits(), torch.tensor([3, -3, -100])
    loss = adapter.liger_loss(logits, targets, None, ignore_index=-3)
    result = adapter.honest[0](
        logits, torch.tensor([3, -3, 2]), _contract(ignore_index=-3, active=[True, False, True])
    )
    assert loss[1].item() == 0.0 and loss[2].item() > 0.0  # -100 is no longer skipped
    assert result.selected_logp[1].item() == 0.0
    assert not torch.signbit(result.selected_logp[1])
    expected = torch.log_softmax(logits, dim=1).gather(1, torch.tensor([[3], [0], [2]]))[:, 0]
    torch.testing.assert_close(result.selected_logp[[0, 2]], expected[[0, 2]])
    torch.testing.assert_close(result.lse, torch.logsumexp(logits, dim=1))


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_16_bit_logits_are_read_as_fp32(dtype: str) -> None:
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    logits, targets = _logits(torch_dtype), torch.tensor([1, 6, 3])
    result = adapter.honest[0](logits, targets, _contract(dtype=dtype))
    wide = logits.float()
    expected = torch.log_softmax(wide, dim=1).gather(1, targets[:, None])[:, 0]
    assert result.selected_logp.dtype == torch.float32
    torch.testing.assert_close(result.selected_logp, expected, rtol=1e-6, atol=1e-6)


def test_an_out_of_range_target_is_read_as_off_rank_not_refused() -> None:
    """The peer limitation behind the inactive-tokens variant: no bounds check."""
    logits = _logits()
    loss = adapter.liger_loss(logits, torch.tensor([1, 2**40, -7]), None)
    shifted = torch.logsumexp(logits[1:], dim=1) - logits[1:].amax(dim=1)  # target logit "0"
    torch.testing.assert_close(loss[1:], shifted)


def test_an_emulated_group_above_one_rank_is_refused() -> None:
    with pytest.raises(LogprobContractError, match="real process group"):
        tpl.run_tp(adapter.library[0], _logits(), torch.tensor([0, 1, 2]), _contract(tp=2))


def test_without_the_interpreter_on_cpu_it_says_how_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU runs the kernels without the interpreter")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        adapter.liger_loss(_logits(), torch.tensor([0, 1, 2]), None)
