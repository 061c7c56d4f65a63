"""Every Triton backend gives the same bits with the interpreter's shortcuts as with Triton's
interpreter as it is (``kernels/triton/interpreted.py``): outputs, supports and gradients,
over the suite's own adversarial cases (special values, padding, masks, TP degrees)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

pytest.importorskip("triton", reason="the interpreter needs triton")

import tp_logprob as tpl
from tp_logprob.contract import LogprobInputKind
from tp_logprob.kernels.builtin import (
    TRITON_EXACT_SUM,
    TRITON_FUSED,
    TRITON_FUSED_EXACT_SUM,
    TRITON_ONLINE,
    TRITON_PORTABLE,
)
from tp_logprob.kernels.triton.interpreted import plain_interpreter
from tp_logprob.strategies import HiddenCase, LogprobCase, cases, hidden_cases
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.running import execute

pytestmark = [
    pytest.mark.triton,
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") != "1", reason="runs the Triton interpreter"
    ),
]

_LOGITS = (TRITON_ONLINE, TRITON_EXACT_SUM, TRITON_PORTABLE)
_HIDDEN = (TRITON_FUSED, TRITON_FUSED_EXACT_SUM)
_SETTINGS = settings(
    max_examples=6, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


def _backend(capability: Any) -> BackendUnderTest:
    return BackendUnderTest(capability.backend_id, capability, tpl.registry, "cpu")


def _bits(values: Any) -> Any:
    """A value's bits, NaN payloads and signed zeros included (None stays None)."""
    if values is None:
        return None
    if isinstance(values, torch.Tensor):
        values = values.detach().float().cpu().numpy()
    array = np.ascontiguousarray(np.asarray(values, dtype=np.float64))
    return array.view(np.uint64).tolist()


def _run(backend: BackendUnderTest, case: LogprobCase) -> dict[str, Any]:
    """Every output of one forward and, for train, the gradients of a weighted loss."""
    train = case.contract.role.value == "train"
    leaves: list[torch.Tensor] = []
    if isinstance(case, HiddenCase):
        operands = [
            None if tensor is None else tensor.requires_grad_(train)
            for tensor in case.torch_inputs("cpu")
        ]
        leaves = [tensor for tensor in operands if tensor is not None]
        outputs = execute(backend, case, operands=tuple(operands))
    else:
        logits = case.torch_logits("cpu").requires_grad_(train)
        leaves = [logits]
        outputs = execute(backend, case, logits=logits)
    found = {
        name: _bits(getattr(outputs, name))
        for name in (
            "selected", "lse", "entropy", "support_lse", "support_size", "support_threshold",
        )
    }  # fmt: skip
    if train:
        weights = torch.linspace(0.5, 1.5, case.contract.num_tokens)
        total = sum(
            (weights * result.selected_logp).sum()
            + (0.0 if result.entropy is None else (weights.flip(0) * result.entropy).sum())
            for result in outputs.results
        )
        if isinstance(total, torch.Tensor) and total.requires_grad:
            torch.autograd.backward(total)
        found["gradients"] = [_bits(leaf.grad) for leaf in leaves]
    return found


def _same_bits(capability: Any, case: LogprobCase) -> None:
    backend = _backend(capability)
    shortcut = _run(backend, case)
    with plain_interpreter():
        plain = _run(backend, case)
    for name, values in plain.items():
        assert shortcut[name] == values, f"{capability.backend_id}: {name} differs"


@pytest.mark.parametrize("capability", _LOGITS, ids=lambda c: c.backend_id)
def test_logits_backends_give_the_plain_interpreters_bits(capability: Any) -> None:
    @_SETTINGS
    @given(
        cases(
            capability=capability,
            special_values=True,
            max_num_tokens=4,
            max_padded_vocab_size=40,
        )
    )
    def check(case: LogprobCase) -> None:
        assert case.contract.input_kind is LogprobInputKind.LOGITS
        _same_bits(capability, case)

    check()


@pytest.mark.parametrize("capability", _HIDDEN, ids=lambda c: c.backend_id)
def test_fused_backends_give_the_plain_interpreters_bits(capability: Any) -> None:
    @_SETTINGS
    @given(hidden_cases(capability=capability, max_num_tokens=3, max_padded_vocab_size=24))
    def check(case: HiddenCase) -> None:
        _same_bits(capability, case)

    check()


def test_plain_interpreter_nests_and_is_restored() -> None:
    from tp_logprob.kernels.triton import interpreted

    with plain_interpreter():
        assert interpreted._PLAIN
        with plain_interpreter():
            assert interpreted._PLAIN
        assert interpreted._PLAIN
    assert not interpreted._PLAIN
