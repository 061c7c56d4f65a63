"""Every property of the suite, declared once where its test is, and runnable outside Hypothesis.

A property's body is ``body(backend, case, params, **context)``: it raises
:class:`~tp_logprob.judging.violation.PropertyViolation` when the property does
not hold for ``case``. ``params`` holds what the property drew besides the case
(scalars, short lists, numpy arrays), as its :class:`~tp_logprob.suite.params.PropertySpec`
declares, so a failure can be stored as data and replayed. The body sits in the
property's test module, declared with :func:`suite_property`::

    @suite_property("batch_invariance", arrays={"rows": ArraySpec("int64", any_length)})
    def batch_invariance(backend, case, params, *, stats=None): ...

and the test calls :func:`run_property`, which tags a failure with a
:class:`FailureRecord` for the plugin to write as an artifact. :func:`suite_properties`
returns the catalogue with every module of the suite imported: what the replay
layer and the command line are handed.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tp_logprob.strategies import LogprobCase
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.params import ArraySpec, PropertySpec

__all__ = [
    "FAILURE_ATTRIBUTE",
    "SUITE_PROPERTIES",
    "FailureRecord",
    "PropertyBody",
    "PropertyCatalogue",
    "PropertyRun",
    "SuiteProperty",
    "failure_record",
    "recording_runs",
    "run_property",
    "suite_properties",
    "suite_property",
]

PropertyBody = Callable[..., None]
"""``body(backend, case, params, **context) -> None``; raises when the property fails."""

FAILURE_ATTRIBUTE = "tp_logprob_failure"
"""The attribute :func:`run_property` sets on an exception raised by a property."""


@dataclass(frozen=True)
class SuiteProperty:
    """A named property: its body and the declaration of the params it takes."""

    name: str
    body: PropertyBody
    spec: PropertySpec = field(default_factory=PropertySpec)

    def __call__(
        self,
        backend: BackendUnderTest,
        case: LogprobCase,
        params: Mapping[str, Any],
        **context: Any,
    ) -> None:
        self.body(backend, case, params, **context)


class PropertyCatalogue(Mapping[str, SuiteProperty]):
    """Properties by name. A name is declared once; declaring it again with another body
    is an error (re-importing the same module is not)."""

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


SUITE_PROPERTIES = PropertyCatalogue()
"""The suite's properties, filled as its modules are imported (see :func:`suite_properties`)."""


def suite_property(
    name: str,
    *,
    params: Mapping[str, str] | None = None,
    optional: frozenset[str] | set[str] = frozenset(),
    arrays: Mapping[str, ArraySpec] | None = None,
) -> Callable[[PropertyBody], PropertyBody]:
    """Declare ``body`` as the property ``name`` in :data:`SUITE_PROPERTIES`.

    ``params`` maps each scalar param to its kind (see
    :data:`~tp_logprob.suite.params.PARAM_KINDS`), ``optional`` names those that
    may be absent, ``arrays`` declares the array params. Returns ``body`` unchanged.
    """
    spec = PropertySpec(dict(params or {}), frozenset(optional), dict(arrays or {}))

    def declare(body: PropertyBody) -> PropertyBody:
        SUITE_PROPERTIES.add(SuiteProperty(name, body, spec))
        return body

    return declare


PROPERTIES_PACKAGE = "tp_logprob.properties"
"""Where the property bodies live: every ``test_*`` module of this package."""
_PROPERTIES_DIR = Path(__file__).resolve().parents[1] / "properties"
_IMPORTED: list[bool] = []


def suite_properties() -> PropertyCatalogue:
    """:data:`SUITE_PROPERTIES` with every property module of the suite imported.

    Import it outside a running Hypothesis test (the plugin does, at collection):
    the modules apply ``@given``, which Hypothesis refuses inside another test.
    """
    if not _IMPORTED:
        for module in sorted(pkgutil.iter_modules([str(_PROPERTIES_DIR)]), key=lambda m: m.name):
            if module.name.startswith("test_"):
                importlib.import_module(f"{PROPERTIES_PACKAGE}.{module.name}")
        _IMPORTED.append(True)
    return SUITE_PROPERTIES


@dataclass(frozen=True)
class FailureRecord:
    """One failing run of a property: enough to write an artifact that replays it."""

    prop: str
    backend: BackendUnderTest
    case: LogprobCase
    params: dict[str, Any]
    error: BaseException


@dataclass(frozen=True)
class PropertyRun:
    """One call of :func:`run_property`: which property, on which backend and case."""

    prop: str
    backend: BackendUnderTest
    case: LogprobCase
    params: dict[str, Any]

    def failed(self, error: BaseException) -> FailureRecord:
        """The record of this run failing with ``error``."""
        return FailureRecord(self.prop, self.backend, self.case, self.params, error)


_RUNS: ContextVar[list[PropertyRun] | None] = ContextVar("tp_logprob_property_runs", default=None)


@contextmanager
def recording_runs() -> Iterator[list[PropertyRun]]:
    """Collect every :func:`run_property` call made inside the block, in order.

    The ranks of a real process group compare what they ran (see
    :mod:`tp_logprob.real_group.lockstep`); a rank whose peer failed finds there the
    case and params of the failing property, to write its artifact.
    """
    runs: list[PropertyRun] = []
    token = _RUNS.set(runs)
    try:
        yield runs
    finally:
        _RUNS.reset(token)


def run_property(
    name: str,
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any] | None = None,
    **context: Any,
) -> None:
    """Run property ``name``; if it raises, tag the exception with a :class:`FailureRecord`.

    Hypothesis re-raises the exceptions of its final (shrunk) runs, so the tags the
    plugin finds on a failed test's exceptions are the minimal failing examples.
    """
    drawn = {
        key: np.array(value) if isinstance(value, np.ndarray) else value
        for key, value in (params or {}).items()
    }
    runs = _RUNS.get()
    if runs is not None:
        runs.append(PropertyRun(name, backend, case, drawn))
    try:
        suite_properties()[name](backend, case, drawn, **context)
    except Exception as error:
        setattr(error, FAILURE_ATTRIBUTE, FailureRecord(name, backend, case, drawn, error))
        raise


def failure_record(error: BaseException | None) -> list[FailureRecord]:
    """The records on ``error`` and on the exceptions of an exception group inside it."""
    if error is None:
        return []
    found = getattr(error, FAILURE_ATTRIBUTE, None)
    records = [found] if isinstance(found, FailureRecord) else []
    inner = getattr(error, "exceptions", None)
    if isinstance(inner, (list, tuple)):
        records += [record for item in inner for record in failure_record(item)]
    return records
