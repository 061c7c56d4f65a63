"""Every property of the suite by name: what replay and the command line look one up in.

Inside the suite a test calls its property directly
(:class:`~tp_logprob.suite.property.SuiteProperty`); only an artifact names its
property by string, so only replay, the command line and the plugin's artifact
writer need the catalogue. :func:`suite_properties` imports every ``test_*`` module
of :mod:`tp_logprob.properties` and collects the properties it finds in them.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Iterator, Mapping
from pathlib import Path

from tp_logprob.suite.property import PropertyBody, SuiteProperty

__all__ = ["PROPERTIES_PACKAGE", "PropertyCatalogue", "suite_properties"]

PROPERTIES_PACKAGE = "tp_logprob.properties"
"""Where the property bodies live: every ``test_*`` module of this package."""
_PROPERTIES_DIR = Path(__file__).resolve().parents[1] / "properties"


class PropertyCatalogue(Mapping[str, SuiteProperty]):
    """Properties by name. A name is declared once; declaring it again with another body
    is an error (one module importing another's property is not)."""

    def __init__(self) -> None:
        self._properties: dict[str, SuiteProperty] = {}

    def add(self, prop: SuiteProperty) -> SuiteProperty:
        """Register ``prop``; the registered property."""
        known = self._properties.get(prop.name)
        if known is not None and _origin(known.body) != _origin(prop.body):
            raise ValueError(
                f"property {prop.name!r} is declared twice: {_origin(known.body)} and "
                f"{_origin(prop.body)}"
            )
        self._properties[prop.name] = prop
        return prop

    def __getitem__(self, name: str) -> SuiteProperty:
        return self._properties[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._properties)

    def __len__(self) -> int:
        return len(self._properties)

    def __repr__(self) -> str:
        return f"PropertyCatalogue({sorted(self._properties)})"


def _origin(body: PropertyBody) -> str:
    """Where ``body`` is written: its file and name (the same under any module name)."""
    code = getattr(body, "__code__", None)
    where = code.co_filename if code is not None else getattr(body, "__module__", "?")
    return f"{where}:{getattr(body, '__qualname__', body)}"


@functools.cache
def suite_properties() -> PropertyCatalogue:
    """Every property of the suite, with every property module imported.

    Import it outside a running Hypothesis test (the plugin does, at collection):
    the modules apply ``@given``, which Hypothesis refuses inside another test.
    """
    catalogue = PropertyCatalogue()
    for found in sorted(pkgutil.iter_modules([str(_PROPERTIES_DIR)]), key=lambda m: m.name):
        if found.name.startswith("test_"):
            module = importlib.import_module(f"{PROPERTIES_PACKAGE}.{found.name}")
            for value in vars(module).values():
                if isinstance(value, SuiteProperty):
                    catalogue.add(value)
    return catalogue
