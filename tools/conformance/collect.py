"""A pytest plugin the conformance runner loads: one JSON line per finished property test.

``pytest -p tools.conformance.collect`` with ``TP_LOGPROB_CONFORMANCE_RECORD=FILE``
appends ``{"nodeid", "outcome", "text", "duration"}`` for every test's call phase (and any
failing or skipping setup), where ``text`` is the failure report with the
plugin's replay and artifact lines, or the reason of a skip; and, outcome ``not
claimed``, every property the suite deselected because the backend does not claim
what it needs, with the capability field as the text. Under pytest-xdist only the
controller writes test reports (only the first worker the deselections: every worker
deselects the same), under ``torchrun`` only rank 0 (every rank reaches the same
outcomes).

While a test runs, the file :func:`running_file` beside the record holds its node id, so
that a process killed inside a library (a signal, not an exception) still says which
test it was in.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

RECORD_ENV = "TP_LOGPROB_CONFORMANCE_RECORD"

CHECKOUT = Path(__file__).resolve().parents[2]
"""The checkout that holds ``tools/``: not installed, so a pytest run elsewhere needs it on
its path to load this plugin."""


def recording_env(record: Path, **extra: str) -> dict[str, str]:
    """The environment of a pytest run that loads this plugin and appends to ``record``."""
    path = os.pathsep.join(filter(None, [str(CHECKOUT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, RECORD_ENV: str(record), "PYTHONPATH": path, **extra}


def running_file(record: Path) -> Path:
    """The file that names the test in progress, beside ``record``."""
    return record.with_name(f"{record.name}.running")


def _write(path: str, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


def pytest_deselected(items: Any) -> None:
    path = os.environ.get(RECORD_ENV)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    if not path or worker != "gw0" or os.environ.get("RANK", "0") != "0":
        return
    from tp_logprob.suite.applicability import unclaimed

    for item in items:
        params = dict(getattr(getattr(item, "callspec", None), "params", {}))
        backend = params.pop("tp_logprob_backend", None)
        reason = None if backend is None else unclaimed(getattr(item, "obj", None), backend, params)
        if reason is None:  # deselected by -k or -m, not for want of a claim
            continue
        _write(
            path, {"nodeid": item.nodeid, "outcome": "not claimed", "text": reason, "duration": 0.0}
        )


def _recording() -> str | None:
    """The record file, in the one process that writes it (see the module docstring)."""
    path = os.environ.get(RECORD_ENV)
    if not path or "PYTEST_XDIST_WORKER" in os.environ or os.environ.get("RANK", "0") != "0":
        return None
    return path


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    path = _recording()
    if path:
        running_file(Path(path)).write_text(nodeid, encoding="utf-8")


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    path = _recording()
    if path:
        running_file(Path(path)).unlink(missing_ok=True)


def pytest_runtest_logreport(report: Any) -> None:
    path = _recording()
    if not path:
        return
    if report.when != "call" and not (report.failed or report.skipped):
        return
    text = ""
    if report.failed:
        sections = "\n".join(content for _, content in report.sections if "replay" in _)
        text = f"{report.longreprtext}\n{sections}"
    elif report.skipped and isinstance(report.longrepr, tuple):  # (path, line, reason)
        text = str(report.longrepr[2]).removeprefix("Skipped: ")
    record = {
        "nodeid": report.nodeid,
        "outcome": report.outcome,
        "text": text,
        "duration": report.duration,
    }
    _write(path, record)
