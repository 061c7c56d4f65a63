"""The output bits of a fixed corpus per platform and backend, compared across platforms.

The corpus (``benchmarks/platform_corpus/corpus.json``) is a few logprob cases
written out in full: dtype, shard layout, real vocabulary, temperature, export
flags, the logits as hex of little-endian fp32 and the targets. Nothing in it names
a backend: each backend runs it under its strongest determinism scope. ``write``
records the bits each backend returned on this platform
(``<platform>-<backend>.json``, the per-case outputs in the artifacts' ``output_bits``
form, :mod:`tp_logprob.replay.bits`); ``compare`` reruns a bits file's backend here
and compares bit for bit. A difference fails (exit 1) only where bits are promised:
the backend claims ``cross_platform_bitwise`` on both platforms. Elsewhere it is
printed as information. ``benchmarks/gpu_check.sh`` writes the GPU side; committed
files live in ``benchmarks/platform_corpus/bits/``.

Run: ``python -m tools.platform_bits write --platform cpu [--backend ID ...] --out DIR``;
``python -m tools.platform_bits compare --platform cpu FILE ...``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform as platform_module
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import tp_logprob as tpl
from tp_logprob.contract import DeterminismScope, LogprobContract, LogprobInputKind
from tp_logprob.registry import PLATFORMS
from tp_logprob.replay.bits import compare_bits, decode_bits, encode_bits, observed_bits
from tp_logprob.strategies import LogprobCase
from tp_logprob.suite.backends import BackendUnderTest, resolve_backends

__all__ = [
    "BITS_FORMAT",
    "CORPUS",
    "Comparison",
    "bits_document",
    "compare_file",
    "corpus_cases",
    "corpus_sha256",
    "default_backends",
    "main",
]

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "benchmarks" / "platform_corpus" / "corpus.json"
COMMITTED = ROOT / "benchmarks" / "platform_corpus" / "bits"
CORPUS_FORMAT = "tp-logprob-platform-corpus"
BITS_FORMAT = "tp-logprob-platform-bits"
_SCOPES = sorted(DeterminismScope, key=lambda scope: -list(DeterminismScope).index(scope))


def corpus_sha256(path: Path = CORPUS) -> str:
    """The corpus file's sha256: a bits file names the exact corpus it ran."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def corpus_cases(path: Path = CORPUS) -> dict[str, dict[str, Any]]:
    """The corpus's cases by id, as written (checked: format, unique ids, sizes)."""
    document = json.loads(path.read_text())
    if document.get("format") != CORPUS_FORMAT or document.get("version") != 1:
        raise ValueError(
            f"{path}: format={document.get('format')!r} version={document.get('version')!r}: "
            f"expected {CORPUS_FORMAT!r} version 1"
        )
    cases: dict[str, dict[str, Any]] = {}
    for entry in document["cases"]:
        if entry["id"] in cases:
            raise ValueError(f"{path}: case id={entry['id']!r} appears twice")
        cases[entry["id"]] = entry
    return cases


def build_case(entry: dict[str, Any], scope: DeterminismScope) -> LogprobCase:
    """One corpus entry as a case whose contract asks for ``scope`` (rank 0's view)."""
    bounds = tuple(tuple(pair) for pair in entry["shard_bounds"])
    rows, padded = entry["rows"], bounds[-1][1]
    logits = np.frombuffer(bytes.fromhex(entry["logits_hex"]), dtype="<f4")
    if logits.size != rows * padded:
        raise ValueError(
            f"case {entry['id']!r}: logits_hex holds {logits.size} values, rows x padded "
            f"vocabulary is {rows * padded}"
        )
    contract = LogprobContract(
        role=tpl.LogprobRole.INFER,
        dtype=tpl.LogprobDType(entry["dtype"]),
        mask=tpl.MaskSpec(rows),
        sharding=tpl.ShardingSpec(0, len(bounds), bounds, entry["real_vocab_size"], padded),
        reduction=tpl.ReductionSpec(scope),
        export_lse=entry["export_lse"],
        export_entropy=entry["export_entropy"],
        temperature=entry["temperature"],
    )
    return LogprobCase(contract, logits.reshape(rows, padded), np.array(entry["targets"]))


def strongest_scope(backend: BackendUnderTest) -> DeterminismScope:
    """The strongest determinism scope ``backend`` claims."""
    return next(scope for scope in _SCOPES if scope in backend.capability.determinism_scopes)


