"""Each adapter against torch's log_softmax on a small case; skipped where its library is absent.

The property suite judges the adapters thoroughly (``nox -s conformance``); these
tests pin what the adapters' glue promises: values, special rows, untouched
inputs, and gradients reaching the caller's logits.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from importlib.metadata import version

import pytest
import torch

import tp_logprob as tpl
from tp_logprob.peers._releases import parse_release

INF = float("inf")

ADAPTERS = [
    pytest.param("liger", "honest", "liger_kernel", 1, id="liger"),
    pytest.param(
        "liger_vocab_parallel",
        "honest",
        "liger_kernel.transformers.vocab_parallel_cross_entropy",
        1,
        id="liger_vocab_parallel",
    ),
    pytest.param("megatron", "honest", "megatron.core", 3, id="megatron"),
    pytest.param("megatron", "equal_shards", "megatron.core", 2, id="megatron_equal_shards"),
    pytest.param(
        "torch_loss_parallel", "honest", "torch.distributed.tensor", 2, id="loss_parallel"
    ),
    pytest.param("trl", "honest", "trl", 1, id="trl"),
    pytest.param("verl", "honest", "verl.utils.torch_functional", 1, id="verl"),
    pytest.param("verl_naive", "honest", "verl.utils.torch_functional", 1, id="verl_naive"),
]


def _op(module: str, attr: str, library: str) -> object:
    if module.startswith("liger") and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Liger's Triton kernel runs on CPU only with TRITON_INTERPRET=1")
    pytest.importorskip(library)
    return getattr(importlib.import_module(f"tp_logprob.peers.{module}"), attr)[0]


def _contract(role: str, tp: int, vocab: int = 8) -> tpl.LogprobContract:
    sharding = tpl.ShardingSpec(0, tp, tpl.even_shard_bounds(vocab, tp), vocab, vocab)
    return tpl.LogprobContract(
        role, "fp32", tpl.MaskSpec(4), sharding, tpl.ReductionSpec("fixed_topology")
    )


def _logits() -> torch.Tensor:
    logits = torch.linspace(-3.0, 4.0, 32).reshape(4, 8)
    logits[1] = -INF  # no finite live logit: lse -inf, selected NaN
    logits[2, 5] = INF  # a +inf logit: lse +inf, selected NaN
    logits[3, 0] = -INF  # a -inf target in a finite row: selected -inf
    return logits


@pytest.mark.parametrize(("module", "attr", "library", "tp"), ADAPTERS)
def test_matches_torch_log_softmax_and_leaves_inputs_alone(
    module: str, attr: str, library: str, tp: int
) -> None:
    op = _op(module, attr, library)
    logits, targets = _logits(), torch.tensor([3, 1, 6, 0])
    before = (logits.clone(), targets.clone(), logits._version)
    results = tpl.run_tp(op, logits, targets, _contract("infer", tp))
    expected_lse = torch.logsumexp(logits, dim=1)
    expected = torch.log_softmax(logits, dim=1).gather(1, targets[:, None])[:, 0]
    expected[3] = -INF  # torch's log_softmax: -inf - finite lse
    # Peer bugs, pinned: docs/repro_{trl,verl}_logprob_pos_inf.py; verl's from 0.2, whose CPU
    # path is logprobs_from_logits_v2 (0.1's is log_softmax, as torch's).
    if module == "trl" or (module == "verl" and parse_release(version("verl")) >= (0, 2)):
        expected[2] = -INF
    selected, lse = results[0].selected_logp, results[0].lse
    torch.testing.assert_close(lse, expected_lse, equal_nan=True)
    torch.testing.assert_close(selected, expected, equal_nan=True)
    assert torch.equal(logits, before[0]) and torch.equal(targets, before[1])
    assert logits._version == before[2]


@pytest.mark.parametrize(("module", "attr", "library", "tp"), ADAPTERS)
def test_gradients_reach_the_callers_logits(module: str, attr: str, library: str, tp: int) -> None:
    op = _op(module, attr, library)
    logits = torch.linspace(-2.0, 2.0, 32).reshape(4, 8).requires_grad_()
    targets = torch.tensor([0, 7, 3, 4])
    results = tpl.run_tp(op, logits, targets, _contract("train", tp))
    sum(result.selected_logp.sum() for result in results).backward()
    reference = logits.detach().clone().requires_grad_()
    torch.log_softmax(reference, dim=1).gather(1, targets[:, None]).sum().backward()
    torch.testing.assert_close(logits.grad, reference.grad)


def test_verls_entropy_is_its_own_and_nan_beside_a_neg_inf_logit() -> None:
    """The entropy the verl adapter returns is verl's (a peer bug, pinned:
    docs/repro_verl_entropy_neg_inf.py); finite rows match torch's entropy."""
    op = _op("verl", "honest", "verl.utils.torch_functional")
    logits = torch.linspace(-3.0, 4.0, 32).reshape(4, 8)
    logits[3, 4] = -INF
    contract = dataclasses.replace(_contract("infer", 1), export_entropy=True)
    entropy = tpl.run_tp(op, logits, torch.tensor([1, 2, 3, 0]), contract)[0].entropy
    probs = torch.softmax(logits[:3], dim=1)
    torch.testing.assert_close(entropy[:3], -(probs * probs.log()).sum(dim=1))
    assert torch.isnan(entropy[3])


def test_verl_naive_entropy_is_fp32_for_16bit_logits_and_nan_beside_a_neg_inf_logit() -> None:
    """entropy_from_logits_with_chunking casts each chunk to fp32 (so a bf16 row's entropy
    is the fp32 entropy of its bf16 values) and shares entropy_from_logits' formula (NaN
    beside a -inf logit, a peer bug, pinned: docs/repro_verl_entropy_neg_inf.py)."""
    op = _op("verl_naive", "honest", "verl.utils.torch_functional")
    logits = torch.linspace(-3.0, 4.0, 32).reshape(4, 8)
    logits[3, 4] = -INF
    targets = torch.tensor([1, 2, 3, 0])
    contract = dataclasses.replace(_contract("infer", 1), export_entropy=True)
    entropy = tpl.run_tp(op, logits, targets, contract)[0].entropy
    probs = torch.softmax(logits[:3], dim=1)
    torch.testing.assert_close(entropy[:3], -(probs * probs.log()).sum(dim=1))
    assert torch.isnan(entropy[3])
    half = logits[:3].bfloat16()
    bf16 = dataclasses.replace(_contract("infer", 1), dtype="bf16", export_entropy=True)
    wide = tpl.run_tp(op, half, targets[:3], dataclasses.replace(bf16, mask=tpl.MaskSpec(3)))
    probs = torch.softmax(half.float(), dim=1)
    assert wide[0].entropy is not None and wide[0].entropy.dtype == torch.float32
    torch.testing.assert_close(wide[0].entropy, -(probs * probs.log()).sum(dim=1))
