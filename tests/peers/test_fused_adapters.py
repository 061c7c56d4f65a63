"""The fused LM-head adapters against the exact oracle on tiny cases.

Each adapter takes hidden states and weight rows (``input_kind="hidden"``). The
liger_flce cases need liger-kernel and, on CPU, ``TRITON_INTERPRET=1`` (``nox -s
conformance`` has both); without them they are skipped and only the checks that
run before any library call remain. The property suite judges the adapters
thoroughly; these tests pin values, untouched inputs and gradients.
"""

from __future__ import annotations

import os
from importlib import metadata
from typing import Any

import numpy as np
import pytest
import torch

import tp_logprob as tpl
from tp_logprob.oracle import (
    dot_product_error_bound,
    exact_hidden_logits,
    exact_selected_logprob,
    fused_extra_bounds,
    tolerance,
)
from tp_logprob.oracle.tolerance import within_tolerance
from tp_logprob.peers import liger_fused
from tp_logprob.peers._releases import parse_release

VOCAB, SIZE, TOKENS = 19, 16, 6


def _liger_op() -> Any:
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Liger's Triton kernel runs on CPU only with TRITON_INTERPRET=1")
    pytest.importorskip("liger_kernel")
    return liger_fused.honest[0]


def _contract(role: str = "infer", *, bias: bool = False, **fields: Any) -> tpl.LogprobContract:
    sharding = tpl.ShardingSpec(0, 1, ((0, VOCAB),), VOCAB, VOCAB)
    return tpl.LogprobContract(
        role,
        "fp32",
        tpl.MaskSpec(TOKENS),
        sharding,
        tpl.ReductionSpec("run_to_run"),
        input_kind="hidden",
        hidden_size=SIZE,
        has_bias=bias,
        **fields,
    )


