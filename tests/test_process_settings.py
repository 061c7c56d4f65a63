"""Importing the package and calling its entry points leaves every process setting alone.

One test per setting (:mod:`tests.helpers.process_settings`): importing every module of
``tp_logprob`` in a fresh interpreter, and each call below, leaves it as it was; a
setting of the whole process is also the same, seen from the rank threads, while
``run_tp`` runs a user's op. The fixes each setting has had live beside their own
tests (the fused products' matmul precision, the drift plot's matplotlib backend, the
Triton interpreter shortcuts, the Cut Cross-Entropy recompile limit, the Liger warnings
filters, the real group's shrinking time limit); this is the net under all of them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tp_logprob as tpl
from tests.helpers.fused_cases import PADDED, fused_case, fused_contract
from tests.helpers.process_settings import GLOBAL_SETTINGS, THREAD_SETTINGS, snapshot
from tp_logprob.kernels.native import torch_native_logprob
from tp_logprob.kernels.native_fused import torch_native_fused_logprob
from tp_logprob.testing import assert_logprob_close

ROOT = Path(__file__).resolve().parents[1]
READERS = {**GLOBAL_SETTINGS, **THREAD_SETTINGS}

IMPORT_EVERY_MODULE = textwrap.dedent(
    """
    import importlib, json, pkgutil
    from tests.helpers.process_settings import GLOBAL_SETTINGS, THREAD_SETTINGS, snapshot
    readers = {**GLOBAL_SETTINGS, **THREAD_SETTINGS}
    before = snapshot(readers)
    import tp_logprob
    for module in pkgutil.walk_packages(tp_logprob.__path__, "tp_logprob."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    after = snapshot(readers)
    print(json.dumps({name: [before[name], after[name]] for name in readers}))
    """
)


@pytest.fixture(scope="module")
def on_import() -> dict[str, list[str]]:
    """Each setting before and after importing every module, in a fresh interpreter."""
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERY_MODULE],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    found: dict[str, list[str]] = json.loads(run.stdout.splitlines()[-1])
    return found


def _contract(tp: int) -> tpl.LogprobContract:
    sharding = tpl.ShardingSpec(0, tp, tpl.even_shard_bounds(8, tp), 8, 8)
    return tpl.LogprobContract(
        "train", "fp32", tpl.MaskSpec(3), sharding, tpl.ReductionSpec("fixed_topology")
    )


def _case() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(4)
    return torch.randn(3, 8, generator=gen), torch.tensor([0, 5, 7])


def _run_tp(seen: list[dict[str, str]]) -> None:
    """``run_tp`` at TP=2 with a user's op that reads the process's settings on its rank."""

    def op(local: torch.Tensor, targets: torch.Tensor, contract: Any, group: Any) -> Any:
        seen.append(snapshot(GLOBAL_SETTINGS))
        return torch_native_logprob(local, targets, contract, group)

    logits, targets = _case()
    tpl.run_tp(op, logits.requires_grad_(True), targets, _contract(tp=2))


def _assert_close(seen: list[dict[str, str]]) -> None:
    """The assert for other projects, on a kernel's correct values."""
    logits, targets = _case()
    logp = torch.log_softmax(logits.double(), dim=1)
    selected = logp.gather(1, targets[:, None])[:, 0].float()
    assert_logprob_close(selected, logits, targets, lse=torch.logsumexp(logits, dim=1))


def _native_train(seen: list[dict[str, str]]) -> None:
    """The built-in kernel's train call and its backward pass."""
    logits, targets = _case()
    logits.requires_grad_(True)
    result = torch_native_logprob(logits, targets, _contract(tp=1))
    result.selected_logp.sum().backward()


def _fused_train(seen: list[dict[str, str]]) -> None:
    """The built-in fused kernel's train call (its float64 products) and backward pass."""
    hidden, weight, _, targets = fused_case("fp32", seed=2)
    hidden.requires_grad_(True)
    result = torch_native_fused_logprob(
        hidden, targets, fused_contract(((0, PADDED),), role="train"), weight=weight
    )
    result.selected_logp.sum().backward()


def _triton(seen: list[dict[str, str]]) -> None:
    """A built-in Triton kernel at TP=2 (the interpreter on CPU, with its shortcuts)."""
    if importlib.util.find_spec("triton") is None or (
        not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
    ):
        return
    from tp_logprob.kernels.triton.online import triton_online_logprob

    logits, targets = _case()
    tpl.run_tp(triton_online_logprob, logits, targets, _contract(tp=2))


CALLS: dict[str, Callable[[list[dict[str, str]]], None]] = {
    "run_tp": _run_tp,
    "assert_logprob_close": _assert_close,
    "torch_native train": _native_train,
    "torch_native_fused train": _fused_train,
    "triton_online": _triton,
}


@pytest.fixture(scope="module")
def on_call() -> dict[str, tuple[dict[str, str], list[dict[str, str]], dict[str, str]]]:
    """Each call's settings before, during (seen by a user's op) and after it."""
    found = {}
    for name, call in CALLS.items():
        seen: list[dict[str, str]] = []
        before = snapshot(READERS)
        call(seen)
        found[name] = (before, seen, snapshot(READERS))
    return found


@pytest.mark.parametrize("setting", sorted(READERS))
def test_importing_every_module_leaves_it(setting: str, on_import: dict[str, list[str]]) -> None:
    before, after = on_import[setting]
    assert after == before


@pytest.mark.parametrize("setting", sorted(READERS))
def test_a_call_leaves_it(
    setting: str,
    on_call: dict[str, tuple[dict[str, str], list[dict[str, str]], dict[str, str]]],
) -> None:
    changed = [
        name for name, (before, _, after) in on_call.items() if after[setting] != before[setting]
    ]
    assert not changed, f"{setting} changed by {changed}"


@pytest.mark.parametrize("setting", sorted(GLOBAL_SETTINGS))
def test_a_users_op_sees_it_as_the_caller_left_it(
    setting: str,
    on_call: dict[str, tuple[dict[str, str], list[dict[str, str]], dict[str, str]]],
) -> None:
    before, seen, _ = on_call["run_tp"]
    assert len(seen) == 2
    assert [inside[setting] for inside in seen] == [before[setting]] * 2


def test_the_readers_see_a_change() -> None:
    """Each reader can fail: a change of its setting changes what it reads."""
    before = snapshot(READERS)
    with np.errstate(divide="ignore"), torch.no_grad():
        assert snapshot(THREAD_SETTINGS) != {k: before[k] for k in THREAD_SETTINGS}
    torch.rand(1)
    assert GLOBAL_SETTINGS["torch global RNG"]() != before["torch global RNG"]
