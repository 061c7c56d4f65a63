"""Holding the interpreter: one language patch per launch, no discarded work, the same bits,
nothing left behind."""

from __future__ import annotations

import dataclasses
import os
import threading

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

triton = pytest.importorskip("triton", reason="the interpreter needs triton")
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402
from triton.runtime.interpreter import InterpreterError  # noqa: E402

from tp_logprob.kernels.triton.interpreted import interpreting  # noqa: E402

pytestmark = [
    pytest.mark.triton,
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") != "1", reason="runs the Triton interpreter"
    ),
]


@triton.jit
def _scaled_exp(x, scale):
    return tl.exp(x * scale) - 1.0


@triton.jit
def _helper_loop_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Calls a helper in a loop: the interpreter patches on every helper call."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = offsets < n
    x = tl.load(x_ptr + offsets, mask=live, other=0.0)
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for step in range(4):
        total += _scaled_exp(x, 0.25 * step)
    tl.store(out_ptr + offsets, tl.max(total, axis=0) + total, mask=live)


def _run(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    _helper_loop_kernel[(3,)](x, out, x.numel(), BLOCK=8)
    return out


@pytest.fixture
def counted_patches() -> Iterator[list[Any]]:
    """Count the interpreter's own ``_patch_lang`` calls, in and out of :func:`interpreting`."""
    original = interpreter._patch_lang
    calls: list[Any] = []

    def counting(fn: Any) -> Any:
        calls.append(fn)
        return original(fn)

    interpreter._patch_lang = counting
    try:
        yield calls
    finally:
        interpreter._patch_lang = original


def test_one_patch_per_launch_and_the_same_bits(counted_patches: list[Any]) -> None:
    x = torch.linspace(-3.0, 5.0, 21)
    plain = _run(x)
    plain_patches = len(counted_patches)
    assert plain_patches > 3 * 4, "the interpreter no longer patches per helper call"
    counted_patches.clear()
    with interpreting():
        held = _run(x)
    # The launch's own patch, and one of triton.language.core for its standard library's
    # helpers (tl.zeros); every later helper call reused them.
    assert len(counted_patches) <= 2
    assert torch.equal(held.view(torch.int32), plain.view(torch.int32))


def test_the_interpreter_is_restored_after_the_launch() -> None:
    original, exp = interpreter._patch_lang, tl.exp
    with interpreting():
        assert interpreter._patch_lang is not original
        _run(torch.ones(5))
    assert interpreter._patch_lang is original
    assert tl.exp is exp  # the launch's patch of triton.language is undone too


def test_numpy_dtypes_are_the_interpreters_own_and_restored_after_the_launch() -> None:
    original = interpreter._get_np_dtype
    types = [
        tl.float32, tl.float16, tl.bfloat16, tl.float64, tl.int1, tl.int8, tl.uint8,
        tl.int16, tl.int32, tl.uint32, tl.int64, tl.uint64,
        tl.pointer_type(tl.float32), tl.pointer_type(tl.bfloat16),
        tl.block_type(tl.float32, [4]), tl.block_type(tl.bfloat16, [2, 8]),
        tl.block_type(tl.pointer_type(tl.int64), [8]), tl.block_type(tl.int1, [16]),
    ]  # fmt: skip
    with interpreting():
        kept = interpreter._get_np_dtype
        assert kept is not original
        answers = [kept(tt_dtype) for tt_dtype in types * 2]  # the second pass from the kept
        held = _run(torch.linspace(-3.0, 5.0, 21))
    assert interpreter._get_np_dtype is original
    assert answers == [original(tt_dtype) for tt_dtype in types * 2]
    assert torch.equal(
        held.view(torch.int32), _run(torch.linspace(-3.0, 5.0, 21)).view(torch.int32)
    )


def test_overflow_to_inf_is_silent_and_invalid_operations_still_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with interpreting():
            assert torch.isinf(_run(torch.full((4,), 400.0))).any()
            with pytest.raises(RuntimeWarning, match="invalid value"):
                np.float32(np.inf) - np.float32(np.inf)


@triton.jit
def _mixed_kernel(x_ptr, n_ptr, out_ptr, sums_ptr, BLOCK: tl.constexpr):
    """int32 arithmetic that wraps, blocks of one shape, a scalar, and a 2-D broadcast."""
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets)
    n = tl.load(n_ptr + offsets)
    wrapped = n * 3 + n - 7  # int32: wraps past 2^31
    column = tl.reshape(x, (BLOCK, 1))
    row = tl.reshape(x * 0.5, (1, BLOCK))
    table = tl.where(column > row, column - row, row * 2.0)  # [BLOCK, BLOCK]
    tl.store(out_ptr + offsets, tl.sum(table, axis=1) + wrapped.to(tl.float32))
    tl.store(sums_ptr + offsets, wrapped)


