"""A property of the suite: a named body, declared where its test is and called directly.

A property's body is ``body(backend, case, params, **context)``: it raises
:class:`~tp_logprob.judging.violation.PropertyViolation` when the property does
not hold for ``case``. ``params`` holds what the property drew besides the case
(scalars, short lists, numpy arrays), as its :class:`~tp_logprob.suite.params.PropertySpec`
declares, so a failure can be stored as data and replayed. The body sits in the
property's test module, declared with :func:`suite_property`, which returns the
:class:`SuiteProperty`::

    @suite_property("batch_invariance", arrays={"rows": ArraySpec("int64", any_length)})
    def batch_invariance(backend, case, params, *, stats=None): ...

and the test calls it: ``batch_invariance.run(backend, case, {"rows": rows})``, which
tags a failure with a :class:`FailureRecord` for the plugin to write as an artifact.
The catalogue of every property by name (:mod:`tp_logprob.replay.catalogue`) serves
replay and the command line, outside the harness.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tp_logprob.strategies import LogprobCase
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.params import ArraySpec, PropertySpec

__all__ = [
    "FAILURE_ATTRIBUTE",
    "FailureRecord",
    "PropertyBody",
    "PropertyRun",
    "SuiteProperty",
    "failure_record",
    "recording_runs",
    "suite_property",
]

PropertyBody = Callable[..., None]
"""``body(backend, case, params, **context) -> None``; raises when the property fails."""

FAILURE_ATTRIBUTE = "tp_logprob_failure"
"""The attribute :meth:`SuiteProperty.run` sets on an exception raised by a property."""


@dataclass(frozen=True)
class SuiteProperty:
    """A named property: its body and the declaration of the params it takes.

    Calling it runs the body alone (as replay does); :meth:`run` is what a test calls.
    """

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

    def run(
        self,
        backend: BackendUnderTest,
        case: LogprobCase,
        params: Mapping[str, Any] | None = None,
        **context: Any,
    ) -> None:
        """Run the property on ``case``; if it raises, tag the exception with a
        :class:`FailureRecord`.

        Hypothesis re-raises the exceptions of its final (shrunk) runs, so the tags the
        plugin finds on a failed test's exceptions are the minimal failing examples.
        """
        drawn = {
            key: np.array(value) if isinstance(value, np.ndarray) else value
            for key, value in (params or {}).items()
        }
        runs = _RUNS.get()
        if runs is not None:
            runs.append(PropertyRun(self.name, backend, case, drawn))
        try:
            self(backend, case, drawn, **context)
        except Exception as error:
            setattr(error, FAILURE_ATTRIBUTE, FailureRecord(self.name, backend, case, drawn, error))
            raise


def suite_property(
    name: str,
    *,
    params: Mapping[str, str] | None = None,
    optional: frozenset[str] | set[str] = frozenset(),
    arrays: Mapping[str, ArraySpec] | None = None,
) -> Callable[[PropertyBody], SuiteProperty]:
    """Declare ``body`` as the property ``name``; the :class:`SuiteProperty`.

    ``params`` maps each scalar param to its kind (see
    :data:`~tp_logprob.suite.params.PARAM_KINDS`), ``optional`` names those that
    may be absent, ``arrays`` declares the array params.
    """
    spec = PropertySpec(dict(params or {}), frozenset(optional), dict(arrays or {}))

    def declare(body: PropertyBody) -> SuiteProperty:
        return SuiteProperty(name, body, spec)

    return declare


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
    """One call of :meth:`SuiteProperty.run`: which property, on which backend and case."""

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
    """Collect every :meth:`SuiteProperty.run` call made inside the block, in order.

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
