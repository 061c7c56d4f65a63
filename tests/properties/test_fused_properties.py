"""The fused-path properties fail where they should: a backend that materializes the logits,
one that reads the weight's padding rows, one whose dot products are off."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings

from tp_logprob.judging.fused import logits_contract
from tp_logprob.judging.violation import PropertyViolation
from tp_logprob.kernels.builtin import TORCH_NATIVE_FUSED
from tp_logprob.kernels.native import torch_native_logprob
from tp_logprob.kernels.native_fused import torch_native_fused_logprob
from tp_logprob.registry import KernelRegistry
from tp_logprob.replay.catalogue import suite_properties
from tp_logprob.strategies import HiddenCase, hidden_cases
from tp_logprob.suite.backends import BackendUnderTest

SUITE = suite_properties()


def _backend(op: Any, name: str) -> Any:
    registry = KernelRegistry()
    capability = dataclasses.replace(TORCH_NATIVE_FUSED, backend_id=name)
    registry.register_logprob_backend("cpu", lambda: op, capability)
    return BackendUnderTest(name, capability, registry, "cpu")


def _materializing(
    hidden: Any, targets: Any, contract: Any, group: Any = None, *, weight: Any, bias: Any = None
) -> Any:
    """The whole [N, local_vocab] logits in fp32, then the logits path."""
    logits = hidden.float() @ weight.float().T
    if bias is not None:
        logits = logits + bias.float()
    return torch_native_logprob(logits, targets, logits_contract(contract), group)


def _reads_padding(
    hidden: Any, targets: Any, contract: Any, group: Any = None, *, weight: Any, bias: Any = None
) -> Any:
    """Right, plus a term from the padding rows' values, summed over ranks (so replicated)."""
    result = torch_native_fused_logprob(hidden, targets, contract, group, weight=weight, bias=bias)
    start, end = contract.sharding.live_bounds()
    garbage = weight[end - start :].float().nan_to_num(nan=1.0, posinf=2.0, neginf=-2.0)
    leak = garbage.sum().reshape(1) * 1e-3
    total = sum(group.all_gather(leak)) if group is not None else leak
    return type(result)(result.selected_logp + total, *result[1:])


def _bf16_dot(
    hidden: Any, targets: Any, contract: Any, group: Any = None, *, weight: Any, bias: Any = None
) -> Any:
    """Logits rounded to bf16 before the softmax (a bf16 GEMM output)."""
    logits = (hidden.float() @ weight.float().T).bfloat16().float()
    return torch_native_logprob(logits, targets, logits_contract(contract), group)


REFERENCE = _backend(torch_native_fused_logprob, "reference_fused")


@settings(max_examples=5, database=None, deadline=None)
@given(hidden_cases(capability=TORCH_NATIVE_FUSED, max_num_tokens=3, max_padded_vocab_size=16))
def test_memory_check_passes_the_chunked_backend(case: HiddenCase) -> None:
    SUITE["fused_memory"](REFERENCE, case, {})


def test_memory_check_flags_a_backend_that_materializes_the_logits() -> None:
    case = _case(hidden_size=3)
    with pytest.raises(PropertyViolation, match="fused memory"):
        SUITE["fused_memory"](_backend(_materializing, "materializing"), case, {})


def test_padding_check_flags_a_backend_that_reads_padding_rows() -> None:
    case = _case(hidden_size=3)
    SUITE["fused_padding_rows"](REFERENCE, case, {"seed": 1})
    with pytest.raises(PropertyViolation, match="fused padding rows"):
        SUITE["fused_padding_rows"](_backend(_reads_padding, "reads_padding"), case, {"seed": 1})


def test_exact_products_check_flags_logits_rounded_to_bf16() -> None:
    case = _case(hidden_size=5, integers=True)
    SUITE["fused_exact_products"](REFERENCE, case, {})
    with pytest.raises(PropertyViolation, match="fused exact dot products"):
        SUITE["fused_exact_products"](_backend(_bf16_dot, "bf16_dot"), case, {})


def _case(*, hidden_size: int, integers: bool = False) -> HiddenCase:
    """A TP=2 fp32 case over 20 columns, 16 live; padding rows hold NaN."""
    from tp_logprob.contract import LogprobContract, MaskSpec, ReductionSpec, ShardingSpec
    from tp_logprob.oracle import exact_hidden_logits

    rows = 4
    contract = LogprobContract(
        "infer",
        "fp32",
        MaskSpec(rows),
        ShardingSpec(0, 2, ((0, 10), (10, 20)), 16, 20),
        ReductionSpec("fixed_topology"),
        input_kind="hidden",
        hidden_size=hidden_size,
    )
    rng = np.random.default_rng(3)
    if integers:
        hidden = rng.integers(-8, 9, (rows, hidden_size)).astype(np.float32)
        weight = rng.integers(-8, 9, (20, hidden_size)).astype(np.float32) * 37
    else:
        hidden = rng.standard_normal((rows, hidden_size)).astype(np.float32)
        weight = rng.standard_normal((20, hidden_size)).astype(np.float32)
    weight[16:] = np.nan
    logits = exact_hidden_logits(hidden, weight).astype(np.float32)
    return HiddenCase(contract, logits, np.array([0, 3, 10, 15]), hidden=hidden, weight=weight)
