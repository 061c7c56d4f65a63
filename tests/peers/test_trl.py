"""TRL's ``selective_log_softmax`` adapter at a temperature and with the entropy, on the
installed release; skipped without trl.

The adapter reaches the temperature and the entropy differently by release (the
helpers' own ``temperature`` from 1.14, ``logits / T`` and ``entropy_from_logits``
before, no entropy before 0.20); these tests hold each way to torch's
``log_softmax`` of ``logits / T``, and hold the refusal of an entropy to a release
without one.
"""

from __future__ import annotations

import dataclasses
from importlib.metadata import version
from typing import Any

import pytest
import torch

import tp_logprob as tpl
from tp_logprob.peers._releases import UnservedReleaseError, parse_release

VOCAB, TOKENS = 11, 5


def _op() -> Any:
    pytest.importorskip("trl")
    from tp_logprob.peers import trl

    return trl.honest[0]


def _contract(**fields: Any) -> tpl.LogprobContract:
    sharding = tpl.ShardingSpec(0, 1, ((0, VOCAB),), VOCAB, VOCAB)
    return dataclasses.replace(
        tpl.LogprobContract(
            "infer", "fp32", tpl.MaskSpec(TOKENS), sharding, tpl.ReductionSpec("fixed_topology")
        ),
        **fields,
    )


def _case() -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.randn(TOKENS, VOCAB, generator=torch.Generator().manual_seed(5)) * 3.0
    return logits, torch.tensor([0, 10, 4, 7, 2])


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
def test_the_logprob_and_lse_are_those_of_the_tempered_logits(temperature: float) -> None:
    op = _op()
    logits, targets = _case()
    before = logits.clone()
    result = tpl.run_tp(op, logits, targets, _contract(temperature=temperature))[0]
    z = logits.double() / temperature
    expected = torch.log_softmax(z, dim=1).gather(1, targets[:, None])[:, 0]
    torch.testing.assert_close(result.selected_logp.double(), expected, rtol=1e-5, atol=1e-5)
    assert result.lse is not None
    torch.testing.assert_close(result.lse.double(), z.logsumexp(dim=1), rtol=1e-5, atol=1e-5)
    assert torch.equal(logits, before)


def test_the_entropy_is_that_of_the_tempered_logits_or_refused_before_0_20() -> None:
    op = _op()
    logits, targets = _case()
    contract = _contract(temperature=0.7, export_entropy=True)
    if parse_release(version("trl")) < (0, 20):
        with pytest.raises(UnservedReleaseError, match=r"entropy_from_logits arrived in 0\.20"):
            tpl.run_tp(op, logits, targets, contract)
        return
    entropy = tpl.run_tp(op, logits, targets, contract)[0].entropy
    logp = torch.log_softmax(logits.double() / 0.7, dim=1)
    assert entropy is not None
    torch.testing.assert_close(
        entropy.double(), -(logp.exp() * logp).sum(dim=1), rtol=1e-5, atol=1e-5
    )
