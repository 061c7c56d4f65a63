"""Pinned failures (``python -m tp_logprob pin``) replayed on every applicable backend.

Each artifact under ``tests/regressions`` was once a failing example; every
backend registered here that claims its contract must now pass its property.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tp_logprob.registry import detect_platform
from tp_logprob.replay.artifacts import artifact_paths, load_artifact
from tp_logprob.replay.catalogue import suite_properties
from tp_logprob.replay.runner import Outcome, replay
from tp_logprob.suite.backends import resolve_backends

SUITE = suite_properties()

REGRESSIONS = Path(__file__).resolve().parents[1] / "regressions"
PINNED = artifact_paths(REGRESSIONS)
PLATFORM = detect_platform()
BACKENDS = resolve_backends([], PLATFORM)


def test_some_artifacts_are_pinned() -> None:
    assert PINNED, f"no artifacts under {REGRESSIONS}"


@pytest.mark.parametrize("backend", BACKENDS, ids=[b.backend_id for b in BACKENDS])
@pytest.mark.parametrize("path", PINNED, ids=[p.stem[:12] for p in PINNED])
def test_pinned_failure_stays_fixed(path: Path, backend: object) -> None:
    artifact = load_artifact(path, SUITE)
    result = replay(artifact, backend, SUITE)  # type: ignore[arg-type]
    if result.outcome is Outcome.SKIPPED:
        pytest.skip(f"{result.backend_id} does not claim the contract: {result.detail}")
    assert result.outcome is Outcome.PASSED, result.detail
