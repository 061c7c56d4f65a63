"""Reading what :mod:`tools.conformance.collect` wrote: one record per property test.

A record's node id ends in ``test_name[backend_id]``; its text is the failure
report (a violation's report or a traceback, then the plugin's replay and
artifact lines) or the reason of a skip.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "CRASHED",
    "Failure",
    "Outcome",
    "Record",
    "headline",
    "outcomes",
    "read_records",
    "recorded_nodeids",
]

CRASHED = "Crashed:"
"""How the text of a test the library killed the process in begins (the runner writes it)."""

_ARTIFACT = re.compile(r"artifact\s+python -m tp_logprob replay (\S+\.json)")
_EXCEPTION = re.compile(r"^E\s+((?:[\w.]+\.)?\w*(?:Error|Exception|Exit)\w*:.*)$", re.MULTILINE)
_PARAM = re.compile(r"::(test_\w+)\[(.+)\]$")


def headline(text: str) -> str:
    """A property violation's first line, or the exception a traceback ends in."""
    found = _EXCEPTION.search(text)
    if found is not None:
        return found.group(1)[:200]
    lines = text.strip().splitlines()
    return lines[0][:200] if lines else ""


@dataclass(frozen=True)
class Record:
    """One property test's outcome (``passed``, ``failed`` or ``skipped``) for one backend."""

    test: str
    backend: str
    outcome: str
    text: str

    @property
    def artifact(self) -> str | None:
        """The failure artifact the plugin wrote, if any."""
        found = _ARTIFACT.search(self.text)
        return found.group(1) if found else None


def read_records(path: Path) -> list[Record]:
    """The records of ``path`` in the order they were first written, the last one of each
    test counting (a session resumed after a crash records its deselections again); none
    if it does not exist."""
    if not path.exists():
        return []
    records: dict[str, Record] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        match = _PARAM.search(record["nodeid"])
        if match is not None:
            test, params = match.groups()
            # The backend is the first parameter: ``test_pinned_case[liger_ce-eight width-1
            # shards]`` is liger_ce's (the peers' ids are snake_case, never hyphenated).
            backend = params.split("-", 1)[0]
            records[record["nodeid"]] = Record(test, backend, record["outcome"], record["text"])
    return list(records.values())


def recorded_nodeids(path: Path) -> list[str]:
    """The node ids ``path`` has a record of, in the order they were first written."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return list(dict.fromkeys(json.loads(line)["nodeid"] for line in lines))


@dataclass
class Failure:
    """One failing property of one backend."""

    test: str
    headline: str
    artifact: str | None


@dataclass
class Outcome:
    """One backend's results in a session."""

    passed: int = 0
    skipped: int = 0
    failures: list[Failure] = field(default_factory=list)


def outcomes(path: Path) -> dict[str, Outcome]:
    """The records of ``path`` counted by backend."""
    found: dict[str, Outcome] = {}
    for record in read_records(path):
        outcome = found.setdefault(record.backend, Outcome())
        if record.outcome == "not claimed":  # deselected: the matrix counts what ran
            continue
        if record.outcome == "passed":
            outcome.passed += 1
        elif record.outcome == "skipped":
            outcome.skipped += 1
        else:
            outcome.failures.append(Failure(record.test, headline(record.text), record.artifact))
    return found
