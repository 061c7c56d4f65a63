"""The Cut Cross-Entropy adapter against the exact oracle on tiny cases.

The adapter takes hidden states and classifier rows (``input_kind="hidden"``) and runs
the library's ``torch_compile`` implementation; the cases that call it are skipped where
cut-cross-entropy is absent, and only the checks that run before any library call
remain. The property suite judges the adapter thoroughly; these tests pin values, the
LSE glue, special rows, ignored rows, untouched inputs and gradients.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.torch_version import TorchVersion
from torch.utils.flop_counter import FlopCounterMode

import tp_logprob as tpl
from tests.helpers.contracts import whole_vocabulary_contract, whole_vocabulary_hidden_contract
from tp_logprob.oracle import (
    dot_product_error_bound,
    exact_hidden_logits,
    exact_selected_logprob,
    fused_extra_bounds,
    tolerance,
)
from tp_logprob.oracle.tolerance import within_tolerance
from tp_logprob.peers import cce

VOCAB, SIZE, TOKENS = 19, 16, 6


def _op() -> Any:
    pytest.importorskip("cut_cross_entropy", reason="cut-cross-entropy is not installed here")
    return cce.honest[0]


def _contract(role: str = "infer", **fields: Any) -> tpl.LogprobContract:
    return whole_vocabulary_hidden_contract(VOCAB, SIZE, TOKENS, role, **fields)


def _case(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hidden (row 1 all zero: a row of ties; row 4 big: a peaked row), weight, targets."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(TOKENS, SIZE, generator=gen)
    hidden[1] = 0.0
    hidden[4] *= 40.0
    weight = torch.randn(VOCAB, SIZE, generator=gen) * 0.5
    targets = torch.randint(0, VOCAB, (TOKENS,), generator=gen)
    targets[4] = int((hidden[4] @ weight.T).argmin())  # a target ~100 nats below the max
    return hidden, weight, targets


def _assert_within(got: torch.Tensor, want: np.ndarray, bound: np.ndarray, what: str) -> None:
    values = got.detach().double().numpy()
    bad = np.nonzero(~within_tolerance(values, want, bound))[0]
    assert bad.size == 0, f"{what}: rows {bad.tolist()}: got {values[bad]!r}, want {want[bad]!r}"


def test_matches_the_exact_oracle_and_leaves_inputs_alone() -> None:
    op = _op()
    hidden, weight, targets = _case(seed=11)
    before = [t.clone() for t in (hidden, weight, targets)]
    result = tpl.run_tp_hidden(op, hidden, weight, targets, _contract())[0]
    h, w = hidden.double().numpy(), weight.double().numpy()
    x = exact_hidden_logits(h, w)
    selected, lse = exact_selected_logprob(x.astype(np.float32).astype(np.float64), targets.numpy())
    lse_extra, selected_extra, _ = fused_extra_bounds(
        x, dot_product_error_bound(h, w, None), targets.numpy()
    )
    tol, row_max = tolerance("fp32", VOCAB, rescales=2), x.astype(np.float32).max(axis=1)
    # The LSE carries the fused extra twice: the library's lse - x[a] plus a nearly exact x[a].
    _assert_within(result.lse, lse, tol.lse_bound(lse, row_max=row_max) + 2 * lse_extra, "lse")
    bound = tol.selected_bound(selected, lse, row_max=row_max) + selected_extra
    _assert_within(result.selected_logp, selected, bound, "selected_logp")
    assert selected[4] < -50.0  # the far-below target is in the case
    for now, then in zip((hidden, weight, targets), before, strict=True):
        assert torch.equal(now, then)


def test_special_rows() -> None:
    """NaN in a hidden row gives NaN; a +inf logit gives lse +inf, selected NaN."""
    op = _op()
    hidden, weight, targets = _case(seed=5)
    hidden[2, 3] = float("nan")
    hidden[3] = 0.0
    hidden[3, 0] = float("inf")
    weight[:, 0] = weight[:, 0].abs() + 0.5
    weight[7, 0] = -1.0  # row 3: +inf logits, and -inf in column 7
    result = tpl.run_tp_hidden(op, hidden, weight, targets, _contract())[0]
    x = exact_hidden_logits(hidden.double().numpy(), weight.double().numpy())
    want_selected, want_lse = exact_selected_logprob(x.astype(np.float32), targets.numpy())
    outputs = (("lse", result.lse, want_lse), ("selected", result.selected_logp, want_selected))
    for name, got, want in outputs:
        for row in (2, 3):
            assert np.isnan(float(got[row])) == np.isnan(want[row]), (name, row)
            if not np.isnan(want[row]):
                assert float(got[row]) == want[row], (name, row)


def test_an_inactive_row_is_zero_only_when_its_target_is_ignore_index() -> None:
    """What assume_inactive_tokens claims: CCE drops the rows whose target is ignore_index
    (a loss of +0.0) and reads every other target, an inactive row's too."""
    op = _op()
    hidden, weight, targets = _case(seed=2)
    targets[3], targets[5] = -100, 7
    active = [True] * TOKENS
    active[3] = active[5] = False
    contract = _contract(mask=tpl.MaskSpec(TOKENS, active_mask=active, ignore_index=-100))
    selected = tpl.run_tp_hidden(op, hidden, weight, targets, contract)[0].selected_logp
    assert selected[3].item() == 0.0 and not torch.signbit(selected[3])
    expected = torch.log_softmax(hidden[5].double() @ weight.double().T, dim=0)[7]
    assert selected[5].item() == pytest.approx(expected.item(), rel=1e-5)


