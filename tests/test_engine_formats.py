"""Engine responses as supports: each format read, round-tripped, and refused when malformed."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from tp_logprob import LogprobContractError
from tp_logprob.engine_formats import (
    prime_rl_rollout,
    prime_rl_support,
    read_rollouts,
    sglang_rollout,
    sglang_support,
    vllm_rollout,
    vllm_support,
)

SGLANG: dict[str, Any] = {
    "output_ids": [3, 1, 4],
    "meta_info": {
        "output_token_sampling_mask": [[3, 5, 2], [1], [4, 0]],
        "output_token_sampling_logprobs": [-0.5, 0.0, -0.25],
        "output_token_sampling_mask_length": 3,
    },
}
VLLM: dict[str, Any] = {
    "choices": [
        {
            "index": 0,
            "token_ids": [3, 1],
            "sampling_mask": [[2, 3, 5], [1, 6]],
            "logprobs": {
                "content": [
                    {"token_id": 3, "logprob": -0.5, "top_logprobs": []},
                    {"token_id": 1, "logprob": -0.75, "top_logprobs": []},
                ]
            },
        }
    ]
}


def test_sglang_rows_are_sorted_and_keep_the_logprobs() -> None:
    rollout = sglang_rollout(SGLANG, vocab_size=8)
    assert [rollout.support.kept_row(t).tolist() for t in range(3)] == [[2, 3, 5], [1], [0, 4]]
    assert rollout.token_ids.tolist() == [3, 1, 4]
    assert rollout.logprobs is not None and rollout.logprobs.tolist() == [-0.5, 0.0, -0.25]
    assert sglang_support(SGLANG) == rollout.support


def test_sglang_support_mode_picks_the_sampled_tokens_logprob() -> None:
    response = copy.deepcopy(SGLANG)
    response["meta_info"]["output_token_sampling_logprobs"] = [
        [-0.5, -1.5, -2.0],
        [0.0],
        [-0.25, -1.5],
    ]
    rollout = sglang_rollout(response)
    assert rollout.logprobs is not None and rollout.logprobs.tolist() == [-0.5, 0.0, -0.25]


def test_vllm_and_prime_rl_read_the_same_support() -> None:
    from_vllm = vllm_support(VLLM, vocab_size=8)
    from_prime = prime_rl_support([3, 2, 5, 6, 1], [3, 2], [3, 1], vocab_size=8)
    assert from_vllm == from_prime
    rollout = vllm_rollout(VLLM["choices"][0])
    assert rollout.logprobs is not None and rollout.logprobs.tolist() == [-0.5, -0.75]


def test_a_zero_prime_rl_count_is_a_token_without_a_mask() -> None:
    rollout = prime_rl_rollout([4, 2, 1], [2, 0, 1], [2, 7, 1], vocab_size=8)
    assert rollout.has_mask.tolist() == [True, False, True]
    assert rollout.support.kept_counts().tolist() == [2, 0, 1]


def test_a_batch_document_reads_every_response() -> None:
    found = read_rollouts([SGLANG, SGLANG, VLLM])
    assert [r.engine for r in found] == ["sglang", "sglang", "vllm"]
    prime = {"ids": [1, 2], "counts": [2], "token_ids": [2]}
    assert read_rollouts(prime)[0].engine == "prime_rl"


def _sglang(**meta: Any) -> dict[str, Any]:
    response = copy.deepcopy(SGLANG)
    ids = meta.pop("output_ids", None)
    if ids is not None:
        response["output_ids"] = ids
    response["meta_info"].update(meta)
    return response


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: sglang_rollout(_sglang(output_token_sampling_mask=[[3], [1]])),
            "output_token_sampling_mask: 2 masks for 3 output tokens",
        ),
        (
            lambda: sglang_rollout(_sglang(output_token_sampling_mask_truncated=True)),
            "output_token_sampling_mask_truncated=True: the engine returned part",
        ),
        (
            lambda: sglang_rollout(
                _sglang(output_token_sampling_mask_truncated=[False, True, False])
            ),
            "truncated[token 1]=True",
        ),
        (
            lambda: sglang_rollout(_sglang(), vocab_size=5),
            "mask[token 0]: id 5 is outside the vocabulary [0, 5)",
        ),
        (
            lambda: sglang_rollout(_sglang(output_ids=[3, 2, 4])),
            "mask[token 1]: the sampled token 2 is not in its own mask",
        ),
        (
            lambda: sglang_rollout(_sglang(output_token_sampling_mask=[[3, 5.0], [1], [4]])),
            "mask[token 0][1]=5.0: expected an int, got float",
        ),
        (
            lambda: sglang_rollout(_sglang(output_token_sampling_mask=[[3], [True], [4]])),
            "mask[token 1][0]=True: expected an int, got bool",
        ),
        (
            lambda: sglang_rollout(_sglang(output_token_sampling_mask=[[3, 3], [1], [4]])),
            "mask[token 0]: id 3 appears twice",
        ),
        (
            lambda: sglang_rollout(_sglang(output_token_sampling_mask=[[3], [], [4]])),
            "mask[token 1]=[]: a sampled token keeps no id",
        ),
        (
            lambda: sglang_rollout(_sglang(output_ids=[3, 1.0, 4])),
            "output_ids[1]=1.0: expected an int",
        ),
        (
            lambda: sglang_rollout(_sglang(output_token_sampling_logprobs=[-0.5, 0.0])),
            "output_token_sampling_logprobs: 2 entries for 3 output tokens",
        ),
        (
            lambda: sglang_rollout(_sglang(output_token_sampling_logprobs=[-0.5, 0.5, 0.0])),
            "logprobs[token 1]=0.5: a logprob is <= 0",
        ),
        (
            lambda: sglang_rollout({"output_ids": [1]}),
            "meta_info: expected a JSON object (return_sampling_mask=True)",
        ),
        (
            lambda: vllm_rollout({"choices": [{"token_ids": [1], "sampling_mask": None}]}),
            "sampling_mask=None: the server returned no mask",
        ),
        (
            lambda: vllm_rollout({"choices": [{"token_ids": [1, 2], "sampling_mask": [[1]]}]}),
            "sampling_mask: 1 masks for 2 output tokens",
        ),
        (
            lambda: vllm_rollout({"choices": [{"token_ids": [1], "sampling_mask": [[-1, 1]]}]}),
            "sampling_mask[token 0]: id -1 is outside the vocabulary",
        ),
        (
            lambda: vllm_rollout(
                {
                    "token_ids": [1],
                    "sampling_mask": [[1]],
                    "logprobs": {"content": [{"token_id": 2, "logprob": -1.0}]},
                }
            ),
            "content[token 0].token_id=2: the sampled token is 1",
        ),
        (lambda: prime_rl_rollout([1, 2], [2, 1], [1]), "counts: 2 entries for 1 output tokens"),
        (lambda: prime_rl_rollout([1, 2], [1], [1]), "counts: they sum to 1, but ids holds 2"),
        (lambda: prime_rl_rollout([1], [-1, 2], [1, 1]), "counts[0]=-1: must be >= 0"),
        (lambda: prime_rl_rollout([1.5], [1], [1]), "ids[0]=1.5: expected an int"),
        (
            lambda: prime_rl_rollout(np.array([1, 9]), [1, 1], [1, 2], vocab_size=8),
            "ids[token 1]: id 9 is outside the vocabulary [0, 8)",
        ),
        (lambda: read_rollouts({"text": "hi"}), "response 0: neither SGLang"),
    ],
)
def test_bad_engine_data_is_refused_with_the_position(build: Any, message: str) -> None:
    with pytest.raises(LogprobContractError) as raised:
        build()
    assert message in str(raised.value)
