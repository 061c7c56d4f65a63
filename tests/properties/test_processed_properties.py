"""The processed-logprob properties fail where they should, with the field named: a threshold
that is not the least kept z, a size that is not |S|, a support_lse off by an ulp, a mask
ignored, a gradient outside S; and torch_native passes every case made for them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import tp_logprob as tpl
from tp_logprob.judging.violation import PropertyViolation
from tp_logprob.kernels.builtin import TORCH_NATIVE
from tp_logprob.kernels.native import torch_native_logprob
from tp_logprob.registry import KernelRegistry
from tp_logprob.replay.catalogue import suite_properties
from tp_logprob.row_groups import contract_rows
from tp_logprob.strategies import LogprobCase
from tp_logprob.suite.backends import BackendUnderTest

_RAMP = np.array([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]], np.float32)
_TP2 = ((0, 4), (4, 8))


def _backend(op: Callable[..., Any], name: str) -> BackendUnderTest:
    registry = KernelRegistry()
    capability = dataclasses.replace(TORCH_NATIVE, backend_id=name)
    registry.register_logprob_backend("cpu", lambda: op, capability)
    return BackendUnderTest(name, capability, registry, "cpu")


def _changed(**change: Callable[[Any], Any]) -> Callable[..., Any]:
    """torch_native with some outputs of its result replaced (``name=f(result)``)."""

    def op(local_logits: Any, targets: Any, contract: Any, group: Any = None) -> Any:
        result = torch_native_logprob(local_logits, targets, contract, group)
        fields = {name: getattr(result, name) for name in tpl.LogprobResult.SUPPORT_FIELDS}
        values = {"selected_logp": result.selected_logp, "lse": result.lse, **fields}
        values.update({name: f(result) for name, f in change.items()})
        return tpl.LogprobResult(
            values["selected_logp"],
            values["lse"],
            result.entropy,
            support_lse=values["support_lse"],
            support_size=values["support_size"],
            support_threshold=values["support_threshold"],
        )

    return op


def _case(support: tpl.SupportSpec, *, role: str = "infer", target: int = 7) -> LogprobCase:
    contract = tpl.LogprobContract(
        role=role,
        dtype="fp32",
        mask=tpl.MaskSpec(1),
        sharding=tpl.ShardingSpec(0, 2, _TP2, 8, 8),
        reduction=tpl.ReductionSpec("fixed_topology"),
        support=support,
    )
    return LogprobCase(contract, _RAMP, np.array([target]))


NATIVE = _backend(torch_native_logprob, "torch_native")
TOP_K = tpl.SupportSpec(top_k=3)
REPLAYED = tpl.SupportSpec.from_kept_lists([[1, 5, 7]])


def _below(result: Any) -> Any:
    """The threshold one fp32 step down: the same set of z, but not its least value."""
    return torch.nextafter(result.support_threshold, torch.tensor(-float("inf")))


def _size_plus_one(result: Any) -> Any:
    return result.support_size + 1


def _support_lse_ulp(result: Any) -> Any:
    if result.support_lse is None:  # the raw op's run
        return None
    return torch.nextafter(result.support_lse, torch.tensor(float("inf")))


def _ignores_mask(local_logits: Any, targets: Any, contract: Any, group: Any = None) -> Any:
    """The replayed mask dropped: the raw op's outputs, with the support's fields."""
    raw = torch_native_logprob(
        local_logits, targets, dataclasses.replace(contract, support=None), group
    )
    result = torch_native_logprob(local_logits, targets, contract, group)
    return tpl.LogprobResult(
        raw.selected_logp,
        raw.lse,
        support_lse=raw.lse,
        support_size=result.support_size,
        support_threshold=result.support_threshold,
    )


def _leaks_gradient(local_logits: Any, targets: Any, contract: Any, group: Any = None) -> Any:
    """The processed forward, with the raw op's gradient added (zero in value)."""
    raw = torch_native_logprob(
        local_logits, targets, dataclasses.replace(contract, support=None), group
    )
    result = torch_native_logprob(local_logits, targets, contract, group)
    leak = raw.selected_logp - raw.selected_logp.detach()
    return tpl.LogprobResult(
        result.selected_logp + leak,
        result.lse,
        support_lse=result.support_lse,
        support_size=result.support_size,
        support_threshold=result.support_threshold,
    )


