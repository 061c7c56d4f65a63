"""Every built-in backend on heterogeneous engine batches: each row gets the bits its group
of rows gets alone (docs/semantics.md, "Heterogeneous batches"), for the logits backends
and the fused LM heads, with gradients through the groups (CPU: the Triton interpreter)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import tp_logprob as tpl
from tests.helpers.fused_cases import fused_case, fused_contract
from tests.helpers.native_cases import LAYOUTS, assert_same_bits, random_inputs
from tests.helpers.support_cases import support_contract
from tp_logprob.kernels import builtin
from tp_logprob.kernels.native_fused import torch_native_fused_logprob
from tp_logprob.kernels.portable_sum import torch_portable_logprob
from tp_logprob.row_groups import row_groups, rule_groups

pytest.importorskip("triton", reason="the Triton backends need triton (on CPU, its interpreter)")
from tp_logprob.kernels.triton.exact_sum import triton_exact_sum_logprob
from tp_logprob.kernels.triton.fused import triton_fused_logprob
from tp_logprob.kernels.triton.fused_exact_sum import triton_fused_exact_sum_logprob
from tp_logprob.kernels.triton.online import triton_online_logprob
from tp_logprob.kernels.triton.portable_sum import triton_portable_logprob

pytestmark = pytest.mark.triton

MASK = np.array([True, True, False, True, True, True])
TEMPERATURES = (0.7, 0.0, 1.3, 0.7, 0.0, 2.0)
RULES = tpl.SupportSpec(
    top_k=[4, 2, None, 4, None, 6],
    top_p=[None, 0.5, 0.8, None, None, 0.9],
    min_p=[0.01, None, None, 0.01, None, None],
)
KEPT = [[0, 3, 5], [1], [2, 4], [0, 3, 5], [7], [1, 2, 18]]
REPLAYED = tpl.SupportSpec.from_kept_lists(KEPT)
SUPPORTS: dict[str, tpl.SupportSpec | None] = {
    "full": None,
    "sampling-params": RULES,
    "shared-rules": tpl.SupportSpec(top_k=4, top_p=0.9),
    "rules-per-row-alike": tpl.SupportSpec(top_k=[3] * 6, min_p=[0.02] * 6),
    "replayed": REPLAYED,
}
"""Per-row temperatures with each support: the Triton backends launch once per set of rules
(``rule_groups``), each row dividing by its own temperature; "full", "replayed",
"shared-rules" and "rules-per-row-alike" (greedy rows aside) are one launch for rows at
four temperatures."""
OUTPUTS = ("selected_logp", "lse", "entropy", "support_lse", "support_size", "support_threshold")
LOGITS_OPS: dict[str, Callable[..., Any]] = {
    "triton_online": triton_online_logprob,
    "triton_exact_sum": triton_exact_sum_logprob,
    "triton_portable": triton_portable_logprob,
    "torch_portable": torch_portable_logprob,
}
FUSED_OPS: dict[str, Callable[..., Any]] = {
    "torch_native_fused": torch_native_fused_logprob,
    "triton_fused": triton_fused_logprob,
    "triton_fused_exact_sum": triton_fused_exact_sum_logprob,
}
FULL_ONLY = {"triton_portable", "torch_portable"}
"""Backends that serve the full vocabulary only: mixed temperatures, no sampling support."""
LOGITS_CASES = [
    (backend, support)
    for backend in LOGITS_OPS
    for support in SUPPORTS
    if support == "full" or backend not in FULL_ONLY
]


def _sampled(targets: torch.Tensor, support: str) -> torch.Tensor:
    """``targets`` with each active row's inside its replayed support, as an engine samples."""
    if support != "replayed":
        return targets
    inside = torch.tensor([kept[-1] for kept in KEPT])
    return torch.where(torch.from_numpy(MASK), inside, targets)


def _assert_rows_as_alone(mixed: Any, alone: Any, rows: torch.Tensor) -> None:
    for name in OUTPUTS:
        value = getattr(mixed, name)
        if value is None:
            assert getattr(alone, name) is None, name
            continue
        assert_same_bits(value[rows], getattr(alone, name), name)


@pytest.mark.parametrize("layout", ["tp1", "tp3-uneven"])
@pytest.mark.parametrize(("backend", "support"), LOGITS_CASES)
def test_a_logits_backend_gives_each_row_its_groups_bits(
    backend: str, support: str, layout: str
) -> None:
    op = LOGITS_OPS[backend]
    logits, targets = random_inputs(21, 6, active_mask=MASK)
    targets = _sampled(targets, support)
    contract = support_contract(
        LAYOUTS[layout], SUPPORTS[support], num_tokens=6, active_mask=MASK, entropy=True
    )
    contract = dataclasses.replace(contract, temperature=TEMPERATURES)
    mixed = tpl.run_tp(op, logits, targets, contract)[0]
    groups = row_groups(contract)
    assert len(groups) >= 3
    for group in groups:
        rows = torch.from_numpy(group.rows)
        alone = tpl.run_tp(op, logits[rows], targets[rows], group.contract)[0]
        _assert_rows_as_alone(mixed, alone, rows)


