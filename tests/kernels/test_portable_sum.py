"""triton_portable and torch_portable: the same bits as each other for every layout, within
the oracle's tolerance, and the same bits as triton_exact_sum wherever its exp and log
round alike (CPU interpreter)."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import numpy as np
import pytest
import torch

import tp_logprob as tpl
from tests.helpers.native_cases import LAYOUTS, make_contract
from tests.helpers.rl_cases import rl_contract
from tests.helpers.triton_cases import BACKENDS, DEVICE, bits_of, oracle_report
from tests.kernels.test_triton_exact_sum import MASK, adversarial_inputs
from tp_logprob.emulate import run_tp
from tp_logprob.errors import LogprobContractError
from tp_logprob.kernels.native import torch_native_logprob
from tp_logprob.kernels.portable_sum import torch_portable_logprob

pytestmark = pytest.mark.triton

_portable = importlib.import_module("tp_logprob.kernels.triton.portable_sum")
triton_portable = _portable.triton_portable_logprob


def entropy_bits(result: object) -> list[int]:
    entropy = result.entropy  # type: ignore[attr-defined]
    return entropy.contiguous().view(torch.int32).tolist()


@pytest.mark.skipif(DEVICE.type != "cpu", reason="torch_portable is registered on CPU")
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("layout", ["tp1", "tp3-uneven", "tp8-mixed"])
def test_triton_and_torch_give_the_same_bits(dtype: str, layout: str) -> None:
    logits, targets = adversarial_inputs(dtype)
    contract = make_contract(LAYOUTS[layout], num_tokens=len(MASK), active_mask=MASK, dtype=dtype)
    kernel = run_tp(triton_portable, logits, targets, contract)[0]
    twin = run_tp(torch_portable_logprob, logits, targets, contract)[0]
    assert bits_of(kernel) == bits_of(twin)
    assert oracle_report("triton_exact_sum", kernel, logits, targets, contract) is None


@pytest.mark.skipif(DEVICE.type != "cpu", reason="torch_portable is registered on CPU")
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_entropy_and_temperature_give_the_same_bits(temperature: float) -> None:
    logits, targets = adversarial_inputs("bf16")
    reference = None
    for layout in ("tp1", "tp2-width1", "tp4-width1-padding"):
        contract = rl_contract(
            LAYOUTS[layout],
            temperature=temperature,
            num_tokens=len(MASK),
            active_mask=MASK,
            dtype="bf16",
        )
        kernel = run_tp(triton_portable, logits, targets, contract)[0]
        twin = run_tp(torch_portable_logprob, logits, targets, contract)[0]
        assert bits_of(kernel) == bits_of(twin), layout
        assert entropy_bits(kernel) == entropy_bits(twin), layout
        reference = reference or (bits_of(kernel), entropy_bits(kernel))
        assert (bits_of(kernel), entropy_bits(kernel)) == reference, layout


def test_close_to_the_platform_exp_backend() -> None:
    """The portable exp and log change at most a few ulps against triton_exact_sum."""
    logits, targets = adversarial_inputs("fp32")
    contract = make_contract(LAYOUTS["tp3-uneven"], num_tokens=len(MASK), active_mask=MASK)
    ours = run_tp(triton_portable, logits, targets, contract)[0]
    theirs = run_tp(BACKENDS["triton_exact_sum"], logits, targets, contract)[0]
    for a, b in ((ours.lse, theirs.lse), (ours.selected_logp, theirs.selected_logp)):
        finite = torch.isfinite(b)
        assert torch.equal(torch.isnan(a), torch.isnan(b))
        assert torch.equal(a[~finite & ~torch.isnan(b)], b[~finite & ~torch.isnan(b)])
        gap = np.abs(a[finite].double().numpy() - b[finite].double().numpy())
        assert (gap <= 4 * np.spacing(np.abs(b[finite].numpy()))).all()


def test_a_signed_zero_maximum_gives_one_answer() -> None:
    """M = -0 and M = +0 give the same bits: the sign a platform's max picks never shows."""
    logits = torch.full((2, 24), float("-inf"))
    logits[0, :2] = torch.tensor([-0.0, 0.0])
    logits[1, :2] = torch.tensor([0.0, -0.0])
    targets = torch.tensor([0, 0])
    contract = make_contract(LAYOUTS["tp1"], num_tokens=2)
    for op in (triton_portable, torch_portable_logprob):
        result = op(logits, targets, contract)
        view = result.selected_logp.view(torch.int32)
        assert view[0] == view[1], op


@pytest.mark.parametrize(
    ("change", "match"),
    [({"support": {"top_k": 3}}, "support=")],
    ids=["support"],
)
def test_torch_twin_refuses_what_it_does_not_serve(change: dict[str, Any], match: str) -> None:
    logits, targets = adversarial_inputs("fp32")
    role = change.get("role", "infer")
    contract = make_contract(LAYOUTS["tp1"], num_tokens=len(MASK), active_mask=MASK, role=role)
    if "support" in change:
        contract = dataclasses.replace(contract, support=tpl.SupportSpec(**change["support"]))
    with pytest.raises(LogprobContractError, match=match):
        torch_portable_logprob(logits, targets, contract)


