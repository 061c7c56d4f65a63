"""The ``platform_twins`` property's power: a twin whose ``exp`` is the platform's gives other
bits on a long batch, and the property says so; the real twin passes."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import tp_logprob as tpl
from tests.helpers.native_cases import LAYOUTS, make_contract, random_inputs
from tp_logprob.kernels import portable, portable_sum
from tp_logprob.kernels.builtin import TORCH_PORTABLE
from tp_logprob.properties.test_platforms import platform_twins
from tp_logprob.registry import KernelRegistry
from tp_logprob.strategies import LogprobCase
from tp_logprob.suite.backends import BackendUnderTest

ROWS = 4000  # a one-ulp exp changes about 1% of the rows' lse or selected_logp bits


_PATCH = threading.Lock()
_RANKS_IN_MUTANT = [0]  # ranks (threads) running the mutant: the last one out restores


def _platform_exp_twin(
    local_logits: torch.Tensor, targets: torch.Tensor, contract: object, group: object = None
) -> tpl.LogprobResult:
    """torch_portable with the platform's exp. Every emulated rank is a thread running this
    at once, so the module's ``portable_exp`` is swapped by the first rank in and put back by
    the last one out (a save and restore per rank would race, and could leave torch.exp
    behind for every later test in the process)."""
    with _PATCH:
        _RANKS_IN_MUTANT[0] += 1
        portable_sum.portable_exp = torch.exp  # type: ignore[assignment]
    try:
        return portable_sum.torch_portable_logprob(local_logits, targets, contract, group)  # type: ignore[arg-type]
    finally:
        with _PATCH:
            _RANKS_IN_MUTANT[0] -= 1
            if _RANKS_IN_MUTANT[0] == 0:
                portable_sum.portable_exp = portable.portable_exp


@pytest.fixture(autouse=True)
def _portable_exp_restored() -> Iterator[None]:
    yield
    assert portable_sum.portable_exp is portable.portable_exp, "a test left portable_exp patched"


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
