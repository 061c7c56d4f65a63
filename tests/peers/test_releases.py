"""Each adapter serves the releases of its library it declares, and refuses the others by name.

These run without the libraries: the installed version is what
``importlib.metadata`` answers, patched here, and a refused release must be
refused before the library is imported or called.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch

import tp_logprob as tpl
from tp_logprob.peers import _releases
from tp_logprob.peers._releases import ServedReleases, UnservedReleaseError, parse_release

ADAPTERS = [
    "cce",
    "liger",
    "liger_fused",
    "liger_vocab_parallel",
    "megatron",
    "openrlhf",
    "sglang_sampler",
    "torch_loss_parallel",
    "trl",
    "trl_chunked",
    "trl_grpo",
    "verl",
    "verl_fused",
    "verl_megatron",
    "verl_naive",
    "vllm_sampler",
    "vllm_sampler_010",
    "vllm_sampler_034",
]


@pytest.mark.parametrize(
    ("version", "release"),
    [("0.8.5", (0, 8, 5)), ("0.10", (0, 10, 0)), ("0.10.1.1", (0, 10, 1, 1)),
     ("0.10.1.post2", (0, 10, 1)), ("1.16.0.dev3", (1, 16, 0)), ("25", (25, 0, 0))],
)  # fmt: skip
def test_parse_release_keeps_the_leading_numbers(version: str, release: tuple[int, ...]) -> None:
    assert parse_release(version) == release


def test_parse_release_refuses_what_is_not_a_release() -> None:
    with pytest.raises(UnservedReleaseError, match=r"version='main'"):
        parse_release("main")


_SPANS = ServedReleases("lib", (((0, 5, 3), (0, 5, 9)), ((0, 6, 3), (0, 9))), "they sum")


@pytest.mark.parametrize("version", ["0.5.3", "0.5.8", "0.6.3", "0.8", "0.8.5.post1"])
def test_a_served_release_is_returned(version: str) -> None:
    assert _SPANS.check(version) == parse_release(version)


@pytest.mark.parametrize("version", ["0.5.2", "0.5.9", "0.6.2", "0.9.0", "1.0", "main"])
def test_a_release_outside_every_span_is_refused_by_name(version: str) -> None:
    with pytest.raises(UnservedReleaseError) as refused:
        _SPANS.check(version)
    message = str(refused.value)
    assert f"lib {version!r} is installed" in message
    assert "lib>=0.5.3,<0.5.9 or >=0.6.3,<0.9 only; they sum" in message


def test_a_span_must_not_be_empty() -> None:
    with pytest.raises(ValueError, match=r"first must precede end"):
        ServedReleases("lib", (((0, 9), (0, 9)),), "")


def _pretend_installed(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    monkeypatch.setattr(_releases.metadata, "version", lambda distribution: version)


@pytest.mark.parametrize("module", ADAPTERS)
def test_every_adapter_declares_its_releases_and_refuses_one_before_them(
    module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: ServedReleases = importlib.import_module(f"tp_logprob.peers.{module}").SERVED
    first = served.spans[0][0]
    before = (*first[:-1], first[-1] - 1) if first[-1] else (first[0], first[1] - 1, 99)
    _pretend_installed(monkeypatch, ".".join(map(str, before)))
    with pytest.raises(UnservedReleaseError, match=served.distribution):
        served.installed()
    _pretend_installed(monkeypatch, ".".join(map(str, first)))
    assert served.installed() == parse_release(".".join(map(str, first)))


@pytest.mark.parametrize("version", ["0.11.0", "0.11.1", "0.24.0", "0.33.0", "0.33.1"])
def test_vllm_sampler_serves_0_11_to_0_33(version: str) -> None:
    from tp_logprob.peers.vllm_sampler import SERVED

    assert SERVED.check(version) == parse_release(version)


@pytest.mark.parametrize(
    ("version", "reason"),
    [("0.9.2", "no logprobs_mode"), ("0.10.2", "tp_logprob.peers.vllm_sampler_010's"),
     ("0.34.0", "0.34 removed vllm.v1.sample.sampler.*tp_logprob.peers.vllm_sampler_034")],
)  # fmt: skip
def test_vllm_sampler_refuses_the_releases_around_it_with_the_reason(
    version: str, reason: str
) -> None:
    from tp_logprob.peers.vllm_sampler import SERVED

    with pytest.raises(UnservedReleaseError, match=rf"serves vllm>=0\.11,<0\.34 only; .*{reason}"):
        SERVED.check(version)


@pytest.mark.parametrize("version", ["0.34.0", "0.34.1"])
def test_vllm_sampler_034_serves_0_34(version: str) -> None:
    from tp_logprob.peers.vllm_sampler_034 import SERVED

    assert SERVED.check(version) == parse_release(version)


def test_vllm_sampler_034_refuses_0_33_naming_the_adapters_before_it() -> None:
    from tp_logprob.peers.vllm_sampler_034 import SERVED

    with pytest.raises(
        UnservedReleaseError, match=r"serves vllm>=0\.34,<0\.35 only; .*vllm_sampler "
    ):
        SERVED.check("0.33.0")


def _logits_contract() -> tpl.LogprobContract:
    sharding = tpl.ShardingSpec(0, 1, ((0, 8),), 8, 8)
    return tpl.LogprobContract(
        "infer", "fp32", tpl.MaskSpec(4), sharding, tpl.ReductionSpec("fixed_topology")
    )


def _hidden_call(op: Any) -> None:
    contract = tpl.LogprobContract(
        "infer",
        "fp32",
        tpl.MaskSpec(4),
        tpl.ShardingSpec(0, 1, ((0, 8),), 8, 8),
        tpl.ReductionSpec("run_to_run"),
        input_kind="hidden",
        hidden_size=3,
    )
    op(torch.zeros(4, 3), torch.zeros(4, dtype=torch.long), contract, weight=torch.ones(8, 3))


@pytest.mark.parametrize(
    ("module", "version", "call"),
    [
        ("liger", "0.4.0", "logits"),
        ("liger_fused", "0.6.0", "hidden"),  # reduction="none" summed from 0.5.9 to 0.6.2
        ("liger_fused", "0.5.2", "hidden"),
        ("trl", "0.14.0", "logits"),
        ("verl", "0.0.9", "logits"),
        ("verl_naive", "0.3.0", "logits"),  # entropy_from_logits_with_chunking from 0.4
        ("openrlhf", "0.6.1", "logits"),  # no temperature argument yet
        ("vllm_sampler", "0.10.2", "logits"),  # a greedy row divided by -1
        ("vllm_sampler", "0.34.0", "logits"),  # no vllm.v1.sample.sampler
        ("vllm_sampler_034", "0.33.0", "logits"),  # no vllm.v1.worker.cpu.sampler
    ],
)
def test_an_adapter_refuses_an_unserved_release_before_any_work(
    module: str, version: str, call: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fresh module: an adapter checks the release when it first loads its library.
    adapter = importlib.reload(importlib.import_module(f"tp_logprob.peers.{module}"))
    op = adapter.honest[0]
    _pretend_installed(monkeypatch, version)
    # The library need not be installed: the refusal comes before its import.
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(UnservedReleaseError, match=rf"{adapter.SERVED.distribution} '{version}'"):
        if call == "hidden":
            _hidden_call(op)
        else:
            op(torch.zeros(4, 8), torch.zeros(4, dtype=torch.long), _logits_contract())
