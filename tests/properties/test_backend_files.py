"""A backend named by its file (``path/to/kernel.py:attr``) finds its imports as
``python path/to/kernel.py`` would: a package beside it, or, for a file inside a package,
its own package and relative imports. An import that still fails names the file, the
import and the fix, and leaves ``sys.path`` and ``sys.modules`` as they were."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tp_logprob.suite.backends import BackendSpecError, resolve_backends

# A capability and op for a backend of its own id, built from torch_native's.
PAIR = """
import dataclasses
from tp_logprob.registry import registry

_NATIVE = next(c for c in registry.backends("cpu") if c.backend_id == "torch_native")
CAPABILITY = dataclasses.replace(_NATIVE, backend_id={backend_id!r})


def op(local_logits, targets, contract, group=None):
    native = registry.get_logprob_op(contract, "torch_native", platform="cpu").op
    return native(local_logits, targets, contract, group)


PAIR = (op, CAPABILITY)
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


@pytest.fixture
def fresh_imports() -> Iterator[None]:
    """Forget the modules a test's files add, and check ``sys.path`` is left as it was."""
    path, modules = list(sys.path), set(sys.modules)
    yield
    assert sys.path == path
    for name in set(sys.modules) - modules:
        del sys.modules[name]


@pytest.mark.usefixtures("fresh_imports")
def test_a_file_imports_the_package_beside_it(tmp_path: Path) -> None:
    write(tmp_path / "beside_pkg" / "__init__.py", PAIR.format(backend_id="beside"))
    kernel = write(tmp_path / "kernel.py", "from beside_pkg import PAIR\n")
    (backend,) = resolve_backends([f"{kernel}:PAIR"], "cpu")
    assert backend.backend_id == "beside"
    assert backend.load_failure() is None


@pytest.mark.usefixtures("fresh_imports")
def test_a_file_in_a_package_loads_as_part_of_it(tmp_path: Path) -> None:
    package = tmp_path / "project" / "own_pkg"
    write(package / "__init__.py", "")
    write(package / "kernels" / "__init__.py", "")
    write(package / "kernels" / "parts.py", PAIR.format(backend_id="packaged"))
    entry = write(
        package / "kernels" / "entry.py",
        "from own_pkg.kernels import parts\nfrom .parts import PAIR\nassert parts.PAIR is PAIR\n",
    )
    (backend,) = resolve_backends([f"{entry}:PAIR"], "cpu")
    assert backend.backend_id == "packaged"
    assert sys.modules["own_pkg.kernels.entry"].__file__ == str(entry)


@pytest.mark.usefixtures("fresh_imports")
def test_a_missing_import_names_the_file_the_import_and_the_fix(tmp_path: Path) -> None:
    kernel = write(tmp_path / "lonely.py", "import absent_kernel_pkg\n")
    with pytest.raises(BackendSpecError) as failure:
        resolve_backends([f"{kernel}:PAIR"], "cpu")
    assert str(failure.value) == (
        f"--tp-logprob-backend='{kernel}:PAIR': loading {kernel} failed on an import "
        "(ModuleNotFoundError: No module named 'absent_kernel_pkg'); install the distribution "
        "that provides 'absent_kernel_pkg' (pip install -e path/to/your/project), or put "
        f"package 'absent_kernel_pkg' in {tmp_path}"
    )
    assert not [name for name in sys.modules if name.endswith("_lonely")]


@pytest.mark.usefixtures("fresh_imports")
def test_a_relative_import_outside_a_package_says_to_make_one(tmp_path: Path) -> None:
    kernel = write(tmp_path / "relative.py", "from .parts import PAIR\n")
    with pytest.raises(BackendSpecError, match="a relative import needs a package: add an "):
        resolve_backends([f"{kernel}:PAIR"], "cpu")


@pytest.mark.usefixtures("fresh_imports")
def test_a_module_found_in_the_working_directory_leaves_it_off_sys_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "cwd_kernel_mod.py", PAIR.format(backend_id="from_cwd"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    before = list(sys.path)
    (backend,) = resolve_backends(["cwd_kernel_mod:PAIR"], "cpu")
    assert backend.backend_id == "from_cwd"
    assert sys.path == before
