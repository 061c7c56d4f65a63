"""Engine responses built by the engines' own installed code, read back and checked.

vLLM: its v1 sampler (``processed_logits`` mode, as ``peers/vllm_sampler.py`` runs it)
gives the processed logits; the mask is their finite columns (the rule of vLLM's
``_compact_sampling_mask_kernel``), the logprob ``Sampler.compute_logprobs`` of them
(``processed_logprobs`` mode), and the response is vLLM's own ``/generate`` protocol
model, dumped to JSON. SGLang: its ``SamplingMaskChunk.to_lists`` turns packed
masks (in its sampler's weight order) into the ``meta_info`` lists; the supports
there are the exact rules' (SGLang's own rules are ``peers/sglang_sampler.py``'s, pinned in
``test_sglang_sampler.py``). Each part is skipped where its engine is not installed.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

import tp_logprob as tpl
from tp_logprob.engine_formats import sglang_rollout, vllm_rollout
from tp_logprob.oracle import exact_support
from tp_logprob.rollout import check_rollout
from tp_logprob.support import SupportSpec

N, V = 16, 40
PARAMS = [
    {"top_k": 5},
    {"top_p": 0.8},
    {"min_p": 0.1},
    {"top_k": 12, "top_p": 0.9, "min_p": 0.02},
]


def _logits(seed: int) -> torch.Tensor:
    return torch.randn(N, V, generator=torch.Generator().manual_seed(seed)) * 2.5


def _vllm_response(x: torch.Tensor, params: dict[str, Any], temperature: float, mode: str) -> Any:
    from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
        GenerateLogProbs,
        GenerateLogProbsContent,
        GenerateTokensChoice,
    )
    from vllm.v1.sample.sampler import Sampler

    from tp_logprob.peers import vllm_sampler

    sharding = tpl.ShardingSpec(0, 1, ((0, V),), V, V)
    contract = tpl.LogprobContract(
        "infer", "fp32", tpl.MaskSpec(N), sharding, tpl.ReductionSpec("run_to_run"),
        temperature=temperature, support=SupportSpec(**params),
    )  # fmt: skip
    processed = vllm_sampler.processed_logits(x, contract)
    kept = torch.isfinite(processed)
    draws = torch.multinomial(
        torch.softmax(processed, dim=1), 1, generator=torch.Generator().manual_seed(1)
    )[:, 0]
    if mode == "processed_logprobs":
        logprobs = Sampler.compute_logprobs(processed)
    else:  # raw_logprobs: the logits before any processing
        logprobs = Sampler.compute_logprobs(x.clone())
    content = [
        GenerateLogProbsContent(token_id=int(t), logprob=float(logprobs[i, t]))
        for i, t in enumerate(draws.tolist())
    ]
    choice = GenerateTokensChoice(
        index=0,
        token_ids=draws.tolist(),
        sampling_mask=[np.flatnonzero(row.numpy()).tolist() for row in kept],
        logprobs=GenerateLogProbs(content=content),
    )
    document = json.loads(json.dumps({"choices": [choice.model_dump(mode="json")]}))
    return document, kept.numpy()


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_vllm_responses_round_trip_and_agree(params: dict[str, Any]) -> None:
    pytest.importorskip("vllm", reason="vLLM is installed by nox -s conformance only")
    x = _logits(len(params))
    document, kept = _vllm_response(x, params, 0.8, "processed_logprobs")
    rollout = vllm_rollout(document, vocab_size=V)
    assert np.array_equal(rollout.support.dense(V), kept)
    check = check_rollout(x, rollout, engine_temperature=0.8)
    assert set(check.verdict) <= {"agree", "noise"}, check.markdown()
    assert not check.failed()


def test_vllm_raw_logprobs_are_over_the_full_vocabulary() -> None:
    pytest.importorskip("vllm", reason="vLLM is installed by nox -s conformance only")
    x = _logits(11)
    document, _ = _vllm_response(x, {"top_k": 4}, 1.0, "raw_logprobs")
    check = check_rollout(x, vllm_rollout(document, vocab_size=V), top_k=4, logit_noise=0.0)
    assert set(check.verdict) == {"raw"}, check.markdown()
    assert all("full vocabulary" in detail for detail in check.details)


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
@pytest.mark.parametrize("support_mode", [False, True], ids=["selected", "support"])
def test_sglang_mask_lists_round_trip(params: dict[str, Any], support_mode: bool) -> None:
    sampling_mask = pytest.importorskip(
        "sglang.srt.sampling.sampling_mask", reason="SGLang is not installed here"
    )
    x = _logits(20 + len(params))
    z = x.double() / 0.8
    found = exact_support(x.numpy(), temperature=0.8, **params)
    weights = torch.where(torch.as_tensor(found.mask), torch.softmax(z, dim=1), 0.0)
    order = torch.argsort(weights, dim=1, descending=True)  # SGLang packs by weight
    lengths = found.size.astype(np.int32)
    ids = np.concatenate([order[t, : lengths[t]].numpy() for t in range(N)]).astype(np.int32)
    tokens = order[:, 0].tolist()
    mass = weights.sum(dim=1)
    per_id = np.concatenate(
        [(weights[t, order[t, : lengths[t]]] / mass[t]).log().numpy() for t in range(N)]
    )
    selected = np.array([float((weights[t, tokens[t]] / mass[t]).log()) for t in range(N)])
    chunk = sampling_mask.SamplingMaskChunk(
        lengths=lengths,
        token_ids=ids,
        logprobs=(per_id if support_mode else selected).astype(np.float32),
    )
    masks, logprobs = chunk.to_lists(support_logprobs=support_mode)
    response = {
        "output_ids": tokens,
        "meta_info": {
            "output_token_sampling_mask": masks,
            "output_token_sampling_logprobs": logprobs,
            "output_token_sampling_mask_length": len(masks),
        },
    }
    rollout = sglang_rollout(json.loads(json.dumps(response)), vocab_size=V)
    assert np.array_equal(rollout.support.dense(V), found.mask)
    check = check_rollout(x, rollout, engine_temperature=0.8, **params)
    # fp32 logprobs: within the bound, or off by the float32 rounding SGLang's lists carry.
    assert set(check.verdict) <= {"agree", "noise"}, check.markdown()
    assert "support" not in check.verdict
