"""Which releases of its library an adapter serves, and the error it raises for the others.

An adapter calls its library the way each release spells the call, and a release
whose entry point is missing, or spelled in a way the adapter was not built for,
is refused before any work, by name: :class:`UnservedReleaseError` says the
installed version, the releases served and what the others lack. Each adapter
declares its releases once (:class:`ServedReleases`), and the same object
checks the installed distribution and writes the range for the docs.
"""

from __future__ import annotations

import dataclasses
import re
from importlib import metadata

__all__ = ["Release", "ServedReleases", "UnservedReleaseError", "parse_release"]

Release = tuple[int, ...]
"""A release as numbers, ``(major, minor, patch[, more])``; a suffix (``.post1``) is dropped."""


_NUMBERS = r"\d+(?:\.\d+)*"


class UnservedReleaseError(RuntimeError):
    """The installed release of a peer library is one its adapter does not serve."""


def parse_release(version: str) -> Release:
    """``version``'s leading numbers, at least three (``"0.10"`` is ``(0, 10, 0)``)."""
    found = re.match(_NUMBERS, version)
    if found is None:
        raise UnservedReleaseError(f"version={version!r}: not a release number")
    numbers = tuple(int(part) for part in found.group().split("."))
    return numbers + (0,) * (3 - len(numbers))


def _key(release: Release) -> Release:
    """``release`` padded with zeros, so that ``(0, 8)`` and ``(0, 8, 0)`` compare equal."""
    return release + (0,) * (_LONGEST - len(release))


_LONGEST = 8
"""More numbers than any release here has (vLLM's ``0.10.1.1`` has four)."""


def _spelled(release: Release) -> str:
    return ".".join(map(str, release))


@dataclasses.dataclass(frozen=True)
class ServedReleases:
    """The releases ``[first, end)`` of each span of ``spans`` of ``distribution``.

    ``others`` says what the releases outside lack (the entry point, the per-token
    form, the signature the adapter calls), for the error.
    """

    distribution: str
    spans: tuple[tuple[Release, Release], ...]
    others: str

    def __post_init__(self) -> None:
        for first, end in self.spans:
            if not first < end:
                raise ValueError(f"spans: ({first!r}, {end!r}): first must precede end")

    def __str__(self) -> str:
        """The spans as requirement strings, ``liger-kernel>=0.5.3,<0.5.9 or >=0.6.3,<0.9``."""
        spans = [f">={_spelled(first)},<{_spelled(end)}" for first, end in self.spans]
        return f"{self.distribution}{' or '.join(spans)}"

    def check(self, version: str) -> Release:
        """``version`` as a :data:`Release`; :class:`UnservedReleaseError` unless it is served."""
        release = parse_release(version) if re.match(_NUMBERS, version) else None
        if release is None or not any(
            _key(first) <= _key(release) < _key(end) for first, end in self.spans
        ):
            raise UnservedReleaseError(
                f"{self.distribution} {version!r} is installed: the adapter serves {self} "
                f"only; {self.others}"
            )
        return release

    def installed(self) -> Release:
        """The installed distribution's release, checked (:meth:`check`)."""
        return self.check(metadata.version(self.distribution))