def test_gradients_match_float64_autograd() -> None:
    op = _op()
    hidden, weight, targets = _case(seed=3)
    hidden[4] /= 40.0  # keep every softmax weight visible in fp32
    params = [t.clone().requires_grad_() for t in (hidden, weight)]
    result = tpl.run_tp_hidden(op, params[0], params[1], targets, _contract("train"))[0]
    upstream = torch.linspace(-1.0, 2.0, TOKENS)
    (result.selected_logp * upstream).sum().backward()
    reference = [t.detach().double().requires_grad_() for t in (hidden, weight)]
    logp = torch.log_softmax(reference[0] @ reference[1].T, dim=1).gather(1, targets[:, None])
    (logp[:, 0] * upstream.double()).sum().backward()
    for name, got, want in zip(("hidden", "weight"), params, reference, strict=True):
        assert got.grad is not None and want.grad is not None
        torch.testing.assert_close(got.grad.double(), want.grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"dtype": "bf16"}, "dtype 'bf16'"),
        ({"has_bias": True}, "bias"),
        ({"temperature": 0.5}, "temperature=0.5"),
        ({"export_entropy": True}, "export_entropy"),
    ],
    ids=["bf16", "bias", "temperature", "entropy"],
)
def test_the_capability_rejects_what_the_library_cannot_serve(
    fields: dict[str, Any], reason: str
) -> None:
    reasons = cce.CAPABILITY.incompatibilities(_contract(**fields))
    assert len(reasons) == 1 and reason in reasons[0], reasons
    assert cce.CAPABILITY.supports(_contract("train"))


def test_refuses_a_torch_whose_dynamo_config_is_the_whole_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch, "__version__", TorchVersion("2.11.0"))
    monkeypatch.setattr(cce, "_linear_cross_entropy", lambda: pytest.fail("library called"))
    hidden, weight, targets = _case(seed=1)
    with pytest.raises(tpl.LogprobDispatchError, match=r"torch 2\.11\.0: .* whole process's"):
        cce.cce_logprob(hidden, targets, _contract(), weight=weight)


