"""Which backends the suite checks, and how a third party hands us its own.

``--tp-logprob-backend`` takes a registered backend id, or ``module:attr`` where
``attr`` is one of:

- a registration function ``register(registry)`` that calls
  ``registry.register_logprob_backend(platform, factory, capability)``;
- a ``(factory_or_op, capability)`` pair;
- a callable with no arguments returning such a pair.

A third-party backend is registered into a private :class:`KernelRegistry`, never
into the default one, and reached through ordinary dispatch, so the suite checks
exactly what a caller would get. On a real process group the session hands every
backend out bound to the group (:attr:`BackendUnderTest.group`), and a case of the
group's TP degree runs there.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tp_logprob.capability import LogprobBackendCapability
from tp_logprob.contract import LogprobContract
from tp_logprob.registry import KernelRegistry
from tp_logprob.registry import registry as default_registry
from tp_logprob.result import LogprobResult

if TYPE_CHECKING:
    from hypothesis import settings

__all__ = ["BackendSpecError", "BackendUnderTest", "RankGroup", "resolve_backends"]


class RankGroup(Protocol):
    """The real process group this process is one rank of, as the harness runs cases on it
    (:class:`tp_logprob.real_group.group.RealGroup` is the one the plugin starts)."""

    world_size: int

    def run(
        self,
        call: Callable[[int, LogprobContract, Any], Any],
        contract: LogprobContract,
        device: Any,
    ) -> list[LogprobResult]:
        """``call(rank, rank_contract, handle)`` on this rank; every rank's results."""
        ...

    def assemble(self, leaf: Any, bounds: Sequence[tuple[int, int]], dim: int) -> Any:
        """``leaf.grad`` with every rank's ``bounds`` slice along ``dim`` from that rank."""
        ...

    def sum_partials(self, leaf: Any) -> Any:
        """Every rank's ``leaf.grad`` summed in rank order."""
        ...

    def settings_for(self, base: settings) -> settings:
        """``base`` as the ranks can keep it in lockstep."""
        ...


class BackendSpecError(ValueError):
    """A ``--tp-logprob-backend`` value that names no usable backend."""


@dataclass(frozen=True)
class BackendUnderTest:
    """One backend the suite checks: its capability and the registry that dispatches it."""

    spec: str
    capability: LogprobBackendCapability
    registry: KernelRegistry
    platform: str
    group: RankGroup | None = None
    """The real process group a case of its TP degree runs on; None: the emulated group."""

    @property
    def backend_id(self) -> str:
        """The id the backend registered under."""
        return self.capability.backend_id

    @property
    def device(self) -> str:
        """Where the suite puts tensors for this backend."""
        return "cpu" if self.platform == "cpu" else "cuda"

    def op_for(self, contract: LogprobContract) -> Callable[..., Any]:
        """The op dispatch gives for ``contract`` when this backend is requested by id."""
        return self.registry.get_logprob_op(contract, self.backend_id, platform=self.platform).op

    def load_failure(self) -> str | None:
        """Build the backend now; the factory's error if it failed, else None."""
        return self.registry.load_backends(self.platform).get(self.backend_id)


def resolve_backends(specs: Sequence[str], platform: str) -> list[BackendUnderTest]:
    """The backends named by ``specs``; every backend registered on ``platform`` if none."""
    if not specs:
        return [
            BackendUnderTest(capability.backend_id, capability, default_registry, platform)
            for capability in default_registry.backends(platform)
        ]
    chosen: list[BackendUnderTest] = []
    for spec in specs:
        chosen.extend(_resolve(spec.strip(), platform))
    seen: dict[str, str] = {}
    for backend in chosen:
        if backend.backend_id in seen:
            raise BackendSpecError(
                f"--tp-logprob-backend={backend.spec!r}: backend id {backend.backend_id!r} "
                f"is already selected by --tp-logprob-backend={seen[backend.backend_id]!r}"
            )
        seen[backend.backend_id] = backend.spec
    return chosen


def _resolve(spec: str, platform: str) -> list[BackendUnderTest]:
    if ":" not in spec:
        by_id = {cap.backend_id: cap for cap in default_registry.backends(platform)}
        if spec not in by_id:
            known = ", ".join(sorted(by_id)) or "none"
            raise BackendSpecError(
                f"--tp-logprob-backend={spec!r}: not registered on platform {platform!r} "
                f"(registered: {known}); name a third-party backend as module:attr"
            )
        return [BackendUnderTest(spec, by_id[spec], default_registry, platform)]
    module_name, _, attr = spec.rpartition(":")
    target = getattr(_import(spec, module_name), attr, None)
    if target is None:
        raise BackendSpecError(f"--tp-logprob-backend={spec!r}: {module_name} has no {attr!r}")
    private = KernelRegistry()
    if isinstance(target, tuple):
        _register_pair(spec, private, platform, target)
    elif callable(target) and _required_positional(target) == 1:
        target(private)
    elif callable(target) and _required_positional(target) == 0:
        _register_pair(spec, private, platform, target())
    else:
        raise BackendSpecError(
            f"--tp-logprob-backend={spec!r}: {attr} must be register(registry), a "
            f"(factory_or_op, capability) pair or a callable returning one; got {target!r}"
        )
    capabilities = private.backends(platform)
    if not capabilities:
        raise BackendSpecError(
            f"--tp-logprob-backend={spec!r}: registered no backend on platform {platform!r}"
        )
    return [BackendUnderTest(spec, cap, private, platform) for cap in capabilities]


