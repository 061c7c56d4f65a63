"""The conformance report's processed-logprob section, rendered from one run's results.

Each processed peer (:data:`~tools.conformance.catalog.PROCESSED_PEERS`) has a
subsection of its own, headed ``### `name```: its capability, one row per test of
:data:`PROCESSED_MODULE` (pass, the reason of a skip, or fail with the findings
that list that test, or **UNEXPLAINED** when none does), each failing test's
first failing example with a command that replays it, and each finding with the
outcome of its reproducer. The section ends with the libraries that cannot run
here. A run of some of the peers replaces their subsections and keeps the
others' (:func:`merge`), so that one peer can be regenerated alone.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tools.conformance.catalog import PROCESSED_PEERS, UNAVAILABLE, Finding, ProcessedPeer
from tools.conformance.records import Record, headline
from tools.conformance.releases import served_and_tested
from tp_logprob.peers._releases import UnservedReleaseError

__all__ = [
    "HEADING",
    "PROCESSED_MODULE",
    "PropertyResult",
    "Reproduction",
    "installed",
    "merge",
    "not_runnable",
    "peer_subsection",
    "processed_tests",
    "results_from",
    "section",
    "unexplained",
    "unserved",
]

PROCESSED_MODULE = "tp_logprob.properties.test_processed"
"""The suite's module of processed-logprob properties, run on each processed peer."""

HEADING = "## Processed logprobs"

_UNAVAILABLE_HEADING = "### Libraries whose sampler code cannot be installed or imported here"
_SUBSECTION = re.compile(r"^### .*$", re.MULTILINE)
_PEER_HEADING = re.compile(r"^### `([\w.-]+)`$")
_LABELLED = re.compile(r"^  (contract|worst|observed|expected|support|boundary)\s+(.+)$")


def processed_tests() -> list[str]:
    """The test names of :data:`PROCESSED_MODULE`, in the module's order."""
    module = importlib.import_module(PROCESSED_MODULE)
    tests = [getattr(module, name) for name in vars(module) if name.startswith("test_")]
    tests.sort(key=lambda test: inspect.unwrap(test).__code__.co_firstlineno)
    return [test.__name__ for test in tests]


@dataclass(frozen=True)
class PropertyResult:
    """One processed test on one peer: ``passed``, ``failed``, ``skipped``, ``not claimed``
    (deselected: the peer's capability lacks what it needs) or ``not run``.

    ``summary`` is a failure's headline or a skip's reason; ``lines`` are the first
    failing example's labelled lines (``contract``, ``observed``, ``expected``, ...);
    ``artifact`` the file that replays that example.
    """

    test: str
    outcome: str
    summary: str = ""
    lines: tuple[str, ...] = ()
    artifact: str | None = None


def results_from(
    records: Sequence[Record], backend: str, tests: Sequence[str]
) -> list[PropertyResult]:
    """One result per test of ``tests``, in that order, from ``backend``'s records."""
    found = {record.test: record for record in records if record.backend == backend}
    results = []
    for test in tests:
        record = found.get(test)
        if record is None:
            results.append(PropertyResult(test, "not run"))
        elif record.outcome == "failed":
            lines = []
            for line in record.text.splitlines():
                match = _LABELLED.match(line)
                if match is not None:
                    lines.append(f"{match.group(1)}: {match.group(2).strip()}")
            summary = headline(record.text)
            results.append(PropertyResult(test, "failed", summary, tuple(lines), record.artifact))
        else:
            results.append(PropertyResult(test, record.outcome, record.text.strip()))
    return results


@dataclass
class Reproduction:
    """A finding's reproducer run: ``differs`` (exit 1), ``agrees`` (exit 0), or an error."""

    finding: Finding
    outcome: str
    output: str = ""

    @property
    def failed(self) -> bool:
        """Whether the reproducer could not say (it crashed, or its library is missing)."""
        return self.outcome not in ("differs", "agrees")


def unexplained(peer: ProcessedPeer, results: Sequence[PropertyResult]) -> list[str]:
    """The tests that failed (or left no record) with no finding of ``peer`` listing them."""
    return [
        result.test
        for result in results
        if result.outcome in ("failed", "not run")
        and (result.outcome == "not run" or not peer.findings_for(result.test))
    ]


