"""Definitions compiled from an installed package's files, for modules that do not import here.

Some libraries keep a pure-torch function in a module whose *other* imports need a
GPU build (SGLang's sampler reaches torchvision, OpenRLHF's model utilities reach
flash-attn and DeepSpeed). :func:`installed_definitions` reads the file the
installed distribution ships, takes the named top-level definitions (or a
class's methods, ``"Class.method"``) unchanged, and compiles them under the
file's own name and line numbers, in a namespace the adapter gives with the
names they use. What runs is the library's installed code, as the file states
it; a definition the release no longer has is an ``ImportError`` naming it.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["installed_definitions", "installed_file"]


def installed_file(package: str, relative: str) -> Path:
    """The file ``relative`` of the installed top-level ``package`` (nothing is imported)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"No module named {package!r}", name=package)
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise ImportError(f"{package}: the installed package has no {relative}")
    return path


def installed_definitions(
    package: str, files: Mapping[str, tuple[str, ...]], namespace: Mapping[str, Any]
) -> dict[str, Any]:
    """``{name: object}`` for every name of ``files`` (``{relative path: names}``).

    The definitions of each file are executed in one fresh copy of ``namespace``,
    shared across files, in the order given, so a later one may use an earlier one.
    """
    scope = dict(namespace)
    found: dict[str, Any] = {}
    for relative, names in files.items():
        path = installed_file(package, relative)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        module = ast.Module([_definition(tree, name, path) for name in names], type_ignores=[])
        # dont_inherit: the file's own future flags, not this module's.
        exec(compile(module, str(path), "exec", dont_inherit=True), scope)
        for name in names:
            found[name] = scope[name.rpartition(".")[2]]
    return found


def _definition(tree: ast.Module, name: str, path: Path) -> ast.stmt:
    """The top-level (``name``) or method (``Class.name``) definition ``name`` of ``tree``."""
    body: list[ast.stmt] = tree.body
    node: ast.ClassDef | ast.FunctionDef | None = None
    for part in name.split("."):
        node = next(
            (n for n in body if isinstance(n, ast.ClassDef | ast.FunctionDef) and n.name == part),
            None,
        )
        if node is None:
            raise ImportError(f"{path}: no definition {name!r}")
        body = node.body
    assert node is not None
    return node
