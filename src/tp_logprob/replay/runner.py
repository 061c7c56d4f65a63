"""Replay: rerun a recorded property on its case, on the recorded backend or others.

A backend recorded as a registered id is looked up in the registry; one recorded
as ``module:attr`` must be named again with ``--backend``, because replay never
imports a module named inside an artifact.

An artifact that recorded its outputs' bits (schema 4) is also compared bit for bit
on the recorded backend (:mod:`tp_logprob.replay.bits`): a difference fails the
replay where the contract asks for ``cross_platform_bitwise`` and the capability
claims it on both platforms, and is printed as information elsewhere.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TextIO

from tp_logprob.judging.violation import PropertyInputError, PropertyViolation
from tp_logprob.replay.artifacts import (
    ArtifactError,
    FailureArtifact,
    artifact_paths,
    load_artifact,
)
from tp_logprob.replay.bits import compare_bits, observed_bits, promises_bits
from tp_logprob.replay.drift import format_rows, measure, worst_rows
from tp_logprob.replay.fused import describe_operands
from tp_logprob.suite.backends import BackendSpecError, BackendUnderTest, resolve_backends
from tp_logprob.suite.property import SuiteProperty

__all__ = ["Outcome", "ReplayResult", "replay", "replay_paths", "select_backends"]

EXIT_PASSED, EXIT_FAILED, EXIT_BAD_ARTIFACT = 0, 1, 2


class Outcome(str, enum.Enum):
    """How one replay on one backend ended."""

    PASSED = "PASS"
    FAILED = "FAIL"
    SKIPPED = "SKIP"


@dataclass(frozen=True)
class ReplayResult:
    """One artifact replayed on one backend."""

    artifact: FailureArtifact
    backend_id: str
    outcome: Outcome
    detail: str = ""
    bits: str = ""  # recorded against replayed output bits, when the artifact has them


class BackendChoiceError(ValueError):
    """The backend to replay on cannot be chosen without importing what the artifact names."""


def select_backends(
    artifact: FailureArtifact,
    platform: str,
    specs: Sequence[str] = (),
    *,
    all_backends: bool = False,
) -> list[BackendUnderTest]:
    """The backends to replay ``artifact`` on: ``specs``, all registered, or the recorded one."""
    try:
        if specs:
            return resolve_backends(list(specs), platform)
        if all_backends:
            return resolve_backends([], platform)
        if ":" in artifact.backend_spec:
            raise BackendChoiceError(
                f"{artifact.json_path}: backend {artifact.backend_id!r} was loaded from "
                f"{artifact.backend_spec!r}; replay never imports a module named in an "
                f"artifact. Name it yourself: --backend {artifact.backend_spec}"
            )
        return resolve_backends([artifact.backend_id], platform)
    except BackendSpecError as error:
        raise BackendChoiceError(str(error).replace("--tp-logprob-backend", "--backend")) from None


def replay(
    artifact: FailureArtifact,
    backend: BackendUnderTest,
    properties: Mapping[str, SuiteProperty],
) -> ReplayResult:
    """Rerun the artifact's property (from ``properties``) on ``backend``, on the emulated
    group; SKIP if the backend does not claim the contract or runs only on a real group."""
    reasons = backend.capability.incompatibilities(artifact.case.contract)
    if reasons:
        return ReplayResult(artifact, backend.backend_id, Outcome.SKIPPED, "; ".join(reasons))
    if backend.capability.real_group_only:
        return ReplayResult(
            artifact,
            backend.backend_id,
            Outcome.SKIPPED,
            f"{backend.backend_id} runs only on a real process group (real_group_only): rerun "
            f"{artifact.document.get('test') or 'its test'} under torchrun",
        )
    failure = backend.load_failure()
    if failure is not None:
        return ReplayResult(artifact, backend.backend_id, Outcome.FAILED, f"not loaded: {failure}")
    outcome, detail = Outcome.PASSED, ""
    try:
        properties[artifact.prop](backend, artifact.case, artifact.params)
    except PropertyInputError as error:
        raise ArtifactError(artifact.json_path, str(error)) from None
    except PropertyViolation as violation:
        outcome, detail = Outcome.FAILED, str(violation)
    except Exception as error:
        outcome, detail = Outcome.FAILED, f"{type(error).__name__}: {error}"
    bound, bits = _bits(artifact, backend)
    if bound and not bits.startswith("identical"):
        outcome = Outcome.FAILED
        detail = "\n".join(line for line in (detail, f"cross_platform_bitwise: {bits}") if line)
    return ReplayResult(artifact, backend.backend_id, outcome, detail, bits)


def _bits(artifact: FailureArtifact, backend: BackendUnderTest) -> tuple[bool, str]:
    """Whether the recorded bits bind ``backend`` here, and how they compare (or "")."""
    if artifact.output_bits is None or backend.backend_id != artifact.backend_id:
        return False, ""
    bound = promises_bits(
        backend.capability, artifact.case.contract, artifact.platform, backend.platform
    )
    try:
        observed = observed_bits(backend, artifact.case)
    except Exception as error:
        return bound, f"unavailable: {type(error).__name__}: {error}".splitlines()[0]
    comparison = compare_bits(artifact.output_bits, observed, artifact.platform)
    note = "" if bound or comparison.identical else " (information only: no bits are promised)"
    return bound, comparison.detail + note


def drift_report(artifact: FailureArtifact, backend: BackendUnderTest) -> list[str]:
    """Observed vs exact on the artifact's case: the worst rows by error / tolerance."""
    try:
        errors = measure(backend, artifact.case)
    except Exception as error:  # the property may fail before any output exists
        return [f"drift vs exact: unavailable ({type(error).__name__}: {error})".splitlines()[0]]
    lines = ["drift vs exact (worst rows by error / tolerance, fp32 ulps):"]
    lines += [f"  {line}" for line in format_rows(worst_rows(errors))]
    return lines