@pytest.mark.skipif(torch.__version__ < "2.12", reason="the adapter refuses torch<2.12")
def test_the_raised_recompile_limit_is_the_calling_threads_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A user's thread beside the call reads its own Dynamo recompile limit while the call
    holds 256, and a limit it sets meanwhile is still its own after the call."""
    inside, user_set, call_done = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, int] = {}

    def user() -> None:
        seen["user before"] = torch._dynamo.config.recompile_limit
        inside.wait(timeout=60)
        seen["user during"] = torch._dynamo.config.recompile_limit
        torch._dynamo.config.recompile_limit = 12
        user_set.set()
        call_done.wait(timeout=60)
        seen["user after"] = torch._dynamo.config.recompile_limit

    def library(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, **_: Any) -> Any:
        seen["call"] = torch._dynamo.config.recompile_limit
        inside.set()
        user_set.wait(timeout=60)
        return torch.zeros(targets.shape[0])

    monkeypatch.setattr(cce, "_linear_cross_entropy", lambda: library)
    before = torch._dynamo.config.recompile_limit
    hidden, weight, targets = _case(seed=2)
    thread = threading.Thread(target=user)
    thread.start()
    try:
        cce.cce_logprob(hidden, targets, _contract(export_lse=False), weight=weight)
    finally:
        call_done.set()
        thread.join()
    assert seen["call"] == 256
    assert seen["user during"] == seen["user before"] != 256
    assert seen["user after"] == 12
    assert torch._dynamo.config.recompile_limit == before


def test_checks_its_arguments_before_calling_the_library() -> None:
    hidden, weight, targets = _case(seed=1)
    with pytest.raises(tpl.LogprobContractError, match="no bias"):
        cce.cce_logprob(hidden, targets, _contract(), weight=weight, bias=torch.zeros(VOCAB))
    with pytest.raises(tpl.LogprobContractError, match="weight: shape"):
        cce.cce_logprob(hidden, targets, _contract(), weight=weight[:, :3])
    with pytest.raises(tpl.LogprobContractError, match="input_kind='logits'"):
        logits_contract = whole_vocabulary_contract(VOCAB, TOKENS)
        cce.cce_logprob(hidden, targets, logits_contract, weight=weight)


def test_a_call_under_a_dispatch_mode_breaks_the_later_calls() -> None:
    """docs/repro_cce_dispatch_mode.py, in a process of its own (the break is process-wide)."""
    pytest.importorskip("cut_cross_entropy", reason="cut-cross-entropy is not installed here")
    script = Path(__file__).resolve().parents[2] / "docs" / "repro_cce_dispatch_mode.py"
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "after the mode: torch.compile with fullgraph=True found no compiled" in run.stdout


def test_the_adapter_runs_the_library_again_after_a_call_under_a_dispatch_mode() -> None:
    """The call under the mode raises (the library's limitation); the next one computes, and
    a user's own compiled function keeps its compiled code throughout (no recompile)."""
    op = _op()
    compiles: list[int] = []

    def counting(graph: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
        compiles.append(len(inputs))
        return graph.forward

    @torch.compile(backend=counting, fullgraph=True)
    def user(x: torch.Tensor) -> torch.Tensor:
        return (x * 2.0).sum()

    user(torch.ones(3))
    hidden, weight, targets = _case(seed=7)
    with FlopCounterMode(display=False), pytest.raises(RuntimeError, match="compiled frames"):
        op(hidden, targets, _contract(), weight=weight)
    result = op(hidden, targets, _contract(), weight=weight)
    logp = torch.log_softmax(hidden.double() @ weight.double().T, dim=1)
    expected = logp.gather(1, targets[:, None])[:, 0]
    torch.testing.assert_close(result.selected_logp.double(), expected, rtol=1e-5, atol=1e-5)
    assert user(torch.ones(3)).item() == 6.0
    assert len(compiles) == 1


def test_an_out_of_range_target_kills_the_process_with_two_threads() -> None:
    """docs/repro_cce_out_of_range_target_aborts.py: SIGABRT with two threads, an exception
    with one (each call in a process of its own)."""
    pytest.importorskip("cut_cross_entropy", reason="cut-cross-entropy is not installed here")
    script = (
        Path(__file__).resolve().parents[2] / "docs" / "repro_cce_out_of_range_target_aborts.py"
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "2 thread(s): the process died of signal 6" in run.stdout
    assert "1 thread(s): RuntimeError:" in run.stdout
