"""Pinning: keep a validated artifact under ``tests/regressions`` so CI replays it forever."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from tp_logprob.replay.artifacts import (
    FailureArtifact,
    artifact_paths,
    atomic_write,
    load_artifact,
)
from tp_logprob.suite.property import SuiteProperty

__all__ = ["DEFAULT_REGRESSIONS_DIR", "pin"]

DEFAULT_REGRESSIONS_DIR = "tests/regressions"


def pin(
    path: str | os.PathLike[str],
    properties: Mapping[str, SuiteProperty],
    destination: str | os.PathLike[str] = DEFAULT_REGRESSIONS_DIR,
) -> list[FailureArtifact]:
    """Validate every artifact under ``path`` (of one of ``properties``) and copy its pair
    into ``destination``.

    All artifacts are validated before any is copied, so a bad one pins nothing
    (:class:`~tp_logprob.replay.artifacts.ArtifactError`). Returns the pinned
    artifacts as loaded from ``destination``.
    """
    loaded = [load_artifact(file, properties) for file in artifact_paths(path)]
    folder = Path(destination)
    folder.mkdir(parents=True, exist_ok=True)
    pinned = []
    for artifact in loaded:
        target = folder / artifact.json_path.name
        atomic_write(target.with_suffix(".npz"), artifact.npz_path.read_bytes())
        atomic_write(target, artifact.json_path.read_bytes())
        pinned.append(load_artifact(target, properties))
    return pinned
