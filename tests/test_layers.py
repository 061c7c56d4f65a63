"""The package's layers, read from its own imports: one direction, no circle.

Bottom to top: the runtime core (contract, capability, registry, communication,
emulation, the kernels and the peer adapters, which are backends like the kernels), the
oracle beside it, the strategies, the judging (``judging``: expected values, bounds,
comparisons and the violation they raise; it runs nothing, so the harness and
``tp_logprob.testing`` both judge with it), the suite's harness (``suite``: the session,
a property as its test calls it, draws, running and judging a case), the real-group runner
(``real_group``: it receives the session and hands it the group; the harness sees the
group only as the ``RankGroup`` its backends carry),
the property bodies (``properties``), replay (with the catalogue of properties by name,
which imports every property module), and the front on top (the command line,
the pytest plugin and ``tp_logprob.testing``, the asserts other projects' tests call,
which judge and record as the suite does). The tools (``tools/``: GPU readiness,
conformance, history) sit beside the package, outside its wheel, and nothing in it
imports them. A module may import its own layer or a lower one, never a higher one; the
kernels never import the oracle, and the oracle imports nothing of the package but
itself (nor torch, triton or hypothesis). Every import counts, inside functions too,
and one under ``if TYPE_CHECKING:`` as well: an annotation that names a higher layer is
an arrow that runs back up, whether or not it is executed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "core",
        (
            "tp_logprob",
            "tp_logprob.errors",
            "tp_logprob._validation",
            "tp_logprob.accumulation",
            "tp_logprob.support",
            "tp_logprob.engine_formats",
            "tp_logprob.contract_schema",
            "tp_logprob.contract",
            "tp_logprob.result",
            "tp_logprob.row_groups",
            "tp_logprob.capability",
            "tp_logprob.comm",
            "tp_logprob.registry",
            "tp_logprob.emulate",
            "tp_logprob.preflight",
            "tp_logprob.kernels",
            "tp_logprob.peers",
        ),
    ),
    ("oracle", ("tp_logprob.oracle",)),
    ("strategies", ("tp_logprob.strategies",)),
    ("judging", ("tp_logprob.judging",)),
    ("harness", ("tp_logprob.suite",)),
    ("real group", ("tp_logprob.real_group",)),
    ("properties", ("tp_logprob.properties",)),
    ("replay", ("tp_logprob.replay", "tp_logprob.rollout")),
    (
        "front",
        (
            "tp_logprob.__main__",
            "tp_logprob.cli",
            "tp_logprob.hardware",
            "tp_logprob.kernel_template",
            "tp_logprob.templates",
            "tp_logprob.pytest_plugin",
            "tp_logprob.real_group.plugin",
            "tp_logprob.testing",
        ),
    ),
)
"""Each layer's module prefixes; the longest matching prefix decides a module's layer.
The package itself (``tp_logprob``, its ``__init__``) matches only by name."""

RUNTIME_ONLY = ("tp_logprob.kernels",)
PYTEST_ONLY = ("tp_logprob.pytest_plugin", "tp_logprob.real_group.plugin")
"""The only modules that may import pytest: the plugin and the real group's plugin. The
harness raises its own exceptions and the property modules declare their variants with
the harness, so replay, which imports every property module (and through them the real
group's runner), runs without pytest installed, as do ``tp_logprob.testing`` and the
command line."""
USER_MODULE_LOADERS = ("tp_logprob.suite.backends",)
"""Modules whose dynamic import names no module of the package: they import the module a
user names (``--tp-logprob-backend=my_kernels:register``)."""
FOREIGN_TO_THE_ORACLE = ("torch", "triton", "hypothesis")


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    found = {}
    for path in sorted((SRC / "tp_logprob").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """``(imported name, line)`` for every import in the module, relative ones resolved, and
    every dynamic one (:func:`dynamic_imports`)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield (full if full in known else base), node.lineno
    for target, line, _ in dynamic_imports(tree, known):
        if target is not None:
            yield target, line


DYNAMIC = {"import_module", "__import__", "iter_modules", "walk_packages"}
"""What imports a module by a name computed at run time: ``importlib.import_module``,
``__import__`` and a ``pkgutil`` walk of a package's directory (which the walker then
imports module by module)."""


def dynamic_imports(
    tree: ast.Module, known: dict[str, Path]
) -> Iterator[tuple[str | None, int, str]]:
    """``(package module or None, line, call)`` for every dynamic import in ``tree``.

    The name is read from the call's argument: its string constants, an f-string's
    constant start (``f"{PACKAGE}.{name}"`` imports a module of ``PACKAGE``), and the
    values assigned to the names it uses, followed through the module; a walk's directory
    by the package directory it names. An argument that names none of the package
    falls back on every module name written in the module (a table of lazy imports);
    None where the module writes none either (it imports a user's module). A name that
    is another distribution's (``"torch"``) is no import of the package.
    """
    assigned: dict[str, list[ast.expr]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        assigned.setdefault(leaf.id, []).append(node.value)
    written = sorted(
        {
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value in known
            and node.value.startswith("tp_logprob.")
        }
    )
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if called not in DYNAMIC:
            continue
        strings = {text for arg in node.args for text in _strings(arg, assigned, set())}
        names = {text.rstrip(".") for text in strings if text.startswith("tp_logprob")}
        if called in {"iter_modules", "walk_packages"}:
            names |= {f"tp_logprob.{text}" for text in strings if f"tp_logprob.{text}" in known}
        if strings and not names:
            continue  # a module of another distribution (``torch``)
        for target in sorted(names) or written or [None]:
            yield target, node.lineno, called


def _strings(node: ast.AST, assigned: dict[str, list[ast.expr]], seen: set[str]) -> set[str]:
    """The strings ``node`` may evaluate to or start with, as far as they are written."""
    if isinstance(node, ast.Constant):
        return {node.value} if isinstance(node.value, str) else set()
    if isinstance(node, ast.Name):
        if node.id in seen:
            return set()
        seen.add(node.id)
        return {
            text for value in assigned.get(node.id, []) for text in _strings(value, assigned, seen)
        }
    if isinstance(node, ast.JoinedStr):
        prefixes = {""}
        for part in node.values:
            inner = part.value if isinstance(part, ast.FormattedValue) else part
            pieces = _strings(inner, assigned, seen)
            if not pieces:
                return {prefix for prefix in prefixes if prefix}
            prefixes = {prefix + piece for prefix in prefixes for piece in pieces}
        return prefixes
    return {
        text for child in ast.iter_child_nodes(node) for text in _strings(child, assigned, seen)
    }


def layer_of(name: str) -> int:
    best, level = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            nested = prefix != "tp_logprob" and name.startswith(prefix + ".")
            if (name == prefix or nested) and len(prefix) > best:
                best, level = len(prefix), index
    return level


def graph() -> dict[str, dict[str, int]]:
    """Module -> {imported package module: line}."""
    known = modules()
    edges: dict[str, dict[str, int]] = {}
    for name, path in known.items():
        edges[name] = {}
        for imported, line in imports(name, path, known):
            while imported and imported not in known:
                imported = imported.rpartition(".")[0]
            if imported.startswith("tp_logprob") and imported != name:
                edges[name].setdefault(imported, line)
    return edges


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in edges[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in edges:
        if node not in index:
            visit(node)
    return found


def test_every_module_has_a_layer() -> None:
    assert not [name for name in modules() if layer_of(name) < 0]


def test_no_module_imports_a_higher_layer() -> None:
    upward = [
        f"{name} ({LAYERS[layer_of(name)][0]}) imports {other} ({LAYERS[layer_of(other)][0]}), "
        f"{modules()[name].relative_to(SRC)}:{line}"
        for name, targets in graph().items()
        for other, line in targets.items()
        if layer_of(other) > layer_of(name)
    ]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_the_import_graph_has_no_circle() -> None:
    assert not cycles(graph()), cycles(graph())


def test_kernels_never_import_the_oracle() -> None:
    found = [
        f"{name} imports {other}"
        for name, targets in graph().items()
        if name.startswith(RUNTIME_ONLY)
        for other in targets
        if other.startswith("tp_logprob.oracle")
    ]
    assert not found, found


def test_the_oracle_imports_only_itself_numpy_and_mpmath() -> None:
    known = modules()
    found = [
        f"{name} imports {imported} (line {line})"
        for name, path in known.items()
        if name.startswith("tp_logprob.oracle")
        for imported, line in imports(name, path, known)
        if imported.split(".")[0] in FOREIGN_TO_THE_ORACLE
        or (imported.startswith("tp_logprob") and not imported.startswith("tp_logprob.oracle"))
    ]
    assert not found, found


def test_the_catalogues_walk_is_an_edge() -> None:
    """The catalogue by name imports every property module by walking their directory: the
    graph sees it, from replay (above the properties)."""
    assert "tp_logprob.properties" in graph()["tp_logprob.replay.catalogue"]


def test_the_harness_imports_no_property_dynamically() -> None:
    """Nothing of the harness imports a higher layer (a property module) by a computed name
    or by walking a directory; a test calls its property, the harness never looks one up."""
    known = modules()
    found = [
        f"{name} imports {target} ({called}, line {line})"
        for name, path in known.items()
        if name.startswith("tp_logprob.suite")
        for target, line, called in dynamic_imports(ast.parse(path.read_text()), known)
        if target is not None and layer_of(target) > layer_of(name)
    ]
    assert not found, found


def test_every_dynamic_import_is_resolved() -> None:
    """A dynamic import whose target the checker cannot read would be an edge it misses:
    only a loader of the user's own modules may name none of the package."""
    known = modules()
    unresolved = [
        f"{name}: {called}, line {line}"
        for name, path in known.items()
        for target, line, called in dynamic_imports(ast.parse(path.read_text()), known)
        if target is None and name not in USER_MODULE_LOADERS
    ]
    assert not unresolved, unresolved


def test_only_the_plugins_import_pytest() -> None:
    """pytest is no dependency: the harness, judging, the properties, ``tp_logprob.testing``,
    replay and the command line import it nowhere, inside functions neither."""
    known = modules()
    found = [
        f"{name} imports {imported} (line {line})"
        for name, path in known.items()
        if not name.startswith(PYTEST_ONLY)
        for imported, line in imports(name, path, known)
        if imported.split(".")[0] in {"pytest", "_pytest"}
    ]
    assert not found, found


def test_the_checker_sees_an_upward_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks can fail: a planted upward import and a planted circle are reported, and so
    are a dynamic upward import, a walk of the properties from the harness, an import no
    checker can read and pytest in the harness."""
    package = tmp_path / "tp_logprob"
    for folder in ("oracle", "replay", "suite", "properties"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "contract.py").write_text("from tp_logprob.replay import artifacts\n")
    (package / "oracle" / "__init__.py").write_text("import torch\n")
    (package / "replay" / "artifacts.py").write_text("import tp_logprob.contract\n")
    (package / "registry.py").write_text(
        "import importlib\nPACKAGE = 'tp_logprob.replay'\n"
        "def load(name):\n    return importlib.import_module(f'{PACKAGE}.{name}')\n"
    )
    (package / "suite" / "walker.py").write_text(
        "import pkgutil\nfrom pathlib import Path\nimport pytest\n"
        "HERE = Path(__file__).parents[1] / 'properties'\n"
        "FOUND = list(pkgutil.iter_modules([str(HERE)]))\n"
    )
    (package / "suite" / "loader.py").write_text(
        "import importlib\ndef load(name):\n    return importlib.import_module(name)\n"
    )
    monkeypatch.setattr(__import__(__name__, fromlist=["SRC"]), "SRC", tmp_path)
    with pytest.raises(AssertionError, match=r"tp_logprob.contract \(core\) imports") as caught:
        test_no_module_imports_a_higher_layer()
    assert "tp_logprob.registry (core) imports tp_logprob.replay (replay)" in str(caught.value)
    with pytest.raises(AssertionError, match=r"tp_logprob\.contract"):
        test_the_import_graph_has_no_circle()
    with pytest.raises(AssertionError, match="imports torch"):
        test_the_oracle_imports_only_itself_numpy_and_mpmath()
    with pytest.raises(AssertionError, match=r"walker imports tp_logprob.properties \(iter_mod"):
        test_the_harness_imports_no_property_dynamically()
    with pytest.raises(AssertionError, match=r"tp_logprob.suite.loader: import_module, line 3"):
        test_every_dynamic_import_is_resolved()
    with pytest.raises(AssertionError, match=r"tp_logprob.suite.walker imports pytest"):
        test_only_the_plugins_import_pytest()


def test_the_package_never_imports_the_tools() -> None:
    """``tools/`` sits beside the package, outside its wheel: nothing installed may need it,
    neither the GPU-readiness gate nor the conformance and history generators."""
    known = modules()
    found = [
        f"{name} imports {imported} (line {line})"
        for name, path in known.items()
        for imported, line in imports(name, path, known)
        if imported == "tools" or imported.startswith("tools.")
    ]
    assert not found, found


def test_the_peer_adapters_are_backends_not_suite() -> None:
    """An adapter is a backend beside the kernels: it imports neither the suite nor replay,
    so ``--tp-logprob-backend=tp_logprob.peers.X:Y`` loads no more than a kernel would."""
    found = [
        f"{name} imports {other}"
        for name, targets in graph().items()
        if name.startswith("tp_logprob.peers")
        for other in targets
        if other.startswith(("tp_logprob.properties", "tp_logprob.replay"))
    ]
    assert not found, found


def test_the_properties_package_holds_property_bodies_only() -> None:
    """The harness, the judging and the real group live beside ``properties/``: every module
    in it is a ``test_*`` module of properties (the catalogue imports them all)."""
    found = [
        name
        for name in modules()
        if name.startswith("tp_logprob.properties.")
        and not name.rpartition(".")[2].startswith("test_")
    ]
    assert not found, found


def test_the_rollout_check_needs_neither_pytest_nor_the_suite() -> None:
    """``rollout-check`` runs on the base install plus torch: nothing it imports, however
    deep, reaches the harness, the properties, pytest or Hypothesis. Of the judging it may
    take only what runs and draws nothing (the bounds), which the check below holds."""
    known, edges = modules(), graph()
    reached, todo = set(), [name for name in known if name.startswith("tp_logprob.rollout")]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(edges[name])
    banned = ("tp_logprob.suite", "tp_logprob.properties")
    found = sorted(name for name in reached if name.startswith(banned))
    found += [
        f"{name} imports {imported}"
        for name in sorted(reached)
        for imported, _ in imports(name, known[name], known)
        if imported.split(".")[0] in ("pytest", "_pytest", "hypothesis")
    ]
    assert not found, found
