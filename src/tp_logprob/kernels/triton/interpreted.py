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

The rest is work whose result the interpreter throws away or builds again, each
skipped by one context manager inside :func:`interpreting`; every value a kernel
computes, and so every bit, is the same (``tests/kernels/test_interpreted_bits.py``
runs every Triton backend on the suite's cases with and without them):

- :func:`_no_discarded_overflow_checks`: Triton's overflow sanitizer redoes every
  int32 ``+ - *`` in int64, compares it with the int32 range and hands the result to
  ``device_assert``, which drops it unless the interpreter's options ask for debug
  mode (Triton never sets them). A GPU compile removes that dead code; the
  interpreter ran it, about a fifth of an integer-heavy kernel's time. In debug mode
  the checks still run.
- :func:`_types_kept`: each operation built its result's ``block_type`` afresh, twice
  (``with_element_ty``, then the interpreter's ``to_ir``), and each tensor its shape
  as a tuple of ``constexpr``: about a third of the time, for a handful of distinct
  types per launch. One equal object per type is handed out instead.
- :func:`_semantic_shortcuts`: two tensors of one type (most operations) went
  through type promotion, two casts to their own type and a broadcast walk that
  hand both back unchanged; two blocks of one shape through the broadcast walk.
  Both now return at once, and the promotion of two element types is kept. Each
  literal (``0.0``, ``float("-inf")``) was a new numpy constant, splat again to the
  tile's shape at every use: one per value and shape now.
- :func:`_direct_builtins`: each ``tl`` call went through the interpreter's patched
  member, which copies its keyword arguments to drop a ``_semantic``, and Triton's
  ``builtin`` wrapper, which checks one was given. The member now calls the function
  with the interpreter's semantic directly, and the builtins each launch patches are
  listed once, not with ``inspect.getmembers`` per launch.

With the two above, every Triton backend's forward and backward on the suite's small
train cases runs 3.2 to 5.4 times faster than under Triton's interpreter as it is
(``benchmarks/bench_interpreter.py``, medians of 5 on a 2-core CPU; the same bits).
Each shortcut checks that the Triton internals it replaces exist, and otherwise
leaves the interpreter as it is; :func:`plain_interpreter` turns them all off.

**Scope.** The shortcuts replace attributes of the interpreter module, of its semantic
and builder objects and of ``tl.block_type`` and ``tl.tensor``: objects of the whole
process, while a launch of ours runs. Every replacement serves the thread that holds
the launch (:func:`interpreting`) alone; on any other thread it is Triton's own
function, member or options, so a user's Triton work beside one of our launches (an
interpreted kernel, a compile) runs exactly as without us
(``tests/kernels/test_interpreted.py``). What stays shared is Triton's own: its
interpreter patches ``triton.language`` and keeps the program id in one builder for
the whole process, so two interpreted launches at once on two threads are not
something Triton supports, with or without these shortcuts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import triton.language as tl
from triton.runtime import interpreter

__all__ = ["interpreting", "plain_interpreter"]

_LOCK = threading.Lock()
_HOLDER: int | None = None  # the thread that holds the interpreter for a launch of ours


def _held_here() -> bool:
    """Whether the calling thread holds the interpreter for a launch of ours."""
    return threading.get_ident() == _HOLDER


_PLAIN = False  # set by plain_interpreter(): launches run Triton's interpreter as it is


@contextlib.contextmanager
def interpreting() -> Iterator[None]:
    """Hold the interpreter for one launch, patching ``triton.language`` once in it and
    skipping the interpreter's discarded and rebuilt work (the module docstring).

    fp32 overflow to +-inf (``x - M`` with ``|x|`` near the fp32 maximum) is IEEE
    behaviour the kernels rely on, silent on GPUs; numpy warns about it, so it is
    ignored here. Invalid operations (``inf - inf``) still warn: the kernels never
    perform one.
    """
    global _HOLDER
    with _LOCK, np.errstate(over="ignore"):
        if _PLAIN:
            yield
            return
        _HOLDER = threading.get_ident()
        try:
            with (
                _patching_once(),
                _direct_builtins(),
                _np_dtypes_kept(),
                _no_discarded_overflow_checks(),
                _types_kept(),
                _semantic_shortcuts(),
            ):
                yield
        finally:
            _HOLDER = None


@contextlib.contextmanager
def plain_interpreter() -> Iterator[None]:
    """Within the block, every launch runs Triton's interpreter as it is, still held by the
    lock: the baseline the shortcuts are compared with, for their bits and their speed.
    Process-wide (the emulated ranks are threads); not for use beside other launches."""
    global _PLAIN
    with _LOCK:
        before, _PLAIN = _PLAIN, True
    try:
        yield
    finally:
        with _LOCK:
            _PLAIN = before


@contextlib.contextmanager
def _semantic_shortcuts() -> Iterator[None]:
    """Install :class:`_Shortcuts`' methods on the interpreter's own semantic object (never
    on Triton's class) for one launch; removed when it ends."""
    semantic = getattr(interpreter, "interpreter_semantic", None)
    names = (
        "broadcast_impl_value",
        "computation_type_impl",
        "binary_op_type_checking_impl",
        "scalar_constant",
    )
    if (
        semantic is None
        or _BLOCK is None
        or any(getattr(semantic, name, None) is None for name in names)
    ):
        yield
        return
    shortcuts = _Shortcuts(semantic)
    with _attributes_set(
        semantic,
        broadcast_impl_value=shortcuts.broadcast,
        computation_type_impl=shortcuts.computation_type,
        binary_op_type_checking_impl=shortcuts.type_checked,
        scalar_constant=shortcuts.scalar_constant,
    ):
        yield


class _Shortcuts:
    """One launch's answers to the semantic questions the interpreter asks again and again.

    - ``broadcast``: two blocks of one shape come back as they are (Triton's walk over
      ranks and dimensions returns them unchanged); a kept constant splat to a block
      shape is made once.
    - ``computation_type``: the promotion of two element types, kept.
    - ``type_checked``: two tensors of one non-pointer type come back as they are (the
      promotion gives that type, both casts to it return their input, and the broadcast
      is the first case).
    - ``scalar_constant``: one tensor per (dtype, value) a kernel writes as a literal,
      kept by the value's bits (``-0.0`` and NaN payloads apart). Interpreted tensors are
      never changed after they are made, so sharing one is reading the same value.
    Anything else, and any call from a thread that does not hold the launch, goes to
    Triton's own method.
    """

    def __init__(self, semantic: Any) -> None:
        self._broadcast = semantic.broadcast_impl_value
        self._computation_type = semantic.computation_type_impl
        self._type_checked = semantic.binary_op_type_checking_impl
        self._scalar_constant = semantic.scalar_constant
        self._promoted: dict[tuple[Any, ...], Any] = {}
        self._constants: dict[tuple[Any, ...], Any] = {}
        self._kept: set[int] = set()  # ids of the kept constants (held by _constants)
        self._splats: dict[tuple[int, str], Any] = {}

    def broadcast(self, lhs: Any, rhs: Any) -> Any:
        if not _held_here():
            return self._broadcast(lhs, rhs)
        lhs_type, rhs_type = lhs.type, rhs.type
        lhs_block, rhs_block = type(lhs_type) is _BLOCK, type(rhs_type) is _BLOCK
        if lhs_block and rhs_block:
            if lhs_type is rhs_type or _SHAPE_OF(lhs_type) == _SHAPE_OF(rhs_type):
                return lhs, rhs
        elif lhs_block and id(rhs) in self._kept:
            return lhs, self._splat(rhs, lhs, lhs_type)
        elif rhs_block and id(lhs) in self._kept:
            return self._splat(lhs, rhs, rhs_type), rhs
        return self._broadcast(lhs, rhs)

    def _splat(self, constant: Any, block: Any, block_type: Any) -> Any:
        key = (id(constant), block_type.name)
        found = self._splats.get(key)
        if found is None:
            found = self._splats[key] = self._broadcast(block, constant)[1]
        return found

    def computation_type(
        self, a_ty: Any, a_is_scalar: bool, b_ty: Any, b_is_scalar: bool, div_or_mod: bool
    ) -> Any:
        if type(a_ty) is not _SCALAR or type(b_ty) is not _SCALAR or not _held_here():
            return self._computation_type(a_ty, a_is_scalar, b_ty, b_is_scalar, div_or_mod)
        key = (a_ty.name, a_is_scalar, b_ty.name, b_is_scalar, div_or_mod)
        found = self._promoted.get(key)
        if found is None:  # a refused pair raises every time, as before
            found = self._promoted[key] = self._computation_type(
                a_ty, a_is_scalar, b_ty, b_is_scalar, div_or_mod
            )
        return found

    def type_checked(
        self,
        lhs: Any,
        rhs: Any,
        allow_lhs_ptr: bool = False,
        allow_rhs_ptr: bool = False,
        arithmetic_check: bool = True,
        div_or_mod: bool = False,
    ) -> Any:
        lhs_type: Any = getattr(lhs, "type", None)
        rhs_type: Any = getattr(rhs, "type", None)
        if (
            not div_or_mod
            and _held_here()
            and lhs_type is not None
            and lhs_type is rhs_type
            and type(lhs) is _TENSOR
            and type(rhs) is _TENSOR
        ):
            scalar = lhs_type.element_ty if type(lhs_type) is _BLOCK else lhs_type
            if type(scalar) is _SCALAR and (
                not arithmetic_check
                or self.computation_type(scalar, False, scalar, False, False) == scalar
            ):
                return lhs, rhs
        return self._type_checked(
            lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod
        )

    def scalar_constant(self, value: Any, dtype: Any) -> Any:
        kind = type(value)
        if (
            type(dtype) is not _SCALAR
            or kind not in (bool, int, float)
            or dtype.is_fp8()
            or not _held_here()
        ):
            return self._scalar_constant(value, dtype)
        key = (dtype.name, kind, struct.pack("<d", value) if kind is float else value)
        found = self._constants.get(key)
        if found is None:
            found = self._constants[key] = self._scalar_constant(value, dtype)
            self._kept.add(id(found))
        return found


_TENSOR_FIELDS = {"handle", "type", "dtype", "shape", "numel"}  # what tensor.__init__ sets
_BLOCK: Any = getattr(tl, "block_type", None)
_SCALAR: Any = tl.dtype  # a plain element type: hashable, unlike pointers and blocks
_TENSOR: Any = tl.tensor


def _shape_values(block: Any) -> Any:
    """A block type's dimensions as a list (Triton keeps them in its own tuple type)."""
    return block.shape.values


def _shape(block: Any) -> Any:
    return block.shape


_SHAPE_OF = (
    _shape_values
    if _BLOCK is not None and hasattr(_BLOCK(tl.int32, [2]).shape, "values")
    else _shape
)


@contextlib.contextmanager
def _direct_builtins() -> Iterator[None]:
    """Replace the interpreter's ``_patch_attr`` with one whose members call a ``builtin``'s
    own function with the interpreter's semantic; restored when the launch ends. A member
    that is not a plain ``builtin`` wrapper is patched by Triton's ``_patch_attr``."""
    original: Callable[..., Any] | None = getattr(interpreter, "_patch_attr", None)
    semantic = getattr(interpreter, "interpreter_semantic", None)
    if (
        original is None
        or semantic is None
        or not hasattr(tl.core, "is_builtin")
        or not _takes(original, ("obj", "name", "member", "builder", "scope"))
    ):
        yield
        return

    def patch_attr(obj: Any, name: str, member: Any, builder: Any, scope: Any) -> None:
        if not _held_here():
            original(obj, name, member, builder, scope)
            return
        made = _DIRECT.get(id(member))
        if made is None or made[0] is not member or made[1] is not semantic:
            function = getattr(member, "__wrapped__", None)
            if function is None or not tl.core.is_builtin(member):
                original(obj, name, member, builder, scope)
                return
            made = _DIRECT[id(member)] = (member, semantic, _direct(member, function, semantic))
        scope.set_attr(obj, name, made[2])

    patch_builtin: Callable[..., Any] = getattr(interpreter, "_patch_builtin", _absent)
    patched: set[int] = set()  # packages whose builtins this launch has patched

    def patch_listed_builtins(package: Any, builder: Any, scope: Any) -> None:
        if not _held_here():
            patch_builtin(package, builder, scope)
            return
        # A package patched already has no builtin left to patch (``triton.language``
        # and its ``core`` share the tensor class): Triton's lister would find none.
        if id(package) in patched:
            return
        for name, member in _listed_builtins(package):
            interpreter._patch_attr(package, name, member, builder, scope)
        patched.add(id(package))

    patches: dict[str, Any] = {"_patch_attr": patch_attr}
    if patch_builtin is not _absent and _takes(patch_builtin, ("pkg", "builder", "scope")):
        patches["_patch_builtin"] = patch_listed_builtins
    with _attributes_set(interpreter, **patches):
        yield


def _absent(*args: Any) -> None:
    """Stands for an interpreter function this Triton lacks (never installed, never called)."""


def _takes(function: Callable[..., Any], names: tuple[str, ...]) -> bool:
    """Whether ``function``'s parameters are ``names``: the Triton this was written against."""
    known = _SIGNATURES.get(id(function))
    if known is None or known[0] is not function:
        try:
            parameters = tuple(inspect.signature(function).parameters)
        except (TypeError, ValueError):
            parameters = ()
        known = _SIGNATURES[id(function)] = (function, parameters)
    return known[1] == names


_SIGNATURES: dict[int, tuple[Callable[..., Any], tuple[str, ...]]] = {}


# id(builtin) -> (builtin, the semantic, the member calling its function with it)
_DIRECT: dict[int, tuple[Any, Any, Callable[..., Any]]] = {}


def _direct(member: Any, function: Any, semantic: Any) -> Callable[..., Any]:
    """``function`` (the builtin ``member``'s own) called with ``_semantic=semantic``, as the
    interpreter's member calls it; on a thread that does not hold the launch, the
    interpreter's member itself (``member`` with the semantic, any other dropped)."""

    def direct(*args: Any, **kwargs: Any) -> Any:
        if not _held_here():
            kwargs.pop("_semantic", None)
            return member(*args, **kwargs, _semantic=semantic)
        kwargs["_semantic"] = semantic
        return function(*args, **kwargs)

    return direct


# id(package) -> (package, its attribute count with its bases', [(name, builtin member)])
_BUILTINS: dict[int, tuple[Any, int, list[tuple[str, Any]]]] = {}


def _listed_builtins(package: Any) -> list[tuple[str, Any]]:
    """``package``'s builtin members, as the interpreter's ``_patch_builtin`` finds them with
    ``inspect.getmembers`` (about a millisecond), listed once: again if an attribute was
    added or removed, on it or a base class, or a listed member is no longer there."""
    owners = package.__mro__ if isinstance(package, type) else (package,)
    size = sum(len(vars(owner)) for owner in owners)
    listed = _BUILTINS.get(id(package))
    if (
        listed is None
        or listed[0] is not package
        or listed[1] != size
        or any(getattr(package, name, None) is not member for name, member in listed[2])
    ):
        members = inspect.getmembers(package)
        builtins = [(name, member) for name, member in members if tl.core.is_builtin(member)]
        listed = _BUILTINS[id(package)] = (package, size, builtins)
    return listed[2]


@contextlib.contextmanager
def _attributes_set(owner: Any, **values: Any) -> Iterator[None]:
    """Set ``values`` on ``owner`` itself (a module, a class or an instance) within the
    block; afterwards its own earlier attributes are back, and those it lacked removed."""
    missing = object()
    own = {name: vars(owner).get(name, missing) for name in values}
    for name, value in values.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in own.items():
            if value is missing:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


_UNSANITIZED: dict[int, tuple[Any, Any]] = {}  # id(options) -> (options, the same unsanitized)


@contextlib.contextmanager
def _no_discarded_overflow_checks() -> Iterator[None]:
    """Turn Triton's overflow sanitizer off for the launch unless the interpreter is in
    debug mode, where ``device_assert`` keeps its result; restored when the launch ends."""
    builder: Any = getattr(interpreter, "interpreter_builder", None)
    options: Any = getattr(builder, "options", None)
    if (
        options is None
        or not hasattr(options, "__dataclass_fields__")
        or getattr(options, "debug", True)
        or not getattr(options, "sanitize_overflow", False)
    ):
        yield
        return
    unsanitized = _UNSANITIZED.get(id(options))
    if unsanitized is None or unsanitized[0] is not options:
        unsanitized = _UNSANITIZED[id(options)] = (
            options,
            dataclasses.replace(options, sanitize_overflow=False),
        )
    with _attributes_set(builder, options=_HolderOptions(options, unsanitized[1])):
        yield


class _HolderOptions:
    """The builder's options as each thread reads them: the launch's holder reads the
    unsanitized copy, any other thread the builder's own options."""

    __slots__ = ("_holders", "_own")

    def __init__(self, own: Any, holders: Any) -> None:
        self._own = own
        self._holders = holders

    def __getattr__(self, name: str) -> Any:
        return getattr(self._holders if _held_here() else self._own, name)


@contextlib.contextmanager
def _types_kept() -> Iterator[None]:
    """Within the launch, one ``block_type`` object per (element type, shape) from
    ``with_element_ty`` and from a block type's ``to_ir`` under the interpreter, and a
    tensor's ``shape`` and ``numel`` built once per type; all restored when it ends.

    The objects are equal to the ones Triton would build (types compare by element
    type and shape), and nothing in Triton mutates a type or a shape after building
    it. Pointer element types are not hashable: those types are built as before.
    Tensors' shapes are kept by type object, for the launch (the types held, so no id
    is reused).
    """
    builder_class: Any = getattr(interpreter, "InterpreterBuilder", None)
    if _BLOCK is None or builder_class is None:
        yield
        return
    with_element_ty: Callable[..., Any] = _BLOCK.with_element_ty
    to_ir: Callable[..., Any] = _BLOCK.to_ir
    tensor_init: Callable[..., Any] = _TENSOR.__init__
    retyped: dict[tuple[str, Any], Any] = {}
    lowered: dict[str, Any] = {}
    shapes: dict[int, tuple[Any, Any, Any]] = {}  # id(type) -> (type, shape, numel)

    def kept_with_element_ty(self: Any, scalar_ty: Any) -> Any:
        if type(scalar_ty) is not _SCALAR or not _held_here():
            return with_element_ty(self, scalar_ty)
        key = (self.name, scalar_ty)
        found = retyped.get(key)
        if found is None:
            found = retyped[key] = with_element_ty(self, scalar_ty)
        return found

    def kept_to_ir(self: Any, builder: Any) -> Any:
        if (
            not isinstance(builder, builder_class)
            or type(self.element_ty) is not _SCALAR
            or not _held_here()
        ):
            return to_ir(self, builder)
        found = lowered.get(self.name)
        if found is None:
            found = lowered[self.name] = to_ir(self, builder)
        return found

    def kept_tensor_init(self: Any, handle: Any, type: Any) -> None:
        if not _held_here():
            tensor_init(self, handle, type)
            return
        found = shapes.get(id(type))
        if found is None or found[0] is not type:
            tensor_init(self, handle, type)
            if vars(self).keys() == _TENSOR_FIELDS:  # else another Triton's: not kept
                shapes[id(type)] = (type, self.shape, self.numel)
            return
        self.handle = handle
        self.type = type
        self.dtype = type.scalar
        self.shape, self.numel = found[1], found[2]

    with (
        _attributes_set(_BLOCK, with_element_ty=kept_with_element_ty, to_ir=kept_to_ir),
        _attributes_set(_TENSOR, __init__=kept_tensor_init),
    ):
        yield


@contextlib.contextmanager
def _np_dtypes_kept() -> Iterator[None]:
    """Replace the interpreter's ``_get_np_dtype`` with one that answers each element type
    from what the original answered; restored when the launch ends. A block type's answer
    is its element type's; a pointer's (``uint64``) the original answers at once, unkept
    (pointer types are not hashable)."""
    original: Callable[[Any], Any] | None = getattr(interpreter, "_get_np_dtype", None)
    pointer_type = getattr(tl, "pointer_type", None)
    if original is None or _BLOCK is None or pointer_type is None:
        yield
        return
    kept: dict[Any, Any] = {}

    def np_dtype(tt_dtype: Any) -> Any:
        if not _held_here():
            return original(tt_dtype)
        if isinstance(tt_dtype, _BLOCK):
            tt_dtype = tt_dtype.element_ty
        if isinstance(tt_dtype, pointer_type):
            return original(tt_dtype)
        found = kept.get(tt_dtype)
        if found is None:
            found = kept[tt_dtype] = original(tt_dtype)
        return found

    with _attributes_set(interpreter, _get_np_dtype=np_dtype):
        yield


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
        if not _held_here():
            return original(fn)
        langs = seen.get(id(fn.__globals__))
        if langs is None:
            langs = seen.setdefault(id(fn.__globals__), _language_modules(fn))
        if langs and langs <= patched:
            return empty_scope()  # the caller restores nothing from it: nothing was set
        patched.update(langs)
        return original(fn)

    with _attributes_set(interpreter, _patch_lang=patch_once):
        yield


def _language_modules(fn: Any) -> set[int]:
    """The ids of the ``triton.language`` modules ``fn`` sees, as the interpreter finds them."""
    return {
        id(value)
        for value in fn.__globals__.values()
        if inspect.ismodule(value) and (value is tl or value is tl.core)
    }
