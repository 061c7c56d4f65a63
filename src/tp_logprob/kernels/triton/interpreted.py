"""Running the Triton kernels on CPU tensors, through the Triton interpreter.

The interpreter keeps global state while it runs a grid: it patches
``triton.language`` so that the kernel's calls run on numpy. Launches on CPU are
therefore serialized with one lock (the emulated TP ranks are threads).

It also patches again on every call of a ``@triton.jit`` helper from inside a
kernel (Triton 3.x: ``inspect.getmembers`` over four modules, about a millisecond a
call, more than most helpers compute), although the launch's own patch is still
in place and the helper's patch changes nothing. Within one launch,
:func:`interpreting` patches a language module only the first time: the kernels
call small helpers per tile and per row, and under the interpreter that repeated
patch was most of their running time. What runs, and so every bit the kernels
produce, is unchanged.

Each operation on a tile also asks the interpreter for the numpy dtype of a Triton
type, and its ``_get_np_dtype`` builds a table of twenty numpy dtypes to answer
(about a tenth of an interpreted kernel's time here). Within a launch the answer for
each element type is kept (:func:`_np_dtypes_kept`): the same dtypes, so the same bits.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import triton.language as tl
from triton.runtime import interpreter

__all__ = ["interpreting"]

_LOCK = threading.Lock()


@contextlib.contextmanager
def interpreting() -> Iterator[None]:
    """Hold the interpreter for one launch, patching ``triton.language`` once in it.

    fp32 overflow to +-inf (``x - M`` with ``|x|`` near the fp32 maximum) is IEEE
    behaviour the kernels rely on, silent on GPUs; numpy warns about it, so it is
    ignored here. Invalid operations (``inf - inf``) still warn: the kernels never
    perform one.
    """
    with _LOCK, np.errstate(over="ignore"), _patching_once(), _np_dtypes_kept():
        yield


@contextlib.contextmanager
def _np_dtypes_kept() -> Iterator[None]:
    """Replace the interpreter's ``_get_np_dtype`` with one that answers each element type
    from what the original answered; restored when the launch ends. A block type's answer
    is its element type's; a pointer's (``uint64``) the original answers at once, unkept
    (pointer types are not hashable)."""
    original: Callable[[Any], Any] | None = getattr(interpreter, "_get_np_dtype", None)
    block_type = getattr(tl, "block_type", None)
    pointer_type = getattr(tl, "pointer_type", None)
    if original is None or block_type is None or pointer_type is None:
        yield
        return
    kept: dict[Any, Any] = {}

    def np_dtype(tt_dtype: Any) -> Any:
        if isinstance(tt_dtype, block_type):
            tt_dtype = tt_dtype.element_ty
        if isinstance(tt_dtype, pointer_type):
            return original(tt_dtype)
        found = kept.get(tt_dtype)
        if found is None:
            found = kept[tt_dtype] = original(tt_dtype)
        return found

    interpreter._get_np_dtype = np_dtype
    try:
        yield
    finally:
        interpreter._get_np_dtype = original


@contextlib.contextmanager
def _patching_once() -> Iterator[None]:
    """Replace the interpreter's ``_patch_lang`` with one that skips a language module
    already patched in this launch; restored when the launch ends.

    An interpreter without ``_patch_lang`` and ``_LangPatchScope`` (another Triton
    version) runs as it is.
    """
    original: Callable[[Any], Any] | None = getattr(interpreter, "_patch_lang", None)
    empty_scope = getattr(interpreter, "_LangPatchScope", None)
    if original is None or empty_scope is None:
        yield
        return
    patched: set[int] = set()
    seen: dict[int, set[int]] = {}  # id(fn.__globals__) -> its language modules, this launch

    def patch_once(fn: Any) -> Any:
        langs = seen.get(id(fn.__globals__))
        if langs is None:
            langs = seen.setdefault(id(fn.__globals__), _language_modules(fn))
        if langs and langs <= patched:
            return empty_scope()  # the caller restores nothing from it: nothing was set
        patched.update(langs)
        return original(fn)

    interpreter._patch_lang = patch_once
    try:
        yield
    finally:
        interpreter._patch_lang = original


def _language_modules(fn: Any) -> set[int]:
    """The ids of the ``triton.language`` modules ``fn`` sees, as the interpreter finds them."""
    return {
        id(value)
        for value in fn.__globals__.values()
        if inspect.ismodule(value) and (value is tl or value is tl.core)
    }
