"""Each adapter (and two built-in backends) on every input form a trainer passes.

The op takes any 2-D view (``docs/semantics.md``, "The backward"): on a view with
odd strides, an offset or a transposed layout, every output bit is the one of the
contiguous tensor, and the gradient reaches the buffer the caller holds at the
view's elements and nowhere else. Skipped where an adapter's library is absent.
"""

from __future__ import annotations

import importlib
import os

import pytest
import torch

import tp_logprob as tpl
from tp_logprob.strategies import TARGET_FORMS, VALUE_FORMS, laid_out
from tp_logprob.strategies.input_forms import laid_out_leaf

OPS = [
    pytest.param("liger", "honest", "liger_kernel", 1, id="liger"),
    pytest.param("megatron", "honest", "megatron.core", 3, id="megatron"),
    pytest.param(
        "torch_loss_parallel", "honest", "torch.distributed.tensor", 2, id="loss_parallel"
    ),
    pytest.param("trl", "honest", "trl", 1, id="trl"),
    pytest.param("verl", "honest", "verl.utils.torch_functional", 1, id="verl"),
    pytest.param("verl_naive", "honest", "verl.utils.torch_functional", 1, id="verl_naive"),
    pytest.param("builtin", "torch_native", "torch", 3, id="torch_native"),
    pytest.param("builtin", "triton_online", "triton", 2, id="triton_online"),
]


def _op(module: str, attr: str, library: str) -> object:
    interpreted = module == "liger" or attr.startswith("triton")
    if interpreted and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("a Triton kernel runs on CPU only with TRITON_INTERPRET=1")
    pytest.importorskip(library)
    if module == "builtin":
        contract = _contract("infer", 1)
        return tpl.registry.get_logprob_op(contract, attr, platform="cpu", preflighted=True).op
    return getattr(importlib.import_module(f"tp_logprob.peers.{module}"), attr)[0]


def _contract(role: str, tp: int, rows: int = 5, vocab: int = 12) -> tpl.LogprobContract:
    sharding = tpl.ShardingSpec(0, tp, tpl.even_shard_bounds(vocab, tp), vocab, vocab)
    return tpl.LogprobContract(
        role, "fp32", tpl.MaskSpec(rows), sharding, tpl.ReductionSpec("run_to_run")
    )


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(5, 12, generator=generator) * 3
    return logits, torch.tensor([0, 11, 5, 6, 2])


def _selected(op: object, logits: torch.Tensor, targets: torch.Tensor, tp: int) -> torch.Tensor:
    results = tpl.run_tp(op, logits, targets, _contract("infer", tp))
    return torch.stack([results[0].selected_logp, results[0].lse])


@pytest.mark.parametrize("targets_form", TARGET_FORMS)
@pytest.mark.parametrize("values_form", VALUE_FORMS[1:])
@pytest.mark.parametrize(("module", "attr", "library", "tp"), OPS)
def test_a_view_gives_the_contiguous_bits(
    module: str, attr: str, library: str, tp: int, values_form: str, targets_form: str
) -> None:
    op = _op(module, attr, library)
    logits, targets = _inputs()
    expected = _selected(op, logits, targets, tp)
    view, ids = laid_out(logits, values_form), laid_out(targets, targets_form)
    assert not view.is_contiguous() or view.storage_offset() == 1
    got = _selected(op, view, ids, tp)
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("values_form", VALUE_FORMS[1:])
@pytest.mark.parametrize(("module", "attr", "library", "tp"), OPS)
def test_the_gradient_reaches_the_buffer_behind_a_view(
    module: str, attr: str, library: str, tp: int, values_form: str
) -> None:
    op = _op(module, attr, library)
    logits, targets = _inputs()
    leaf, view = laid_out_leaf(logits, values_form)
    results = tpl.run_tp(op, view, targets, _contract("train", tp))
    sum(result.selected_logp.sum() for result in results).backward()
    reference = logits.clone().requires_grad_()
    torch.log_softmax(reference, dim=1).gather(1, targets[:, None]).sum().backward()
    assert leaf.grad is not None
    seen = leaf.grad.as_strided(view.shape, view.stride(), view.storage_offset())
    torch.testing.assert_close(seen, reference.grad)
    outside = torch.ones_like(leaf, dtype=torch.bool)
    outside.as_strided(view.shape, view.stride(), view.storage_offset()).fill_(False)
    assert torch.equal(leaf.grad[outside], torch.zeros_like(leaf.grad[outside]))
