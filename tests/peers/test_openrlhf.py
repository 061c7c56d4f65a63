"""The OpenRLHF adapter against torch's log_softmax on small cases; skipped where it is absent.

The property suite judges the adapter thoroughly (``nox -s conformance``); these
tests pin what its glue promises: the installed functions run, values and special
rows, the temperature, untouched inputs, and gradients reaching the caller's logits.
"""

from __future__ import annotations

import pytest
import torch

import tp_logprob as tpl
from tp_logprob.peers._installed import installed_file

pytest.importorskip("openrlhf", reason="OpenRLHF is installed by nox -s conformance only")

from tp_logprob.peers import openrlhf

INF = float("inf")


def _contract(role: str, rows: int, vocab: int, **extra: object) -> tpl.LogprobContract:
    sharding = tpl.ShardingSpec(0, 1, ((0, vocab),), vocab, vocab)
    return tpl.LogprobContract(
        role, extra.pop("dtype", "fp32"), tpl.MaskSpec(rows), sharding,
        tpl.ReductionSpec("fixed_topology"), **extra,
    )  # fmt: skip


def test_the_functions_run_are_the_installed_files() -> None:
    path = installed_file("openrlhf", "models/utils.py")
    lines = path.read_text().splitlines()
    for name, function in openrlhf.installed_definitions().items():
        assert function.__code__.co_filename == str(path)
        assert lines[function.__code__.co_firstlineno - 1].startswith(f"def {name}(")


def test_matches_torch_log_softmax_and_pins_the_pos_inf_row() -> None:
    logits = torch.linspace(-3.0, 4.0, 32).reshape(4, 8)
    logits[1] = -INF  # no finite live logit: lse -inf, selected NaN
    logits[2, 5] = INF  # a +inf logit: lse +inf; selected -inf, a peer bug
    logits[3, 0] = -INF  # a -inf target in a finite row: selected -inf
    targets, before = torch.tensor([3, 1, 6, 0]), logits.clone()
    result = openrlhf.honest[0](logits, targets, _contract("infer", 4, 8))
    expected = torch.log_softmax(logits, dim=1).gather(1, targets[:, None])[:, 0]
    expected[2] = -INF  # docs/repro_openrlhf_logprob_pos_inf.py; log_softmax gives NaN
    torch.testing.assert_close(result.selected_logp, expected, equal_nan=True)
    torch.testing.assert_close(result.lse, torch.logsumexp(logits, dim=1), equal_nan=True)
    assert torch.equal(logits, before)


@pytest.mark.parametrize("temperature", [0.7, 1.5, 1e-3])
def test_the_temperature_divides_a_copy_in_fp32(temperature: float) -> None:
    logits = torch.randn(5, 33, generator=torch.Generator().manual_seed(2)) * 4
    targets, before = torch.arange(5) * 3, logits.clone()
    contract = _contract("infer", 5, 33, temperature=temperature)
    result = openrlhf.honest[0](logits, targets, contract)
    z = before / torch.tensor(temperature, dtype=torch.float32)
    expected = torch.log_softmax(z, dim=1).gather(1, targets[:, None])[:, 0]
    torch.testing.assert_close(result.selected_logp, expected)
    torch.testing.assert_close(result.lse, torch.logsumexp(z, dim=1))
    assert torch.equal(logits, before)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_gradients_reach_the_callers_logits(temperature: float) -> None:
    logits = torch.linspace(-2.0, 2.0, 32).reshape(4, 8).requires_grad_()
    targets = torch.tensor([0, 7, 3, 4])
    contract = _contract("train", 4, 8, temperature=temperature)
    openrlhf.honest[0](logits, targets, contract).selected_logp.sum().backward()
    reference = logits.detach().clone().requires_grad_()
    z = reference / torch.tensor(temperature, dtype=torch.float32)
    torch.log_softmax(z, dim=1).gather(1, targets[:, None]).sum().backward()
    torch.testing.assert_close(logits.grad, reference.grad)


def test_16bit_logits_get_log_softmax_in_their_own_dtype() -> None:
    """What assume_16bit claims away: bf16 in, a bf16-rounded logprob out."""
    logits = (torch.randn(3, 50, generator=torch.Generator().manual_seed(4)) * 3).bfloat16()
    targets = torch.tensor([1, 2, 3])
    op, _ = openrlhf.assume_16bit
    result = op(logits, targets, _contract("infer", 3, 50, dtype="bf16"))
    expected = torch.log_softmax(logits, dim=1).gather(1, targets[:, None])[:, 0]
    assert torch.equal(result.selected_logp, expected.float())


def test_an_out_of_range_target_raises() -> None:
    """What assume_inactive_tokens claims away: every label is gathered."""
    op, _ = openrlhf.assume_inactive_tokens
    contract = tpl.LogprobContract(
        "infer", "fp32", tpl.MaskSpec(2, active_mask=(True, False)),
        tpl.ShardingSpec(0, 1, ((0, 4),), 4, 4), tpl.ReductionSpec("fixed_topology"),
    )  # fmt: skip
    with pytest.raises((IndexError, RuntimeError)):
        op(torch.zeros(2, 4), torch.tensor([1, 1 << 40]), contract)