def _case(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hidden (row 1 all zero: a row of ties on the bias; row 4 big: a peaked row)."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(TOKENS, SIZE, generator=gen)
    hidden[1] = 0.0
    hidden[4] *= 40.0
    weight = torch.randn(VOCAB, SIZE, generator=gen) * 0.5
    bias = torch.randn(VOCAB, generator=gen)
    targets = torch.randint(0, VOCAB, (TOKENS,), generator=gen)
    targets[4] = int((hidden[4] @ weight.T).argmin())  # a target ~100 nats below the max
    return hidden, weight, bias, targets


def _oracle(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Exact ``(selected, lse)`` on fp32(x_exact) and their bounds for a fp32-dot kernel.

    The LSE bound carries the fused extra twice: liger_flce's LSE adds a nearly exact
    ``x[argmax]`` to Liger's ``lse - x[argmax]`` (see the adapter's docstring).
    """
    h, w = hidden.detach().double().numpy(), weight.double().numpy()
    b = None if bias is None else bias.double().numpy()
    x = exact_hidden_logits(h, w, b)
    x32 = x.astype(np.float32).astype(np.float64)
    selected, lse = exact_selected_logprob(x32, targets.numpy())
    lse_extra, selected_extra, _ = fused_extra_bounds(
        x, dot_product_error_bound(h, w, b), targets.numpy()
    )
    tol = tolerance("fp32", VOCAB, rescales=2)
    row_max = x32.max(axis=1)
    lse_bound = tol.lse_bound(lse, row_max=row_max) + 2.0 * lse_extra
    selected_bound = tol.selected_bound(selected, lse, row_max=row_max) + selected_extra
    return selected, lse, selected_bound, lse_bound


def _assert_within(got: torch.Tensor, want: np.ndarray, bound: np.ndarray, what: str) -> None:
    values = got.detach().double().numpy()
    bad = np.nonzero(~within_tolerance(values, want, bound))[0]
    assert bad.size == 0, f"{what}: rows {bad.tolist()}: got {values[bad]!r}, want {want[bad]!r}"


@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_liger_flce_matches_the_exact_oracle_and_leaves_inputs_alone(with_bias: bool) -> None:
    op = _liger_op()
    hidden, weight, bias, targets = _case(seed=11)
    hidden.requires_grad_()  # a trainer's call (see the no-grad test for an engine's)
    biases = bias if with_bias else None
    before = [t.clone() for t in (hidden, weight, bias, targets)]
    versions = [t._version for t in (hidden, weight, bias)]
    result = tpl.run_tp_hidden(op, hidden, weight, targets, _contract(bias=with_bias), bias=biases)[
        0
    ]
    selected, lse, selected_bound, lse_bound = _oracle(hidden, weight, biases, targets)
    assert result.lse is not None
    assert result.selected_logp.dtype == result.lse.dtype == torch.float32
    _assert_within(result.lse, lse, lse_bound, "lse")
    _assert_within(result.selected_logp, selected, selected_bound, "selected_logp")
    assert selected[4] < -50.0  # the far-below target is in the case
    for now, then in zip((hidden, weight, bias, targets), before, strict=True):
        assert torch.equal(now, then)
    assert [t._version for t in (hidden, weight, bias)] == versions


def test_liger_flce_special_rows() -> None:
    """NaN in a hidden row gives NaN; a +inf logit gives lse +inf, selected NaN."""
    op = _liger_op()
    hidden, weight, _, targets = _case(seed=5)
    hidden[2, 3] = float("nan")
    hidden[3] = 0.0
    hidden[3, 0] = float("inf")
    weight[:, 0] = weight[:, 0].abs() + 0.5
    weight[7, 0] = -1.0  # row 3: +inf logits, and -inf in column 7
    result = tpl.run_tp_hidden(op, hidden.requires_grad_(), weight, targets, _contract())[0]
    assert result.lse is not None
    x = exact_hidden_logits(hidden.detach().double().numpy(), weight.double().numpy())
    want_selected, want_lse = exact_selected_logprob(x.astype(np.float32), targets.numpy())
    for name, got, want in (
        ("lse", result.lse, want_lse),
        ("selected_logp", result.selected_logp.detach(), want_selected),
    ):
        for row in (2, 3):
            assert np.isnan(float(got[row])) == np.isnan(want[row]), (name, row)
            if not np.isnan(want[row]):
                assert float(got[row]) == want[row], (name, row)


@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_liger_flce_on_an_input_that_needs_no_gradient_by_release(with_bias: bool) -> None:
    """An engine's call (no gradient). Peer bugs, pinned: 0.6.3 reads its gradient buffers
    unassigned (``UnboundLocalError``); 0.6.4 to 0.7.x detach a gradient buffer it left
    ``None`` where a bias is given (``AttributeError``); the other served releases answer."""
    op = _liger_op()
    hidden, weight, bias, targets = _case(seed=11)
    release = parse_release(metadata.version("liger-kernel"))
    crash: type[Exception] | None = None
    if (0, 6, 3) <= release < (0, 6, 4):
        crash = UnboundLocalError
    elif (0, 6, 4) <= release < (0, 8, 0) and with_bias:
        crash = AttributeError
    biases = bias if with_bias else None
    contract = _contract(bias=with_bias)
    if crash is not None:
        with pytest.raises(crash):
            tpl.run_tp_hidden(op, hidden, weight, targets, contract, bias=biases)
        return
    result = tpl.run_tp_hidden(op, hidden, weight, targets, contract, bias=biases)[0]
    selected, _, selected_bound, _ = _oracle(hidden, weight, biases, targets)
    _assert_within(result.selected_logp, selected, selected_bound, "selected_logp")


@pytest.mark.parametrize("varied", [False, True], ids=["uniform-upstream", "varied-upstream"])
def test_liger_flce_gradients_match_float64_autograd(varied: bool) -> None:
    """Before 0.8.2 (a peer bug, pinned) every row's gradient is scaled by the first
    element of the upstream gradient; a uniform upstream gradient hides it."""
    op = _liger_op()
    hidden, weight, bias, targets = _case(seed=3)
    hidden[4] /= 40.0  # keep every softmax weight visible in fp32
    params = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    result = tpl.run_tp_hidden(
        op, params[0], params[1], targets, _contract("train", bias=True), bias=params[2]
    )[0]
    upstream = torch.linspace(-1.0, 2.0, TOKENS) if varied else torch.full((TOKENS,), 0.5)
    (result.selected_logp * upstream).sum().backward()
    if parse_release(metadata.version("liger-kernel")) < (0, 8, 2):
        upstream = torch.full_like(upstream, float(upstream[0]))
    reference = [t.detach().double().requires_grad_() for t in (hidden, weight, bias)]
    logits = reference[0] @ reference[1].T + reference[2]
    logp = torch.log_softmax(logits, dim=1).gather(1, targets[:, None])[:, 0]
    (logp * upstream.double()).sum().backward()
    for name, got, want in zip(("hidden", "weight", "bias"), params, reference, strict=True):
        assert got.grad is not None and want.grad is not None
        torch.testing.assert_close(
            got.grad.double(), want.grad, rtol=1e-5, atol=1e-6, msg=f"d {name}"
        )


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"dtype": "bf16"}, "dtype 'bf16'"),
        ({"padding": True}, "vocabulary padding"),
        ({"tp": 2}, "tp_world_size 2"),
        ({"inactive": True}, "mask mode 'explicit_active_mask'"),
        ({"temperature": 0.5}, "temperature=0.5"),
        ({"export_entropy": True}, "export_entropy"),
        ({"logits": True}, "input_kind 'logits'"),
    ],
    ids=lambda value: next(iter(value)) if isinstance(value, dict) else None,
)
def test_liger_flce_capability_rejects_what_liger_cannot_serve(
    fields: dict[str, Any], reason: str
) -> None:
    tp, padded = fields.pop("tp", 1), VOCAB + 5 * fields.pop("padding", False)
    mask = tpl.MaskSpec(
        TOKENS, [True] * (TOKENS - 1) + [False] if fields.pop("inactive", False) else None
    )
    hidden = {} if fields.pop("logits", False) else {"input_kind": "hidden", "hidden_size": SIZE}
    contract = tpl.LogprobContract(
        "infer",
        fields.pop("dtype", "fp32"),
        mask,
        tpl.ShardingSpec(0, tp, tpl.even_shard_bounds(padded, tp), VOCAB, padded),
        tpl.ReductionSpec("run_to_run"),  # liger_flce's honest scope
        **hidden,
        **fields,
    )
    reasons = liger_fused.CAPABILITY.incompatibilities(contract)
    assert len(reasons) == 1 and reason in reasons[0], reasons
    assert liger_fused.CAPABILITY.supports(_contract("train", bias=True))


def test_liger_flce_checks_its_arguments_before_calling_liger() -> None:
    hidden, weight, bias, targets = _case(seed=1)
    op = liger_fused.liger_fused_logprob
    with pytest.raises(tpl.LogprobContractError, match="has_bias=False"):
        op(hidden, targets, _contract(), weight=weight, bias=bias)
    with pytest.raises(tpl.LogprobContractError, match="bias"):
        op(hidden, targets, _contract(bias=True), weight=weight)
    with pytest.raises(tpl.LogprobContractError, match=r"weight: shape \(18, 16\)"):
        op(hidden, targets, _contract(), weight=weight[:-1])
    with pytest.raises(tpl.LogprobContractError, match="active target"):
        op(hidden, torch.full((TOKENS,), VOCAB), _contract(), weight=weight)
    logits = tpl.LogprobContract(
        "infer",
        "fp32",
        tpl.MaskSpec(TOKENS),
        tpl.ShardingSpec(0, 1, ((0, VOCAB),), VOCAB, VOCAB),
        tpl.ReductionSpec("fixed_topology"),
    )
    with pytest.raises(tpl.LogprobContractError, match="input_kind='logits'"):
        op(hidden, targets, logits, weight=weight)


def test_liger_flce_on_cpu_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    hidden, weight, _, targets = _case(seed=1)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        liger_fused.liger_fused_logprob(hidden, targets, _contract(), weight=weight)
