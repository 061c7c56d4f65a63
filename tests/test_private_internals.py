"""The private internals of Triton and Hypothesis the package relies on are where it expects.

pyproject bounds both libraries above; within the bounds, these tests name the
internal that moved when a release moves one. Triton's are those of its
interpreter that ``kernels/triton/interpreted.py`` replaces (each shortcut falls back
to the plain interpreter when its internal is missing, so only this test notices);
Hypothesis' are the seed attribute the pytest plugin sets
(``_hypothesis_internal_use_seed``, what ``hypothesis.seed`` sets) and the shrinking
time limit the real-group lockstep lifts (``MAX_SHRINKING_SECONDS``).
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import pytest
import torch
from hypothesis import given, seed, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import engine


def _moved(internal: str, why: str) -> str:
    return f"{internal} moved: {why}; the package needs it (see its upper bound in pyproject)"


def test_hypothesis_seed_sets_the_attribute_the_plugin_sets() -> None:
    def test() -> None: ...

    seeded: Any = seed(1234)(test)
    assert getattr(seeded, "_hypothesis_internal_use_seed", None) == 1234, _moved(
        "_hypothesis_internal_use_seed", "hypothesis.seed() no longer sets it"
    )


def test_hypothesis_reads_the_seed_attribute() -> None:
    """Two runs of a test carrying the attribute draw the same values; other seeds differ."""

    def draws(value: int) -> list[int]:
        drawn: list[int] = []

        @settings(max_examples=5, database=None, derandomize=False)
        @given(st.integers())
        def test(number: int) -> None:
            drawn.append(number)

        test._hypothesis_internal_use_seed = value  # type: ignore[attr-defined]
        test()
        return drawn

    assert draws(7) == draws(7) and draws(7) != draws(8), _moved(
        "_hypothesis_internal_use_seed", "a test that carries it no longer draws from it"
    )


def test_hypothesis_shrinking_time_limit_is_a_module_number_the_engine_reads() -> None:
    limit = getattr(engine, "MAX_SHRINKING_SECONDS", None)
    assert isinstance(limit, (int, float)), _moved(
        "hypothesis.internal.conjecture.engine.MAX_SHRINKING_SECONDS", f"it is {limit!r}"
    )
    assert "MAX_SHRINKING_SECONDS" in inspect.getsource(engine.ConjectureRunner), _moved(
        "hypothesis.internal.conjecture.engine.MAX_SHRINKING_SECONDS",
        "ConjectureRunner no longer reads it",
    )


def _interpreter() -> Any:
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    pytest.importorskip("triton", reason="the interpreter's internals need triton")
    from triton.runtime import interpreter

    return interpreter


TRITON_FUNCTIONS = {
    "_patch_lang": ("fn",),
    "_patch_attr": ("obj", "name", "member", "builder", "scope"),
    "_patch_builtin": ("pkg", "builder", "scope"),
    "_get_np_dtype": ("tt_dtype",),
}
"""The interpreter's functions the shortcuts replace, with their parameters."""

SEMANTIC_METHODS = (
    "broadcast_impl_value",
    "computation_type_impl",
    "binary_op_type_checking_impl",
    "scalar_constant",
)


@pytest.mark.parametrize("name", list(TRITON_FUNCTIONS))
def test_triton_interpreter_functions(name: str) -> None:
    interpreter = _interpreter()
    function = getattr(interpreter, name, None)
    assert callable(function), _moved(f"triton.runtime.interpreter.{name}", "it is gone")
    parameters = tuple(inspect.signature(function).parameters)
    assert parameters == TRITON_FUNCTIONS[name], _moved(
        f"triton.runtime.interpreter.{name}", f"its parameters are now {parameters}"
    )


def test_triton_interpreter_objects() -> None:
    interpreter = _interpreter()
    import triton.language as tl

    assert hasattr(interpreter, "_LangPatchScope"), _moved(
        "triton.runtime.interpreter._LangPatchScope", "it is gone"
    )
    builder_class = getattr(interpreter, "InterpreterBuilder", None)
    assert isinstance(interpreter.interpreter_builder, builder_class), _moved(
        "triton.runtime.interpreter.interpreter_builder", "not an InterpreterBuilder"
    )
    options = interpreter.interpreter_builder.options
    for field in ("sanitize_overflow", "debug"):
        assert field in getattr(options, "__dataclass_fields__", {}), _moved(
            f"triton.runtime.interpreter.interpreter_builder.options.{field}", "it is gone"
        )
    semantic = getattr(interpreter, "interpreter_semantic", None)
    for method in SEMANTIC_METHODS:
        assert callable(getattr(semantic, method, None)), _moved(
            f"triton.runtime.interpreter.interpreter_semantic.{method}", "it is gone"
        )
    assert callable(getattr(tl.core, "is_builtin", None)), _moved(
        "triton.language.core.is_builtin", "it is gone"
    )
    block = tl.block_type(tl.float32, [2])
    for method in ("with_element_ty", "to_ir"):
        assert callable(getattr(block, method, None)), _moved(
            f"triton.language.block_type.{method}", "it is gone"
        )
    assert hasattr(block.shape, "values"), _moved(
        "triton.language.block_type.shape.values", "the shape is no longer a tuple_type"
    )
    tensor = tl.tensor(None, block)
    assert vars(tensor).keys() == {"handle", "type", "dtype", "shape", "numel"}, _moved(
        "triton.language.tensor.__init__", f"it now sets {sorted(vars(tensor))}"
    )