@pytest.mark.parametrize("support", list(SUPPORTS))
@pytest.mark.parametrize("backend", list(FUSED_OPS))
def test_a_fused_backend_gives_each_row_its_groups_bits(backend: str, support: str) -> None:
    op = FUSED_OPS[backend]
    hidden, weight, bias, targets = fused_case("fp32", seed=5, bias=True)
    targets = _sampled(targets, support)
    contract = fused_contract(
        LAYOUTS["tp3-uneven"],
        active_mask=MASK,
        has_bias=True,
        export_entropy=True,
        support=SUPPORTS[support],
        temperature=TEMPERATURES,
    )
    mixed = tpl.run_tp_hidden(op, hidden, weight, targets, contract, bias=bias)[0]
    for group in row_groups(contract):
        rows = torch.from_numpy(group.rows)
        alone = tpl.run_tp_hidden(
            op, hidden[rows], weight, targets[rows], group.contract, bias=bias
        )[0]
        _assert_rows_as_alone(mixed, alone, rows)


@pytest.mark.parametrize("backend", ["triton_online", "triton_portable"])
def test_a_logits_backends_gradient_is_each_groups_gradient(backend: str) -> None:
    op = LOGITS_OPS[backend]
    logits, targets = random_inputs(22, 6, active_mask=MASK)
    support = None if backend in FULL_ONLY else RULES
    contract = support_contract(
        LAYOUTS["tp1"], support, num_tokens=6, active_mask=MASK, entropy=True, role="train"
    )
    contract = dataclasses.replace(contract, temperature=TEMPERATURES)
    leaf = logits.clone().requires_grad_(True)
    result = op(leaf, targets, contract)
    (result.selected_logp.sum() + 0.5 * result.entropy.sum()).backward()
    assert leaf.grad is not None
    expected = torch.zeros_like(logits)
    for group in row_groups(contract):
        rows = torch.from_numpy(group.rows)
        own = logits[rows].clone().requires_grad_(True)
        alone = op(own, targets[rows], group.contract)
        (alone.selected_logp.sum() + 0.5 * alone.entropy.sum()).backward()
        expected[rows] = own.grad
    assert_same_bits(leaf.grad, expected, "gradient")


def test_a_fused_backends_weight_gradient_sums_its_groups() -> None:
    """triton_fused: ``d hidden`` row by row from its group, ``d W`` the groups' sum."""
    hidden, weight, _, targets = fused_case("fp32", seed=6)
    contract = fused_contract(
        LAYOUTS["tp1"], active_mask=MASK, role="train", temperature=TEMPERATURES, support=RULES
    )
    leaf_hidden = hidden.clone().requires_grad_(True)
    leaf_weight = weight.clone().requires_grad_(True)
    result = triton_fused_logprob(leaf_hidden, targets, contract, weight=leaf_weight)
    result.selected_logp.sum().backward()
    assert leaf_hidden.grad is not None and leaf_weight.grad is not None
    expected_hidden = torch.zeros_like(hidden)
    expected_weight = torch.zeros_like(weight)
    for group in row_groups(contract):
        rows = torch.from_numpy(group.rows)
        own_hidden = hidden[rows].clone().requires_grad_(True)
        own_weight = weight.clone().requires_grad_(True)
        alone = triton_fused_logprob(own_hidden, targets[rows], group.contract, weight=own_weight)
        alone.selected_logp.sum().backward()
        expected_hidden[rows] = own_hidden.grad
        expected_weight += own_weight.grad
    assert_same_bits(leaf_hidden.grad, expected_hidden, "d hidden")
    torch.testing.assert_close(leaf_weight.grad, expected_weight, rtol=1e-6, atol=1e-6)


def test_every_builtin_declares_row_parameters_and_dispatch_serves_a_mixed_batch() -> None:
    contract = dataclasses.replace(
        support_contract(LAYOUTS["tp1"], RULES, num_tokens=6), temperature=TEMPERATURES
    )
    capabilities = [
        value for value in vars(builtin).values() if isinstance(value, tpl.LogprobBackendCapability)
    ]
    assert len(capabilities) >= 8
    assert all(capability.supports_row_parameters for capability in capabilities)
    assert builtin.TRITON_ONLINE.supports(contract)
    dispatched = tpl.registry.get_logprob_op(contract, platform="cpu")
    assert dispatched.capability.supports_row_parameters


def test_a_mixed_fused_batch_with_bad_inputs_is_refused_for_the_whole_batch() -> None:
    hidden, weight, _, targets = fused_case("fp32", seed=7)
    contract = fused_contract(LAYOUTS["tp1"], temperature=TEMPERATURES)
    with pytest.raises(tpl.LogprobContractError, match="weight"):
        triton_fused_logprob(hidden, targets, contract, weight=weight[:, :-1])


@pytest.mark.parametrize("backend", ["triton_online", "triton_exact_sum"])
def test_a_batch_of_greedy_rows_with_their_requests_rules_is_one_call_without_rules(
    backend: str,
) -> None:
    """Every row greedy, each request naming rules: one rule group, every rule off."""
    op = LOGITS_OPS[backend]
    logits, targets = random_inputs(23, 6, active_mask=MASK)
    contract = support_contract(LAYOUTS["tp3-uneven"], RULES, num_tokens=6, active_mask=MASK)
    greedy = dataclasses.replace(contract, temperature=(0.0,) * 6)
    (group,) = rule_groups(greedy)
    assert group.contract.support == tpl.SupportSpec(top_p=1.0)
    mixed = tpl.run_tp(op, logits, targets, greedy)[0]
    raw = dataclasses.replace(contract, support=tpl.SupportSpec(top_p=1.0))
    alone = tpl.run_tp(op, logits, targets, raw)[0]
    _assert_rows_as_alone(mixed, alone, torch.arange(6))
