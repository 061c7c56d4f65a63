"""The historical benchmark: the property suite against the released versions that shipped bugs.

``nox -s history`` makes one virtualenv per release of :func:`releases` and runs
``python -m tools.history run --release DIST==VERSION`` in it: the
user's command, ``pytest --pyargs tp_logprob.properties --tp-logprob-profile=ci
-n 0`` on each adapter, twice (a fresh example database, then the one the first
run wrote), each from a scratch working directory of its own, then every
reproducer of an entry that involves the release. Each release's results are one
JSON file under ``docs/history/results/``, kept in the repository, so that the report
is regenerated from every release while one is rerun. ``report`` reads them all and
writes ``docs/history.md``: per entry
the verdict, the property that found the bug, the seconds until it failed, the
shrunk example, and the reproducer's exit status on each release.

Verdicts: **found** (a property fails on the buggy release and passes on the
fixed one; for an open bug, a property fails on the current release and the
reproducer exits 1 there), **not found** (a gap in the suite), **not runnable
here** (with the reason). ``report`` exits 1 when an entry is not found, when the
fresh and the kept database disagree, or when a reproducer does not flip.

A smoke run of one entry (its buggy and fixed release, then the report judging
that entry alone)::

    nox -s "history(release='liger-kernel==0.5.8')" "history(release='liger-kernel==0.5.9')" \
        -- report --entry liger_ce_none_grad_output
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from tools.conformance.collect import recording_env
from tools.conformance.records import headline
from tools.history.corpus import CORPUS, HistoricalBug, releases

__all__ = ["main", "verdict"]

DATABASES = ("fresh", "kept")


def _suite(adapter: str, scratch: Path, database: Path, name: str) -> dict[str, Any]:
    """One ordinary ``ci`` run on ``adapter``: each property's outcome, headline, time, example."""
    record = scratch / f"{name}.jsonl"
    artifacts = scratch / f"{name}-artifacts"
    command = [
        sys.executable, "-m", "pytest", "--pyargs", "tp_logprob.properties",
        "-p", "no:cacheprovider", "-p", "tools.conformance.collect", "-q", "--no-header",
        "--tp-logprob-profile=ci", "-n", "0", f"--tp-logprob-backend={adapter}",
        f"--tp-logprob-artifacts={artifacts}",
    ]  # fmt: skip
    env = recording_env(record, TP_LOGPROB_HYPOTHESIS_DB=str(database))
    env.setdefault("TRITON_INTERPRET", "1")
    workdir = scratch / f"{name}-cwd"
    workdir.mkdir()
    print(f"history: {name}: {' '.join(command[2:])}", flush=True)
    started = time.monotonic()
    finished = subprocess.run(
        command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    elapsed = time.monotonic() - started
    if finished.returncode not in (0, 1):
        tail = "\n".join(finished.stdout.splitlines()[-30:])
        raise SystemExit(f"history: pytest for {name} exited {finished.returncode}:\n{tail}")
    properties: dict[str, dict[str, Any]] = {}
    clock = 0.0
    for line in record.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        test = entry["nodeid"].split("::")[-1].split("[")[0]
        clock += float(entry.get("duration", 0.0))
        if properties.get(test, {}).get("outcome") == "failed":
            continue  # a test's first failure is its verdict
        properties[test] = {
            "outcome": entry["outcome"],
            "headline": headline(entry["text"]) if entry["outcome"] == "failed" else "",
            "seconds": round(clock, 1),
            "example": _example(entry["text"]) if entry["outcome"] == "failed" else None,
        }
    print(f"history: {name}: {elapsed:.0f} s", flush=True)
    return {"seconds": round(elapsed, 1), "properties": properties}


def _example(text: str) -> str | None:
    """The shrunk failing example in one line, from the artifact the plugin wrote."""
    from tools.conformance.records import Record
    from tp_logprob.replay.artifacts import ArtifactError, load_artifact
    from tp_logprob.replay.catalogue import suite_properties

    artifact = Record("", "", "failed", text).artifact
    if artifact is None:
        return None
    try:
        return str(load_artifact(artifact, suite_properties()).case.describe())
    except ArtifactError:
        return None


def _reproduce(path: str, root: Path) -> int:
    """The reproducer's exit status here (1 while the bug is there)."""
    env = {**os.environ}
    env.setdefault("TRITON_INTERPRET", "1")
    finished = subprocess.run(
        [sys.executable, str(root / path)], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    print(f"history: {path}: exit {finished.returncode}", flush=True)
    return finished.returncode


def run(release: str, out: Path, root: Path) -> Path:
    """Run every entry that involves ``release`` (installed here); write its JSON file."""
    distribution, _, version = release.partition("==")
    installed = metadata.version(distribution)
    if installed != version:
        raise SystemExit(f"history: release={release!r} but {distribution} {installed} is here")
    entries = [
        bug for bug in CORPUS
        if bug.distribution == distribution and version in bug.versions and not bug.unavailable
    ]  # fmt: skip
    adapters = sorted({bug.adapter for bug in entries})
    results: dict[str, Any] = {"release": release, "adapters": {}, "reproducers": {}}
    with tempfile.TemporaryDirectory(prefix="tp-logprob-history-") as tmp:
        scratch = Path(tmp)
        for adapter in adapters:
            database = scratch / f"db-{len(results['adapters'])}"  # fresh, then kept
            results["adapters"][adapter] = {
                kind: _suite(adapter, scratch, database, f"{kind}-{len(results['adapters'])}")
                for kind in DATABASES
            }
    for bug in entries:
        if bug.reproducer is not None:
            results["reproducers"][bug.reproducer] = _reproduce(bug.reproducer, root)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{distribution}-{version}.json"
    path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


def _failed(results: dict[str, Any], bug: HistoricalBug, version: str, kind: str) -> list[str]:
    """The properties that failed on ``version``, earliest first, with the ``kind`` database."""
    run = results[f"{bug.distribution}=={version}"]["adapters"][bug.adapter][kind]
    timed = [(seen["seconds"], test) for test, seen in run["properties"].items()]
    return [test for _, test in sorted(timed) if run["properties"][test]["outcome"] == "failed"]


def verdict(bug: HistoricalBug, results: dict[str, Any]) -> dict[str, Any]:
    """The entry's verdict from the releases' results (see the module docstring)."""
    if bug.unavailable is not None:
        return {"verdict": "not runnable here", "reason": bug.unavailable}
    missing = [v for v in bug.versions if f"{bug.distribution}=={v}" not in results]
    if missing:
        releases = ", ".join(f"{bug.distribution}=={v}" for v in missing)
        return {"verdict": "not run", "reason": f"no results for {releases} (nox -s history)"}
    found: dict[str, list[str]] = {}
    for kind in DATABASES:
        failing = _failed(results, bug, bug.buggy, kind)
        if bug.fixed is not None:
            still = set(_failed(results, bug, bug.fixed, kind))
            failing = [test for test in failing if test not in still]
        found[kind] = failing
    codes = {
        v: results[f"{bug.distribution}=={v}"]["reproducers"].get(bug.reproducer)
        for v in bug.versions
    }
    flips = codes[bug.buggy] == 1 and (bug.fixed is None or codes[bug.fixed] == 0)
    first = found["fresh"][0] if found["fresh"] else None
    name = "found" if first else "not found"
    if first and bug.fixed is None:
        name = "found, not yet fixed" if flips else "not found"
    buggy_run = results[f"{bug.distribution}=={bug.buggy}"]["adapters"][bug.adapter]["fresh"]
    return {
        "verdict": name,
        "property": first,
        "also": found["fresh"][1:],
        "detail": buggy_run["properties"][first] if first else None,
        "same_with_kept_database": found["fresh"] == found["kept"],
        "reproducer": codes,
        "reproducer_flips": flips,
    }


def _markdown(results: dict[str, Any], judged: dict[str, dict[str, Any]]) -> str:
    lines = [
        "# Historical bugs: the suite against the releases that shipped them",
        "",
        "Generated by `nox -s history` (`python -m tools.history`); do not edit by "
        "hand. Each release is installed in a virtualenv of its own, and the suite runs the "
        "way a user runs it: `pytest --pyargs tp_logprob.properties --tp-logprob-profile=ci "
        "-n 0 --tp-logprob-backend=ADAPTER`, the default `ci` profile and seed, no property "
        "chosen for the bug, from a scratch working directory, once with a fresh example "
        "database and once with the one that run kept. **found**: a property fails on the "
        "buggy release and passes on the fixed one (for an open bug: a property fails on the "
        "current release, and the reproducer, exit 1, shows it is this bug); **not found**: a "
        "gap in the suite; **not runnable here**: the reason is given. The time is the "
        "suite's test time until that property's verdict, its shrinking included. The fresh "
        "and the kept run must agree: the `ci` profile writes the example database but never "
        "replays it, so what a `ci` run draws is its seed's alone (before, replayed examples "
        "from earlier runs in the same working directory used up examples and moved the "
        "draws; see `tp_logprob.suite.profiles`).",
        "",
        "| entry | library | bug | issue / PR | buggy | fixed | CPU | verdict | found by "
        "(seconds) | fresh = kept database | reproducer exit (buggy / fixed) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for bug in CORPUS:
        seen = judged[bug.key]
        detail = seen.get("detail")
        by = f"`{seen['property']}` ({detail['seconds']})" if detail else "-"
        same = {True: "yes", False: "**no**", None: "-"}[seen.get("same_with_kept_database")]
        codes = seen.get("reproducer") or {}
        exits = " / ".join(str(codes.get(v, "-")) for v in bug.versions) if codes else "-"
        name = seen["verdict"]
        if name in ("not runnable here", "not run"):
            name = f"{name}: {seen['reason']}"
        lines.append(
            f"| `{bug.key}` | {bug.library} | {bug.summary} | {bug.reference} | {bug.buggy} | "
            f"{bug.fixed or 'open'} | {bug.cpu} | {name} | {by} | {same} | {exits} |"
        )
    lines += ["", "## Found", ""]
    for bug in CORPUS:
        seen = judged[bug.key]
        if not seen.get("detail"):
            continue
        detail = seen["detail"]
        lines += [
            f"### `{bug.key}`",
            "",
            f"- property: `{seen['property']}`: {detail['headline']}",
            "- also failing on the buggy release only: "
            + (", ".join(f"`{test}`" for test in seen["also"]) or "none"),
            f"- shrunk example ({bug.distribution} {bug.buggy}): {detail['example'] or 'not kept'}",
            f"- reproducer: [`{bug.reproducer}`]({_from_docs(bug.reproducer)}) exits "
            + ", ".join(f"{code} on {v}" for v, code in seen["reproducer"].items()),
        ]
        if bug.fixed is not None:
            lines.append(f"- on {bug.fixed}, `{seen['property']}` passes")
        lines.append("")
    lines += ["## Each release", ""]
    for release, result in sorted(results.items()):
        for adapter, runs in result["adapters"].items():
            failed = {
                kind: [t for t, s in run["properties"].items() if s["outcome"] == "failed"]
                for kind, run in runs.items()
            }
            lines.append(
                f"- {release}, `{adapter}`: fails "
                + (", ".join(f"`{t}`" for t in failed["fresh"]) or "nothing")
                + f" ({runs['fresh']['seconds']} s fresh, {runs['kept']['seconds']} s kept"
                + ("" if failed["fresh"] == failed["kept"] else "; **the kept run differs**")
                + ")"
            )
    return "\n".join(lines) + "\n"


def _from_docs(path: str | None) -> str:
    """``path`` (from the repository root) as a link from ``docs/history.md``."""
    return str(Path(path or "").relative_to("docs"))


def report(paths: Sequence[Path], markdown: Path, entries: Sequence[str] = ()) -> int:
    """Judge every entry from the releases' JSON files; write ``markdown``; the exit status
    (of ``entries`` alone when given: a smoke run of some releases)."""
    results = {}
    for path in paths:
        result = json.loads(path.read_text(encoding="utf-8"))
        results[result["release"]] = result
    judged = {bug.key: verdict(bug, results) for bug in CORPUS}
    markdown.write_text(_markdown(results, judged), encoding="utf-8")
    bad = [
        key for key, seen in judged.items()
        if (not entries or key in entries)
        and (seen["verdict"] in ("not found", "not run")
        or seen.get("same_with_kept_database") is False
        or seen.get("reproducer_flips") is False)
    ]  # fmt: skip
    for key in bad:
        print(f"history: {key}: {judged[key]['verdict']}", flush=True)
    return 1 if bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``run --release DIST==VERSION`` (in that release's env) or ``report``."""
    parser = argparse.ArgumentParser(prog="python -m tools.history")
    parser.add_argument("--out", type=Path, default=Path("docs/history/results"))
    parser.add_argument("--root", type=Path, default=Path.cwd())
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="run the entries of one installed release")
    run_parser.add_argument("--release", required=True, choices=releases())
    report_parser = commands.add_parser("report", help="judge the entries, write the report")
    report_parser.add_argument("--markdown", type=Path, default=Path("docs/history.md"))
    report_parser.add_argument(
        "--entry", action="append", default=[], choices=[bug.key for bug in CORPUS],
        help="judge only this entry for the exit status (repeatable)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.command == "run":
        print(f"history: wrote {run(args.release, args.out, args.root)}", flush=True)
        return 0
    paths = sorted(args.out.glob("*.json"))
    return report(paths, args.markdown, args.entry)