def _import(spec: str, module_name: str) -> Any:
    """Import ``module_name``, or load it from a file path such as ``path/to/kernel.py``."""
    if module_name.endswith(".py"):
        path = Path(module_name).resolve()
        if not path.is_file():
            raise BackendSpecError(f"--tp-logprob-backend={spec!r}: no file {path}")
        return _load_file(spec, path)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        # The `pytest` script, unlike `python -m pytest`, does not put the working
        # directory on sys.path; a module named on the command line is looked up there,
        # with the directory on sys.path while it loads, not after.
        cwd = os.getcwd()
        if error.name != module_name.split(".")[0] or cwd in sys.path:
            raise _unimportable(spec, module_name, error) from error
        sys.path.insert(0, cwd)
        try:
            return importlib.import_module(module_name)
        except ImportError as retry_error:
            raise _unimportable(spec, module_name, retry_error) from retry_error
        finally:
            sys.path.remove(cwd)
    except ImportError as error:
        raise _unimportable(spec, module_name, error) from error


def _load_file(spec: str, path: Path) -> Any:
    """Load the module at ``path`` as ``python path`` would find its imports.

    A file in a package (its folder holds an ``__init__.py``) is imported as part of that
    package, from the folder above the package's top, so its relative imports and imports
    of its own package resolve; any other file is loaded on its own, with its folder
    importable, so a package beside it resolves. The folder is on ``sys.path`` while the
    module loads, not after: a module imports what it needs when it loads.
    """
    top = path.parent
    while (top / "__init__.py").is_file():
        top = top.parent
    parts = path.relative_to(top).with_suffix("").parts
    folder = str(top)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        if len(parts) > 1:
            return _import_from_package(spec, path, ".".join(parts))
        return _exec_file(spec, path)
    except ImportError as error:
        raise _unloadable(spec, path, folder, len(parts) > 1, error) from error
    finally:
        if added:
            sys.path.remove(folder)


def _import_from_package(spec: str, path: Path, name: str) -> Any:
    module = importlib.import_module(name)
    found = getattr(module, "__file__", None)
    if found is None or Path(found).resolve() != path:
        raise BackendSpecError(
            f"--tp-logprob-backend={spec!r}: {path} is module {name!r} of its package, but "
            f"{name!r} is already imported from {found}; rename the package or pass "
            f"{name}:attr instead of the file"
        )
    return module


def _exec_file(spec: str, path: Path) -> Any:
    name = f"tp_logprob_user_backend_{path.stem}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise BackendSpecError(f"--tp-logprob-backend={spec!r}: cannot load {path}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _unloadable(
    spec: str, path: Path, folder: str, packaged: bool, error: ImportError
) -> BackendSpecError:
    """The error for a file whose own imports failed: which import, and what would fix it."""
    if error.name is None and not packaged:
        fix = (
            f"a relative import needs a package: add an __init__.py beside {path.name} (and "
            "above it, up to the package's top) or import by absolute name"
        )
    elif error.name is None:
        fix = "check the names it imports from its package"
    else:
        fix = (
            f"install the distribution that provides {error.name!r} (pip install -e "
            f"path/to/your/project), or put package {error.name!r} in {folder}"
        )
    return BackendSpecError(
        f"--tp-logprob-backend={spec!r}: loading {path} failed on an import "
        f"({type(error).__name__}: {error}); {fix}"
    )


def _unimportable(spec: str, module_name: str, error: ImportError) -> BackendSpecError:
    return BackendSpecError(
        f"--tp-logprob-backend={spec!r}: cannot import {module_name!r} ({error}); run pytest "
        "from the directory that holds it, or pass a file path like path/to/kernel.py:attr"
    )


def _register_pair(spec: str, registry: KernelRegistry, platform: str, pair: object) -> None:
    if not (isinstance(pair, tuple) and len(pair) == 2):
        raise BackendSpecError(
            f"--tp-logprob-backend={spec!r}: expected a (factory_or_op, capability) pair, "
            f"got {pair!r}"
        )
    factory_or_op, capability = pair
    if not isinstance(capability, LogprobBackendCapability):
        raise BackendSpecError(
            f"--tp-logprob-backend={spec!r}: second item {capability!r} is not a "
            "LogprobBackendCapability"
        )
    if not callable(factory_or_op):
        raise BackendSpecError(f"--tp-logprob-backend={spec!r}: {factory_or_op!r} is not callable")
    # An op takes (local_logits, targets, contract[, group]); a factory takes nothing.
    is_op = _required_positional(factory_or_op) >= 3
    factory = (lambda: factory_or_op) if is_op else factory_or_op
    registry.register_logprob_backend(platform, factory, capability)


def _required_positional(function: Callable[..., Any]) -> int:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return -1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in parameters if p.kind in kinds and p.default is p.empty)