def _run_mixed() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.linspace(-2.0, 3.0, 8)
    n = torch.tensor([2**30, 5, -7, 2**29, 0, -(2**31), 11, 2**31 - 1], dtype=torch.int32)
    out, sums = torch.empty_like(x), torch.empty_like(n)
    _mixed_kernel[(1,)](x, n, out, sums, BLOCK=8)
    return out, sums


def test_skipping_discarded_work_gives_the_same_bits() -> None:
    """The overflow sanitizer's discarded checks, rebuilt types and same-shape broadcasts
    are skipped in a launch; what it computes is what the plain interpreter computes."""
    plain_out, plain_sums = _run_mixed()
    with interpreting():
        held_out, held_sums = _run_mixed()
    assert torch.equal(held_out.view(torch.int32), plain_out.view(torch.int32))
    assert torch.equal(held_sums, plain_sums)


def test_overflow_checks_are_skipped_only_outside_debug_mode() -> None:
    builder = interpreter.interpreter_builder
    options = builder.options
    assert options.sanitize_overflow and not options.debug  # the interpreter's default
    with interpreting():
        assert not builder.options.sanitize_overflow
    assert builder.options is options
    builder.options = dataclasses.replace(options, debug=True)
    try:
        with interpreting(), pytest.raises(InterpreterError, match="int32 overflow detected"):
            _run_mixed()  # in debug mode the checks run, and the wrapping product fails one
    finally:
        builder.options = options


def test_types_are_shared_equal_and_restored() -> None:
    block_type, tensor = tl.block_type, tl.tensor
    originals = (block_type.with_element_ty, block_type.to_ir, tensor.__init__)
    semantic = interpreter.interpreter_semantic
    with interpreting():
        floats = block_type(tl.float32, [4, 8])
        first, second = floats.with_element_ty(tl.int32), floats.with_element_ty(tl.int32)
        assert first is second and first == block_type(tl.int32, [4, 8])
        pointers = floats.with_element_ty(tl.pointer_type(tl.float32))
        assert pointers == block_type(tl.pointer_type(tl.float32), [4, 8])
        lowered = first.to_ir(interpreter.interpreter_builder)
        assert lowered is first.to_ir(interpreter.interpreter_builder) and lowered == first
        assert "broadcast_impl_value" in semantic.__dict__
    assert (block_type.with_element_ty, block_type.to_ir, tensor.__init__) == originals
    assert "broadcast_impl_value" not in semantic.__dict__


def test_another_tritons_patch_functions_are_left_as_they_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ``_patch_attr`` or ``_patch_builtin`` of another signature is not replaced."""

    def older_patch_attr(obj: Any, name: str, member: Any, builder: Any) -> None:
        raise AssertionError("not called here")

    def older_patch_builtin(pkg: Any, builder: Any) -> None:
        raise AssertionError("not called here")

    monkeypatch.setattr(interpreter, "_patch_attr", older_patch_attr)
    monkeypatch.setattr(interpreter, "_patch_builtin", older_patch_builtin)
    with interpreting():
        assert interpreter._patch_attr is older_patch_attr
        assert interpreter._patch_builtin is older_patch_builtin


def _in_a_user_thread(work: Any) -> Any:
    """``work()`` run on a thread of its own, as a user's code beside ours; its result."""
    results: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(work())
        except BaseException as error:  # handed back to the test's thread
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return results[0]


def test_a_user_thread_runs_triton_as_it_is_beside_our_launch(
    counted_patches: list[Any],
) -> None:
    """While a launch of ours holds the interpreter, a user's own interpreted kernel on
    another thread takes Triton's own path (a language patch per helper call, the sanitizer
    on, fresh types) and gets the plain interpreter's bits; our launch then still takes
    the shortcuts."""
    x = torch.linspace(-3.0, 5.0, 21)
    plain = _run(x)
    plain_patches = len(counted_patches)
    block = tl.block_type(tl.float32, [4])

    def users_work() -> tuple[torch.Tensor, int, bool, bool]:
        before = len(counted_patches)
        out = _run(x)
        sanitized = interpreter.interpreter_builder.options.sanitize_overflow
        fresh = block.with_element_ty(tl.int32) is not block.with_element_ty(tl.int32)
        return out, len(counted_patches) - before, sanitized, fresh

    with interpreting():
        users, user_patches, sanitized, fresh = _in_a_user_thread(users_work)
        before = len(counted_patches)
        ours = _run(x)
        our_patches = len(counted_patches) - before
        assert not interpreter.interpreter_builder.options.sanitize_overflow
    assert user_patches == plain_patches
    assert sanitized and fresh
    assert torch.equal(users.view(torch.int32), plain.view(torch.int32))
    assert our_patches <= 2
    assert torch.equal(ours.view(torch.int32), plain.view(torch.int32))
