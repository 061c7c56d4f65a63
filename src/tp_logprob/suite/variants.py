"""A property test over several variants of itself: a pinned case by name, a sweep's layout.

A test declares its variants with :func:`variants` (the harness imports no pytest);
the plugin parametrizes it over them after the backend, as ``@pytest.mark.parametrize``
would::

    @variants("layout", ["tp1", "uneven"])
    @given(data=st.data())
    def test_sweep(tp_logprob_backend, tp_logprob_suite, layout, data): ...
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["Variants", "declared_variants", "variants"]

Test = TypeVar("Test", bound=Callable[..., Any])

_ATTRIBUTE = "_tp_logprob_variants"


@dataclass(frozen=True)
class Variants:
    """The values argument ``name`` of a test takes, one test each, with their ids."""

    name: str
    values: tuple[Any, ...]
    ids: Callable[[Any], str] | None = None


def variants(
    name: str, values: Sequence[Any], *, ids: Callable[[Any], str] | None = None
) -> Callable[[Test], Test]:
    """Run the test once per value of its argument ``name`` (``ids(value)`` names each)."""
    if not values:
        raise ValueError(f"variants({name!r}): values=[] gives the test nothing to run")

    def mark(test: Test) -> Test:
        declared = (*declared_variants(test), Variants(name, tuple(values), ids))
        setattr(test, _ATTRIBUTE, declared)
        return test

    return mark


def declared_variants(test: object) -> tuple[Variants, ...]:
    """What :func:`variants` declared on ``test``, outermost last."""
    found: tuple[Variants, ...] = getattr(test, _ATTRIBUTE, ())
    return found