def installed(distribution: str) -> str:
    """The installed version of ``distribution``, or ``not installed``."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def not_runnable(peer: ProcessedPeer) -> str | None:
    """Why ``peer`` cannot run on what is installed (its library absent, or a release its
    adapter does not serve), or None."""
    if installed(peer.distribution) == "not installed":
        return f"{peer.distribution} is not installed"
    return unserved(peer)


def unserved(peer: ProcessedPeer) -> str | None:
    """Why ``peer``'s adapter refuses the installed release of its library, or None (also
    when the library is absent). Two adapters of one library serve different releases, so
    one environment runs one of them."""
    version = installed(peer.distribution)
    if version == "not installed":
        return None
    served = importlib.import_module(f"tp_logprob.peers.{peer.module}").SERVED
    try:
        served.check(version)
    except UnservedReleaseError:
        return f"{peer.distribution} {version} is installed; the adapter serves {served}"
    return None


def _capability_summary(peer: ProcessedPeer) -> tuple[str, str]:
    module = importlib.import_module(f"tp_logprob.peers.{peer.module}")
    capability = getattr(module, peer.attr)[1].to_dict()
    tp = capability["tp_world_sizes"]
    serves = [
        f"TP {', '.join(map(str, tp))}" if tp else "any TP",
        "/".join(capability["dtypes"]),
        "/".join(capability["roles"]),
        "mask " + "/".join(capability["mask_modes"]),
        "temperature" if capability["supports_temperature"] else "no temperature",
        "entropy" if capability["exports_entropy"] else "no entropy",
        "/".join(capability["determinism_scopes"]),
    ]
    return ", ".join(capability["support_modes"]), ", ".join(serves)


def _anchor(peer: ProcessedPeer, finding: Finding) -> str:
    return f"{peer.name}-finding-{peer.findings.index(finding) + 1}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _cause(peer: ProcessedPeer, result: PropertyResult) -> str:
    if result.outcome == "not run":
        return f"**UNEXPLAINED**: {result.summary or 'no record of this test'}"
    if result.outcome != "failed":
        return ""
    findings = peer.findings_for(result.test)
    if not findings:
        return "**UNEXPLAINED**: no finding lists this test (tools/conformance/catalog.py)"
    links = ", ".join(f"[{finding.rule}](#{_anchor(peer, finding)})" for finding in findings)
    return links if len(findings) == 1 else f"one of {links} (the example tells which)"


def _result(result: PropertyResult) -> str:
    if result.outcome == "passed":
        return "**pass**"
    if result.outcome == "failed":
        return "**fail**"
    if result.outcome == "skipped":
        return _cell(f"skipped: {result.summary}")
    if result.outcome == "not claimed":
        return _cell(f"not claimed: {result.summary}")
    return "**not run**"


def peer_subsection(
    peer: ProcessedPeer,
    results: Sequence[PropertyResult],
    reproductions: Sequence[Reproduction],
    command: str,
    seconds: float,
) -> str:
    """``peer``'s subsection: capability, results, first failing examples, findings."""
    modes, serves = _capability_summary(peer)
    counts = {outcome: 0 for outcome in ("passed", "failed", "skipped", "not claimed", "not run")}
    for result in results:
        counts[result.outcome] += 1
    tally = ", ".join(f"{count} {outcome}" for outcome, count in counts.items() if count)
    lines = [
        f"### `{peer.name}`",
        "",
        f"{peer.library}; {peer.distribution} {installed(peer.distribution)}, "
        f"`tp_logprob.peers.{peer.module}`. Support modes: {modes}; serves {serves}. "
        f"Releases served; tests run on: {served_and_tested(peer.module)}.",
        "",
        f"`{command}`: {tally or 'no tests'} in {seconds:.0f} s.",
        "",
        "| property | result | explained by |",
        "| --- | --- | --- |",
        *(
            f"| `{result.test}` | {_result(result)} | {_cause(peer, result)} |"
            for result in results
        ),
    ]
    failing = [result for result in results if result.outcome == "failed"]
    if failing:
        lines += ["", "First failing example of each failing property:", ""]
    for result in failing:
        lines.append(f"- `{result.test}`: {result.summary}")
        lines += [f"  - {line}" for line in result.lines]
        if result.artifact is not None:
            replay = f"python -m tp_logprob replay {result.artifact} --backend {peer.spec()}"
            lines.append(f"  - replay: `{replay}`")
    lines += ["", "Findings (the outcome is this run's reproducer's):", ""]
    for run in reproductions:
        finding, explanation = run.finding, run.finding.explanation
        script = explanation.reproducer or ""
        link = f"[`{script}`]({script.removeprefix('docs/')})"
        fails = ", ".join(f"`{test}`" for test in finding.properties) or "no property test"
        lines.append(
            f'- <a id="{_anchor(peer, finding)}"></a>**{finding.rule}** ({explanation.kind}; '
            f"{link}: {run.outcome}; fails {fails}): {explanation.cause}"
        )
    if peer.agrees:
        lines.append(f"- Agrees with the exact rules: {peer.agrees}.")
    return "\n".join(lines)


def merge(existing: str, fresh: Mapping[str, str]) -> list[str]:
    """The peers' subsections in catalog order: ``fresh``'s, else those of ``existing`` (a
    previous report's processed section), else none."""
    kept: dict[str, str] = {}
    starts = [match.start() for match in _SUBSECTION.finditer(existing)] + [len(existing)]
    for start, end in itertools.pairwise(starts):
        text = existing[start:end].strip()
        match = _PEER_HEADING.match(text.splitlines()[0])
        if match is not None:
            kept[match.group(1)] = text
    chosen = (fresh.get(peer.name) or kept.get(peer.name) for peer in PROCESSED_PEERS)
    return [text for text in chosen if text]


def section(subsections: Sequence[str]) -> str:
    """The whole processed section around the peers' ``subsections``."""
    unavailable = []
    for library in UNAVAILABLE:
        entry = f"- **{library.library}** (`{library.distribution}`): {library.reason}."
        if library.source:
            entry += f" From its source (read, not run): {library.source}."
        unavailable.append(entry)
    return "\n".join(
        [
            HEADING,
            "",
            "The samplers of rollout engines and trainers, wrapped as backends that serve a "
            'sampling support (docs/semantics.md, "Processed logprobs"). Each one runs the '
            f"processed properties (`{PROCESSED_MODULE}`); a failing property is explained by "
            "the findings that list it; one that no finding lists is marked unexplained and "
            "fails the run. Hypothesis reports one "
            "failing example per property, shown with a command that replays it. Each finding "
            "is a way the library's support or processed logprob differs from the exact rules; "
            "its reproducer calls the installed library on a tiny row, prints its result beside "
            "the exact one (computed with mpmath or fractions) and exits 1 while they differ: "
            "`differs`, `agrees` (the finding is stale), or an error.",
            "",
            "\n\n".join(subsections) if subsections else "None.",
            "",
            _UNAVAILABLE_HEADING,
            "",
            *unavailable,
            "",
        ]
    )
