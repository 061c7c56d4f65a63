"""The fused products leave torch's fp32 matmul precision alone, and it does not reach them.

torch's fp32 matmul precision is one setting of the whole process. A fused call
neither reads nor writes it: a user thread beside the call keeps its own setting,
the setting is what the user left after the call, and the call's bits are the same
whatever any thread sets meanwhile (``kernels/rowwise.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from tests.helpers.fused_cases import PADDED, fused_case, fused_contract, same_bits
from tp_logprob.errors import LogprobDispatchError
from tp_logprob.kernels.native_fused import torch_native_fused_logprob
from tp_logprob.kernels.rowwise import float64_matmul, rowwise_matmul
from tp_logprob.peers._glue import check_hidden_inputs

SIZE = 64
ROWS = 48


@pytest.fixture(autouse=True)
def user_precision() -> Iterator[None]:
    """The test's own settings are undone after it, as a user's would be."""
    saved = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(saved)


def operands() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return torch.randn(ROWS, 512, generator=gen), torch.randn(300, 512, generator=gen)


def fused_train_bits() -> list[torch.Tensor]:
    """A TP=1 fused train call: its outputs and the gradients of both products."""
    hidden, weight, _, targets = fused_case("fp32", seed=5, num_tokens=ROWS, size=SIZE)
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    contract = fused_contract(((0, PADDED),), num_tokens=ROWS, size=SIZE, role="train")
    result = torch_native_fused_logprob(hidden, targets, contract, weight=weight)
    (result.selected_logp.sum() + result.lse.sum()).backward()
    assert hidden.grad is not None and weight.grad is not None
    return [result.selected_logp, result.lse, hidden.grad, weight.grad]


def test_fp32_matmuls_follow_the_setting_on_this_machine() -> None:
    """The premise: the setting changes plain fp32 products here (bf16 via oneDNN on a CPU
    with AVX512-BF16, TF32 via cuBLAS on a GPU); elsewhere there is nothing to show."""
    rows, matrix = operands()
    full = torch.matmul(rows, matrix.T)
    torch.set_float32_matmul_precision("medium")
    if same_bits(torch.matmul(rows, matrix.T), full):
        pytest.skip("fp32 matmuls on this machine ignore the fp32 matmul precision")
    assert not same_bits(torch.matmul(rows, matrix.T), full)


@pytest.mark.parametrize("precision", ["high", "medium"])
def test_no_precision_setting_reaches_the_products(precision: str) -> None:
    rows, matrix = operands()
    expected = (rowwise_matmul(rows, matrix), float64_matmul(rows, matrix.T))
    fused = fused_train_bits()
    torch.set_float32_matmul_precision(precision)
    assert same_bits(rowwise_matmul(rows, matrix), expected[0])
    assert same_bits(float64_matmul(rows, matrix.T), expected[1])
    assert all(map(same_bits, fused_train_bits(), fused))
    assert torch.get_float32_matmul_precision() == precision


def test_a_user_thread_keeps_its_own_setting_beside_fused_calls() -> None:
    """A thread that reads the precision while the calls run, and sets it now and then,
    always reads what it set last; the calls' bits are those of calls with no such
    thread; the thread's last setting is the process's after the calls.

    One call lasts about a millisecond and the thread runs between the GIL's switches,
    so many calls run beside it (a save-and-restore around each call fails all three)."""
    rows, matrix = operands()
    quiet = (fused_train_bits(), rowwise_matmul(rows, matrix))
    torch.set_float32_matmul_precision("medium")
    done, started = threading.Event(), threading.Event()
    seen: list[tuple[str, str]] = []
    last: list[str] = []

    def user() -> None:
        mine = "medium"
        while not done.is_set():
            seen.append((mine, torch.get_float32_matmul_precision()))
            if len(seen) % 100 == 0:
                mine = "high" if mine == "medium" else "medium"
                torch.set_float32_matmul_precision(mine)
            started.set()
        last.append(mine)

    thread = threading.Thread(target=user)
    thread.start()
    try:
        assert started.wait(timeout=30)
        before = len(seen)
        loud = [(fused_train_bits(), rowwise_matmul(rows, matrix)) for _ in range(4)]
        loud += [(quiet[0], rowwise_matmul(rows, matrix)) for _ in range(100)]
        during = len(seen) - before
    finally:
        done.set()
        thread.join()
    assert during > 1000, f"the user thread read the setting {during} times beside the calls"
    assert [pair for pair in seen if pair[0] != pair[1]] == []
    for fused, product in loud:
        assert all(map(same_bits, fused, quiet[0]))
        assert same_bits(product, quiet[1])
    assert torch.get_float32_matmul_precision() == last[0]


def test_a_fused_peer_refuses_a_precision_its_library_would_follow() -> None:
    hidden, weight, _, targets = fused_case("fp32", seed=5, size=SIZE)
    contract = fused_contract(((0, PADDED),), size=SIZE)
    check_hidden_inputs("peer", hidden, targets, contract, None, weight, None)
    torch.set_float32_matmul_precision("high")
    module = "cuda" if hidden.device.type == "cuda" else "mkldnn"
    with pytest.raises(
        LogprobDispatchError, match=rf"torch.backends.{module}.matmul.fp32_precision='tf32'"
    ):
        check_hidden_inputs("peer", hidden, targets, contract, None, weight, None)
    assert torch.get_float32_matmul_precision() == "high"