def test_native_backend_differs_somewhere() -> None:
    """The bitwise test has power: torch_native's platform exp gives other bits."""
    logits, targets = adversarial_inputs("fp32")
    contract = make_contract(LAYOUTS["tp1"], num_tokens=len(MASK), active_mask=MASK)
    native = torch_native_logprob(logits, targets, contract)
    assert bits_of(native) != bits_of(torch_portable_logprob(logits, targets, contract))


class _FakeKernel:
    """Stands in for a compiled kernel: records the launch options it is called with."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        return lambda *args, **options: self.calls.append(options)


@pytest.mark.parametrize("fusion", [True, False])
def test_a_config_without_fusion_launches_with_enable_fp_fusion_false(fusion: bool) -> None:
    launch = importlib.import_module("tp_logprob.kernels.triton.launch")
    config = launch.launch_config("cuda", launch.KernelKind.ROW, torch.float32, fp_fusion=fusion)
    kernel = _FakeKernel()
    launch.launch(kernel, (1,), config, torch.zeros(1, device="meta"), 7, ENTROPY=True)
    (options,) = kernel.calls
    assert options.get("enable_fp_fusion", True) is fusion
    assert options["num_warps"] == config.num_warps and options["ENTROPY"] is True


@pytest.mark.parametrize("platform", ["cuda", "rocm"])
def test_every_portable_launch_is_named_portable_and_unfused(platform: str) -> None:
    launch = importlib.import_module("tp_logprob.kernels.triton.launch")
    names = importlib.import_module("tp_logprob.kernels.triton.portable_math").PORTABLE_KERNELS
    logits, targets = adversarial_inputs("bf16")
    contract = rl_contract(
        LAYOUTS["tp1"], temperature=0.7, num_tokens=len(MASK), active_mask=MASK, dtype="bf16"
    )
    seen: list[Any] = []
    with launch.recording_launches(platform, seen.append):
        triton_portable(logits, targets, contract)
    assert [s.kernel.__name__ for s in seen] == list(names[:3])  # role infer: forward only
    assert all(not s.config.fp_fusion for s in seen)
    assert all(s.constexprs.get("PORTABLE", True) is True for s in seen)
    seen.clear()
    with launch.recording_launches(platform, seen.append):
        BACKENDS["triton_exact_sum"](logits, targets, contract)
    assert all(s.config.fp_fusion and s.constexprs.get("PORTABLE", False) is False for s in seen)


def _grad_bits(op: Any, logits: torch.Tensor, targets: torch.Tensor, contract: Any) -> list[int]:
    """The gradient TP training computes (every rank backprops its replicated loss), as bits."""
    leaf = logits.clone().requires_grad_(True)
    results = run_tp(op, leaf, targets, contract)
    weights = torch.linspace(0.5, 2.0, logits.shape[0])
    loss = sum(
        (r.selected_logp.float() * weights).sum() + (r.entropy.float() * weights.flip(0)).sum()
        for r in results
    )
    loss.backward()  # type: ignore[union-attr]
    assert leaf.grad is not None
    view = torch.int16 if leaf.grad.element_size() == 2 else torch.int32
    return leaf.grad.contiguous().view(view).flatten().tolist()


@pytest.mark.skipif(DEVICE.type != "cpu", reason="torch_portable is registered on CPU")
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("layout", ["tp1", "tp3-uneven"])
def test_gradients_are_the_same_bits(dtype: str, layout: str) -> None:
    logits, targets = adversarial_inputs(dtype)
    logits[0, :19] = torch.linspace(-110.0, 0.0, 19)  # p down to the subnormal range
    contract = rl_contract(
        LAYOUTS[layout],
        temperature=0.9,
        num_tokens=len(MASK),
        active_mask=MASK,
        dtype=dtype,
        role="train",
    )
    kernel = _grad_bits(triton_portable, logits, targets, contract)
    twin = _grad_bits(torch_portable_logprob, logits, targets, contract)
    assert kernel == twin


@pytest.mark.skipif(DEVICE.type != "cpu", reason="torch_portable is registered on CPU")
@pytest.mark.parametrize(("dtype", "output_dtype"), [("fp16", "fp16"), ("bf16", "bf16")])
def test_half_outputs_and_their_nans_are_the_same_bits(dtype: str, output_dtype: str) -> None:
    logits, targets = adversarial_inputs(dtype)  # a NaN row, a +inf row, an all -inf row
    contract = rl_contract(
        LAYOUTS["tp3-uneven"],
        num_tokens=len(MASK),
        active_mask=MASK,
        dtype=dtype,
        output_dtype=output_dtype,
    )
    kernel = run_tp(triton_portable, logits, targets, contract)[0]
    twin = run_tp(torch_portable_logprob, logits, targets, contract)[0]
    assert bits_of(kernel) == bits_of(twin)
    entropy = [r.entropy.contiguous().view(torch.int16).tolist() for r in (kernel, twin)]
    assert entropy[0] == entropy[1]
    assert torch.isnan(kernel.lse).any()
