"""The ``platform_twins`` property's power: a twin whose ``exp`` is the platform's gives other
bits on a long batch, and the property says so; the real twin passes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import tp_logprob as tpl
from tests.helpers.native_cases import LAYOUTS, make_contract, random_inputs
from tp_logprob.kernels import portable_sum
from tp_logprob.kernels.builtin import TORCH_PORTABLE
from tp_logprob.properties.test_platforms import platform_twins
from tp_logprob.registry import KernelRegistry
from tp_logprob.strategies import LogprobCase
from tp_logprob.suite.backends import BackendUnderTest

ROWS = 4000  # a one-ulp exp changes about 1% of the rows' lse or selected_logp bits


def _platform_exp_twin(
    local_logits: torch.Tensor, targets: torch.Tensor, contract: object, group: object = None
) -> tpl.LogprobResult:
    original = portable_sum.portable_exp
    portable_sum.portable_exp = torch.exp  # type: ignore[assignment]
    try:
        return portable_sum.torch_portable_logprob(local_logits, targets, contract, group)  # type: ignore[arg-type]
    finally:
        portable_sum.portable_exp = original


def _backend(backend_id: str, op: object) -> BackendUnderTest:
    registry = KernelRegistry()
    capability = dataclasses.replace(TORCH_PORTABLE, backend_id=backend_id)
    registry.register_logprob_backend("cpu", lambda: op, capability)
    return BackendUnderTest(backend_id, capability, registry, "cpu")


def _case() -> LogprobCase:
    logits, targets = random_inputs(3, ROWS, scale=4.0)
    contract = make_contract(LAYOUTS["tp3-uneven"], num_tokens=ROWS)
    return LogprobCase(contract, logits.numpy().astype(np.float32), targets.numpy())


def test_a_twin_with_the_platform_exp_is_caught() -> None:
    backend = _backend("torch_portable", portable_sum.torch_portable_logprob)
    mutant = _backend("platform_exp_twin", _platform_exp_twin)
    with pytest.raises(AssertionError, match="cross-platform bits"):
        platform_twins(backend, _case(), {}, twin=mutant)


def test_the_real_twin_passes() -> None:
    backend = _backend("torch_portable", portable_sum.torch_portable_logprob)
    twin = _backend("torch_portable_again", portable_sum.torch_portable_logprob)
    platform_twins(backend, _case(), {}, twin=twin)