def default_backends(platform: str) -> list[str]:
    """The logits backends claiming ``cross_platform_bitwise`` on ``platform``, else (until
    one does) those claiming ``cross_tp_bitwise``."""
    logits = [
        capability
        for capability in tpl.registry.backends(platform)
        if LogprobInputKind.LOGITS in capability.input_kinds
    ]
    for scope in (DeterminismScope.CROSS_PLATFORM_BITWISE, DeterminismScope.CROSS_TP_BITWISE):
        chosen = [c.backend_id for c in logits if scope in c.determinism_scopes]
        if chosen:
            return chosen
    return []


def bits_document(backend: BackendUnderTest, path: Path = CORPUS) -> dict[str, Any]:
    """Every corpus case's output bits on ``backend``, with where and how they were taken."""
    scope = strongest_scope(backend)
    outputs = {}
    for case_id, entry in corpus_cases(path).items():
        encoded = encode_bits(observed_bits(backend, build_case(entry, scope)))
        if encoded is None:
            raise ValueError(f"case {case_id!r}: too many outputs to record")
        outputs[case_id] = encoded
    return {
        "format": BITS_FORMAT,
        "version": 1,
        "corpus_sha256": corpus_sha256(path),
        "backend": backend.backend_id,
        "platform": backend.platform,
        "scope": scope.value,
        "device": _device(backend.platform),
        "packages": _packages(),
        "cases": outputs,
    }


@dataclass(frozen=True)
class Comparison:
    """A bits file against this platform's run: promised or not, and per case how it went."""

    backend: str
    recorded_on: str
    promised: bool
    differing: tuple[str, ...]  # case ids whose bits differ
    lines: tuple[str, ...]


def compare_file(path: Path, platform: str) -> Comparison:
    """Rerun ``path``'s backend on the corpus here and compare with its recorded bits."""
    document = json.loads(path.read_text())
    if document.get("format") != BITS_FORMAT:
        raise ValueError(f"{path}: format={document.get('format')!r}: expected {BITS_FORMAT!r}")
    if document["corpus_sha256"] != corpus_sha256():
        raise ValueError(
            f"{path}: corpus_sha256={document['corpus_sha256'][:16]}... is not the corpus's "
            f"{corpus_sha256()[:16]}...: it recorded another corpus; rewrite it"
        )
    backend = resolve_backends([document["backend"]], platform)[0]
    scope = DeterminismScope(document["scope"])
    recorded_on = document["platform"]
    capability = backend.capability
    promised = (
        DeterminismScope.CROSS_PLATFORM_BITWISE in capability.determinism_scopes
        and scope is DeterminismScope.CROSS_PLATFORM_BITWISE
        and {recorded_on, platform} <= capability.bitwise_platforms
    )
    cases = corpus_cases()
    differing, lines = [], []
    for case_id, recorded in document["cases"].items():
        observed = observed_bits(backend, build_case(cases[case_id], scope))
        comparison = compare_bits(decode_bits(recorded), observed, recorded_on)
        if not comparison.identical:
            differing.append(case_id)
        lines.append(f"{case_id}: {comparison.detail}")
    return Comparison(backend.backend_id, recorded_on, promised, tuple(differing), tuple(lines))


def _device(platform: str) -> str:
    if platform != "cpu":
        import torch

        return str(torch.cuda.get_device_name())
    return f"{platform_module.machine()} {platform_module.processor() or platform_module.system()}"


def _packages() -> dict[str, str | None]:
    from importlib import metadata

    found: dict[str, str | None] = {}
    for package in ("tp-logprob", "torch", "triton", "numpy"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """``write`` the corpus bits, or ``compare`` bits files with this platform's; exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    write = commands.add_parser("write", help="write <platform>-<backend>.json per backend")
    write.add_argument("--platform", required=True, choices=PLATFORMS)
    write.add_argument("--backend", action="append", default=[], help="default: see --help")
    write.add_argument("--out", type=Path, default=COMMITTED)
    compare = commands.add_parser("compare", help="compare bits files with this platform's run")
    compare.add_argument("--platform", required=True, choices=PLATFORMS)
    compare.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if args.command == "write":
        names = args.backend or default_backends(args.platform)
        if not names:
            parser.error(f"no backend claims cross_tp_bitwise or more on {args.platform}")
        args.out.mkdir(parents=True, exist_ok=True)
        for backend in resolve_backends(names, args.platform):
            path = args.out / f"{args.platform}-{backend.backend_id}.json"
            path.write_text(json.dumps(bits_document(backend), indent=1, sort_keys=True) + "\n")
            print(f"wrote {path}")
        return 0
    status = 0
    for path in args.files:
        result = compare_file(path, args.platform)
        verdict = "bits promised" if result.promised else "information only"
        print(
            f"{path.name}: {result.backend} on {args.platform} vs {result.recorded_on} ({verdict})"
        )
        for line in result.lines:
            print(f"    {line}")
        if result.promised and result.differing:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