def _greedy_rows_keep_their_rules(
    local_logits: Any, targets: Any, contract: Any, group: Any = None
) -> Any:
    """Row by row, a greedy row at T = 1 but still under its request's rules."""
    results = []
    for row in range(contract.num_tokens):
        one = contract_rows(contract, [row])
        top_k, top_p, min_p = one.support.row_rules(0)
        one = dataclasses.replace(
            one,
            temperature=one.temperature[0] or 1.0,
            support=tpl.SupportSpec(top_k=top_k, top_p=top_p, min_p=min_p),
        )
        results.append(
            torch_native_logprob(local_logits[row : row + 1], targets[row : row + 1], one, group)
        )
    return tpl.LogprobResult(
        torch.cat([r.selected_logp for r in results]),
        torch.cat([r.lse for r in results]),
        **{
            name: torch.cat([getattr(r, name) for r in results])
            for name in tpl.LogprobResult.SUPPORT_FIELDS
        },
    )


def _cuts_the_graph(local_logits: Any, targets: Any, contract: Any, group: Any = None) -> Any:
    """The op on a detached copy of its input: the caller's tensor gets no gradient."""
    return torch_native_logprob(
        local_logits.detach().requires_grad_(True), targets, contract, group
    )


_MIXED = dataclasses.replace(
    _case(TOP_K).contract,
    mask=tpl.MaskSpec(2),
    temperature=(0.0, 0.7),
    support=tpl.SupportSpec(top_k=[3, 3]),
)

BROKEN = {
    "threshold below the least kept z": (
        _changed(support_threshold=_below),
        "processed_oracle",
        _case(TOP_K),
        {},
        "support_threshold is not the least kept z",
    ),
    "size off by one": (
        _changed(support_size=_size_plus_one),
        "processed_oracle",
        _case(TOP_K),
        {},
        "support_size is not the size of the support",
    ),
    "support_lse one ulp up": (
        _changed(support_lse=_support_lse_ulp),
        "processed_rules_off",
        LogprobCase(dataclasses.replace(_case(TOP_K).contract, support=None), _RAMP, [7]),
        {"rules_off": "top_p"},
        "support_lse is not bitwise lse",
    ),
    "replayed mask ignored": (
        _ignores_mask,
        "processed_oracle",
        _case(REPLAYED, target=5),
        {},
        "worst     selected_logp",
    ),
    "a greedy row keeps its request's rules": (
        _greedy_rows_keep_their_rules,
        "processed_oracle",
        LogprobCase(_MIXED, np.concatenate([_RAMP, _RAMP]), np.array([7, 7])),
        {},
        "the backend's support is not admissible",
    ),
    "gradient cut from the caller's tensor": (
        _cuts_the_graph,
        "processed_gradients",
        _case(TOP_K, role="train", target=6),
        {},
        "gradient outside its bound",
    ),
    "gradient outside the support": (
        _leaks_gradient,
        "processed_gradients",
        _case(TOP_K, role="train", target=6),
        {},
        "the gradient is not 0 outside the support",
    ),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_backend_fails_with_the_field_named(name: str) -> None:
    op, prop, case, params, message = BROKEN[name]
    with pytest.raises(PropertyViolation) as caught:
        suite_properties()[prop].run(_backend(op, "broken"), case, params)
    assert message in str(caught.value), str(caught.value)


@pytest.mark.parametrize("name", list(BROKEN))
def test_torch_native_passes_the_same_case(name: str) -> None:
    _, prop, case, params, _ = BROKEN[name]
    suite_properties()[prop].run(NATIVE, case, params)


def test_recomputed_support_replays_with_the_same_bits() -> None:
    """A target outside the recomputed support is moved into it for both runs."""
    suite_properties()["processed_replayed_bits"].run(NATIVE, _case(TOP_K, target=0), {})
