"""The platform corpus: its bits are written per backend and compared across platforms on CPU.

``benchmarks/gpu_check.sh`` writes a GPU's bits (``tools.platform_bits write``); once such a
file is committed under ``benchmarks/platform_corpus/bits/``, CPU CI reruns its backend here
and must give the same bits where the backend claims ``cross_platform_bitwise`` on both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import tp_logprob as tpl
from tests.helpers.portable import portable_backend
from tp_logprob.contract import DeterminismScope

platform_bits = pytest.importorskip("tools.platform_bits")

COMMITTED = sorted(platform_bits.COMMITTED.glob("*.json"))
GPU_FILES = [path for path in COMMITTED if json.loads(path.read_text())["platform"] != "cpu"]


def test_corpus_cases_build_and_name_no_backend() -> None:
    cases = platform_bits.corpus_cases()
    assert len(cases) >= 5
    for entry in cases.values():
        assert not {"backend", "scope", "platform"} & set(entry)
        case = platform_bits.build_case(entry, DeterminismScope.CROSS_TP_BITWISE)
        assert case.contract.reduction.determinism_scope is DeterminismScope.CROSS_TP_BITWISE
    worlds = {len(entry["shard_bounds"]) for entry in cases.values()}
    dtypes = {entry["dtype"] for entry in cases.values()}
    assert worlds >= {1, 2, 3} and dtypes == {"fp32", "bf16", "fp16"}


def test_committed_bits_files_ran_this_corpus() -> None:
    assert COMMITTED, "benchmarks/platform_corpus/bits/ holds no bits file"
    for path in COMMITTED:
        document = json.loads(path.read_text())
        assert path.name == f"{document['platform']}-{document['backend']}.json"
        assert document["corpus_sha256"] == platform_bits.corpus_sha256(), path.name
        assert set(document["cases"]) == set(platform_bits.corpus_cases()), path.name


def test_default_backends_come_from_the_capabilities() -> None:
    chosen = platform_bits.default_backends("cpu")
    claims = {c.backend_id: c.determinism_scopes for c in tpl.registry.backends("cpu")}
    portable = [b for b, scopes in claims.items() if "cross_platform_bitwise" in scopes]
    assert chosen == portable or (not portable and "triton_exact_sum" in chosen)


def _flip_first(document: dict[str, Any], case_id: str) -> None:
    entry = document["cases"][case_id]["lse"]
    entry["hex"] = f"{int(entry['hex'][:8], 16) ^ 1:08x}" + entry["hex"][8:]


def test_a_difference_fails_only_where_bits_are_promised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    portable = portable_backend(frozenset({"cpu", "cuda"}))
    document = platform_bits.bits_document(portable)
    assert document["scope"] == "cross_platform_bitwise"
    document["platform"] = "cuda"  # as if written on a GPU
    _flip_first(document, "fp32-tp1")
    path = tmp_path / "cuda-claims_platform_bits.json"
    path.write_text(json.dumps(document))
    monkeypatch.setattr(platform_bits, "resolve_backends", lambda names, platform: [portable])
    result = platform_bits.compare_file(path, "cpu")
    assert result.promised and result.differing == ("fp32-tp1",)
    assert platform_bits.main(["compare", "--platform", "cpu", str(path)]) == 1
    unpromised = portable_backend(frozenset({"cpu", "rocm"}))
    monkeypatch.setattr(platform_bits, "resolve_backends", lambda names, platform: [unpromised])
    result = platform_bits.compare_file(path, "cpu")
    assert not result.promised and result.differing == ("fp32-tp1",)
    assert platform_bits.main(["compare", "--platform", "cpu", str(path)]) == 0


def test_another_corpus_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cpu-torch_native.json"
    document = json.loads((platform_bits.COMMITTED / path.name).read_text())
    document["corpus_sha256"] = "0" * 64
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError, match=r"it recorded another corpus"):
        platform_bits.compare_file(path, "cpu")


def _check_against_this_cpu(path: Path) -> None:
    document = json.loads(path.read_text())
    if document["backend"] not in {c.backend_id for c in tpl.registry.backends("cpu")}:
        pytest.skip(f"{document['backend']} is not registered on cpu")
    result = platform_bits.compare_file(path, "cpu")
    if not result.promised:
        pytest.skip(
            f"{result.backend} does not claim cross_platform_bitwise on cpu and "
            f"{result.recorded_on}; bits differ in {len(result.differing)} case(s) (information)"
        )
    assert not result.differing, "\n".join(result.lines)


@pytest.mark.parametrize(
    "path", GPU_FILES or [None], ids=lambda path: getattr(path, "name", "none")
)
def test_cpu_gives_the_committed_gpu_bits(path: Path | None) -> None:
    if path is None:
        pytest.skip(
            "no GPU bits committed yet: benchmarks/gpu_check.sh on a GPU writes "
            "platform-bits/<platform>-<backend>.json; commit it to benchmarks/platform_corpus/bits/"
        )
    _check_against_this_cpu(path)


CPU_FILES = [path for path in COMMITTED if path not in GPU_FILES]


@pytest.mark.parametrize("path", CPU_FILES, ids=lambda path: path.name)
def test_this_cpu_gives_the_committed_cpu_bits(path: Path) -> None:
    _check_against_this_cpu(path)


def test_the_portable_twins_committed_the_same_bits() -> None:
    names = ("torch_portable", "triton_portable")
    twins = [platform_bits.COMMITTED / f"cpu-{name}.json" for name in names]
    torch_side, triton_side = (json.loads(path.read_text())["cases"] for path in twins)
    assert torch_side == triton_side