def case_lines(artifact: FailureArtifact) -> list[str]:
    """The recorded case in a line (two for a fused case: its operands too)."""
    lines = [f"case: {artifact.case.describe()}"]
    operands = describe_operands(artifact.case)
    return lines if operands is None else [*lines, f"operands: {operands}"]


def replay_paths(
    paths: Sequence[str],
    platform: str,
    specs: Sequence[str] = (),
    *,
    properties: Mapping[str, SuiteProperty],
    all_backends: bool = False,
    out: TextIO,
) -> int:
    """Replay every artifact under ``paths`` (each of one of ``properties``); print one line
    per run (and reports); exit status.

    0: every run passed (or was skipped); 1: a property still fails; 2: an artifact
    was refused or its backend could not be chosen.
    """
    status = EXIT_PASSED
    files = [file for path in paths for file in artifact_paths(path)]
    if not files:
        print(f"no artifacts under {', '.join(paths)}", file=out)
        return EXIT_PASSED
    for file in files:
        try:
            artifact = load_artifact(file, properties)
            backends = select_backends(artifact, platform, specs, all_backends=all_backends)
            results = [replay(artifact, backend, properties) for backend in backends]
        except (ArtifactError, BackendChoiceError) as error:
            print(f"BAD   {error}", file=out)
            status = EXIT_BAD_ARTIFACT
            continue
        for result, backend in zip(results, backends, strict=True):
            print(
                f"{result.outcome.value}  {artifact.name[:12]}  {artifact.prop} on "
                f"{result.backend_id} (recorded on {artifact.backend_id})",
                file=out,
            )
            if result.outcome is Outcome.SKIPPED:
                print(f"      not applicable: {result.detail}", file=out)
            if result.bits:
                print(f"      output bits: {result.bits}", file=out)
            if result.outcome is Outcome.FAILED:
                lines = [*case_lines(artifact), *result.detail.splitlines()]
                for line in [*lines, *drift_report(artifact, backend)]:
                    print(f"      {line}", file=out)
                if status == EXIT_PASSED:
                    status = EXIT_FAILED
    return status
