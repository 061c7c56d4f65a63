"""The pieces backends, peers and mutants share are public modules, imported by public names."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SHARED_MODULES = [
    "tp_logprob.kernels.dtypes",
    "tp_logprob.kernels.fixed_point",
    "tp_logprob.kernels.fused_chunks",
    "tp_logprob.kernels.merge",
    "tp_logprob.kernels.partials",
    "tp_logprob.kernels.processed",
    "tp_logprob.kernels.radix_select",
    "tp_logprob.kernels.results",
    "tp_logprob.kernels.rowwise",
    "tp_logprob.kernels.shards",
    "tp_logprob.kernels.support_mask",
    "tp_logprob.kernels.support_threshold",
    "tp_logprob.kernels.validation",
]

SHARING_PACKAGES = ("tp_logprob.kernels", "tp_logprob.peers", "tests.mutants")
"""Modules whose private names no other module may import."""


@pytest.mark.parametrize("name", SHARED_MODULES)
def test_all_lists_what_the_module_defines(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__doc__, f"{name} has no docstring saying why it exists"
    exported = set(module.__all__)
    missing = {attr for attr in exported if not hasattr(module, attr)}
    assert not missing, f"{name}.__all__ names missing attributes: {sorted(missing)}"
    defined = {
        attr
        for attr, value in vars(module).items()
        if not attr.startswith("_")
        and (inspect.isfunction(value) or inspect.isclass(value))
        and value.__module__ == name
    }
    assert defined <= exported, f"{name} defines names not in __all__: {sorted(defined - exported)}"


def _private_imports(path: Path) -> list[str]:
    """``module.name`` for each private name ``path`` takes from a sharing package."""
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                if target.startswith(SHARING_PACKAGES):
                    aliases[alias.asname or alias.name] = target
                if node.module.startswith(SHARING_PACKAGES) and alias.name.startswith("_"):
                    found.append(target)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{aliases[node.value.id]}.{node.attr}")
    return found


def test_no_module_imports_a_private_name_of_the_kernels_peers_or_mutants() -> None:
    files = [*(ROOT / "src").rglob("*.py"), *(ROOT / "tests" / "mutants").rglob("*.py")]
    offences = {
        str(path.relative_to(ROOT)): names for path in files if (names := _private_imports(path))
    }
    assert not offences, f"private names imported across modules: {offences}"


def test_the_scan_sees_private_imports(tmp_path: Path) -> None:
    source = tmp_path / "example.py"
    source.write_text(
        "from tp_logprob.kernels import native\n"
        "from tp_logprob.kernels.native import _hidden\n"
        "native._other(1)\n",
        encoding="utf-8",
    )
    assert _private_imports(source) == [
        "tp_logprob.kernels.native._hidden",
        "tp_logprob.kernels.native._other",
    ]
