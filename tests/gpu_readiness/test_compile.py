"""Every Triton kernel compiles for every GPU target within the resource gates, on a CPU.

The compile matrix runs once, in a subprocess without ``TRITON_INTERPRET`` (the
interpreter's ``@triton.jit`` objects cannot be compiled): ``python -m
tools.gpu_readiness --matrix ci``. ``nox -s compile`` runs the full
matrix and writes docs/gpu-readiness.md. The fast tests below check the pieces
(recorder, asm reading, traffic) in process.
"""

from __future__ import annotations

import itertools
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import tp_logprob as tpl
from tests.helpers.triton_cases import BACKENDS  # the interpreter on CPU, or a clean skip
from tp_logprob.contract import LogprobInputKind

ROOT = Path(__file__).resolve().parents[2]

recorder = pytest.importorskip("tools.gpu_readiness.recorder")
resources = pytest.importorskip("tools.gpu_readiness.resources")
traffic = pytest.importorskip("tools.gpu_readiness.traffic")
aot = pytest.importorskip("tools.gpu_readiness.aot")
launch = pytest.importorskip("tp_logprob.kernels.triton.launch")

_GATES = (
    "compile",
    "spills",
    "vectorized loads",
    "fp64 in loop",
    "approximate fp32 division",
    "IEEE fp32 division",
    "cross-platform bits",
)


@pytest.fixture(scope="module")
def ci_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("aot") / "ci.json"
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    command = [sys.executable, "-m", "tools.gpu_readiness", "--matrix", "ci"]
    proc = subprocess.run(
        [*command, "--jobs", "2", "--json", str(out)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if not out.exists():
        pytest.fail(f"the compile matrix wrote no report (exit {proc.returncode}):\n{proc.stderr}")
    report: dict[str, Any] = json.loads(out.read_text())
    return report


@pytest.mark.slow
def test_ci_matrix_passes_every_gate(ci_report: dict[str, Any]) -> None:
    rows = ci_report["rows"]
    compiled = {(row["kernel"], row["target"]) for row in rows}
    kernels = {kernel for kernel, _ in compiled}
    assert kernels >= _jit_kernels(), "a @triton.jit kernel was never launched by a backend"
    missing = {(k, t) for k in kernels for t in aot.TARGETS} - compiled
    assert not missing, f"kernel x target pairs not compiled: {sorted(missing)}"
    layouts = {row["layout"] for row in rows if row["kernel"] == "online_partial_kernel"}
    assert {"aligned", "unaligned"} <= layouts
    by_gate = {
        gate: [line for line in ci_report["failures"] if line.startswith(gate + ":")]
        for gate in _GATES
    }
    assert sum(map(len, by_gate.values())) == len(ci_report["failures"])
    report = "\n".join(
        f"{gate}:\n  " + "\n  ".join(lines) for gate, lines in by_gate.items() if lines
    )
    assert not ci_report["failures"], f"GPU readiness gates failed:\n{report}"


def _jit_kernels() -> set[str]:
    """Every ``*_kernel`` @triton.jit function defined in the Triton package."""
    import importlib

    package = importlib.import_module("tp_logprob.kernels.triton")
    found = set()
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if name.endswith("_kernel") and hasattr(value, "fn"):
                found.add(name)
    return found


def test_recorder_takes_configs_from_the_gpu_launch_table() -> None:
    launches = recorder.record(["cuda"], ["aligned"], (torch.int64,), recorder.Coverage.SINGLES)
    row = launch.launch_config("cuda", launch.KernelKind.ROW, torch.bfloat16)
    partial = [x for x in launches if x.name == "online_partial_kernel" and x.dtype == "bf16"]
    assert partial
    assert {dict(x.constexprs)["BLOCK"] for x in partial} == {row.block}
    assert {x.num_warps for x in partial} == {row.num_warps}
    assert all(x.reads_logits for x in partial)
    assert not any(x.reads_logits for x in launches if "merge" in x.name)
    readers = set(BACKENDS) | {"triton_portable"}  # its kernels: tests/kernels/test_portable_sum
    assert {x.backend for x in launches if x.reads_logits} == readers
    assert "logprob_grad_kernel" in {x.name for x in launches}  # the train role's backward


def test_recorder_launches_every_kernel() -> None:
    launches = recorder.record(["cuda"], ["aligned"], (torch.int64,), recorder.Coverage.SINGLES)
    missing = _jit_kernels() - {x.name for x in launches}
    assert not missing, f"@triton.jit kernels no recorded backend launches: {sorted(missing)}"


def test_recorder_records_hidden_input_backends_on_fused_contracts() -> None:
    launches = recorder.record(["cuda"], ["aligned"], (torch.int64,), recorder.Coverage.SINGLES)
    hidden = {
        capability.backend_id
        for capability in tpl.registry.backends("cuda")
        if LogprobInputKind.HIDDEN in capability.input_kinds
        and capability.backend_id.startswith("triton_")
    }
    assert "triton_fused" in hidden
    assert {x.backend for x in launches if x.forms_logits} == hidden
    fused = [x for x in launches if x.backend == "triton_fused"]
    assert not any(x.reads_logits for x in fused)
    partial = [x for x in fused if x.name == "fused_partial_kernel"]
    assert partial and all(x.forms_logits for x in partial)
    config = launch.launch_config("cuda", launch.KernelKind.FUSED, torch.bfloat16)
    block_m, block_k = launch.FUSED_TILES["cuda"]
    tiles = {
        (c["BLOCK"], c["BLOCK_M"], c["BLOCK_K"], x.num_warps)
        for x in partial
        for c in [dict(x.constexprs)]
    }
    assert tiles == {(config.block, block_m, block_k, config.num_warps)}
    assert {x.dtype for x in partial} == {"bf16", "fp16", "fp32"}
    for flag in ("HAS_BIAS", "ENTROPY", "SCALE"):
        assert {dict(x.constexprs)[flag] for x in partial} == {False, True}, flag
    train = {x.name for x in fused if "role=train" in x.contract}
    assert {"fused_partial_kernel", "fused_logits_kernel", "logprob_grad_kernel"} <= train
    infer = [x for x in fused if "role=train" not in x.contract]
    # The infer forward forms logits tiles apart only to find a recomputed support's thresholds.
    recomputed = "support=sampling_params"
    assert "fused_logits_kernel" not in {x.name for x in infer if recomputed not in x.contract}
    assert "fused_logits_kernel" in {x.name for x in infer if recomputed in x.contract}


def test_recorder_specializations_follow_the_layout() -> None:
    aligned = recorder.record(["rocm"], ["aligned"], (torch.int64,), recorder.Coverage.SINGLES)
    unaligned = recorder.record(["rocm"], ["unaligned"], (torch.int64,), recorder.Coverage.SINGLES)
    wide = recorder.record(["rocm"], ["aligned-2gib"], (torch.int64,), recorder.Coverage.SINGLES)

    def operand_args(launches: list[Any], operand: str) -> set[Any]:
        return {a for x in launches for a in x.args if getattr(a, "operand", None) == operand}

    for operand in ("logits", "hidden", "weight"):
        assert {a.data_ptr_mod_16 for a in operand_args(aligned, operand)} == {0}, operand
        assert {a.data_ptr_mod_16 for a in operand_args(unaligned, operand)} != {0}, operand
        assert max(a.nbytes for a in operand_args(aligned, operand)) < 2**31, operand
    for operand in ("logits", "weight"):  # the buffers past 2 GiB at N=8192, V=152064, H=8192
        assert min(a.nbytes for a in operand_args(wide, operand)) > 2**31, operand
    assert max(a.nbytes for a in operand_args(wide, "hidden")) < 2**31


@pytest.mark.parametrize("kind", list(LogprobInputKind), ids=lambda kind: kind.value)
def test_contract_variants_cover_every_option(kind: LogprobInputKind) -> None:
    base = recorder._base_contract(recorder.LAYOUTS["aligned"], 0, 0, kind)
    choices = recorder._field_choices(base)
    assert {"role", "dtype", "output.dtype", "export_lse"} <= set(choices)
    assert not {"input_kind", "hidden_size"} & set(choices)
    hidden_only = {"has_bias", "allow_tf32"}
    expected = hidden_only if kind is LogprobInputKind.HIDDEN else set()
    assert hidden_only & set(choices) == expected
    targets = (torch.int64, torch.int32)
    for coverage in recorder.Coverage:
        variants = list(recorder.contract_variants(base, coverage, targets))
        for key, values in choices.items():
            seen = {recorder._lookup(variant, key) for variant, _ in variants}
            assert seen == set(values), (coverage, key)
        assert {target for _, target in variants} == set(targets), coverage
    total = 2
    for values in choices.values():
        total *= len(values)
    assert len(list(recorder.contract_variants(base, target_dtypes=targets))) == total


@pytest.mark.parametrize("kind", list(LogprobInputKind), ids=lambda kind: kind.value)
def test_paired_variants_put_every_two_option_values_together(kind: LogprobInputKind) -> None:
    base = recorder._base_contract(recorder.LAYOUTS["aligned"], 0, 0, kind)
    choices = recorder._field_choices(base)
    targets = (torch.int64, torch.int32)
    variants = list(recorder.contract_variants(base, recorder.Coverage.PAIRS, targets))
    options = [key for key in choices if key not in ("role", "dtype")]

    def values(variant: Any, target: torch.dtype) -> dict[str, Any]:
        return {"target": target, **{key: recorder._lookup(variant, key) for key in choices}}

    rows = [values(variant, target) for variant, target in variants]
    every = {"target": targets, **choices}
    for a, b in itertools.combinations(["target", *options], 2):
        for x in every[a]:
            for y in every[b]:
                assert any(row[a] == x and row[b] == y for row in rows), (a, x, b, y)
    for role in choices["role"]:  # role x dtype crossed with each paired row
        for dtype in choices["dtype"]:
            mine = [row for row in rows if row["role"] == role and row["dtype"] == dtype]
            assert len(mine) == len(rows) // 6
    exhaustive = len(list(recorder.contract_variants(base, target_dtypes=targets)))
    assert len(rows) * 10 < exhaustive


_PTX = """\
// %bb.0:
\tld.global.b16 %rs1, [%rd1];
\t@%p1 bra $L__BB0_2;
$L__BB0_1:                              // =>This Inner Loop Header: Depth=1
\t@%p2 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd2 + 0 ];
\tcvt.f64.f32 %fd1, %f1;
\tdiv.full.f32 %f3, %f1, %f2;
\t@%p3 bra $L__BB0_1;
$L__BB0_2:                              // %exit
\tadd.f64 %fd2, %fd1, %fd1;
\tret;
}
"""


def test_ptx_loops_loads_fp64_and_division_are_read() -> None:
    lines = _PTX.splitlines()
    loop = resources.loop_lines(lines, resources._PTX_BLOCK)
    assert loop[0].startswith("$L__BB0_1") and loop[-1].endswith("bra $L__BB0_1;")
    assert resources._ptx_load_bits(loop[1]) == 128
    assert resources._ptx_load_bits(lines[1]) == 16
    assert not any("add.f64" in line for line in loop)
    assert resources.element_lines(lines[:3], resources._PTX_BLOCK) == lines[:3]  # no loop


_NESTED_PTX = """\
// %bb.0:
\tld.global.b16 %rs1, [%rd1];
$L__BB0_3:                              // %._crit_edge
                                        //   in Loop: Header=BB0_1 Depth=1
\tdiv.rn.f32 %r5, %r4, %r3;
\t@%p1 bra $L__BB0_5;
$L__BB0_1:                              // =>This Loop Header: Depth=1
                                        //     Child Loop BB0_2 Depth 2
\tcp.async.ca.shared.global [ %r50 + 0 ], [ %rd34 + 0 ], 0x8, %r51;
$L__BB0_2:                              // %.lr.ph
                                        //   Parent Loop BB0_1 Depth=1
                                        // =>  This Inner Loop Header: Depth=2
\tcp.async.cg.shared.global [ %r52 + 0 ], [ %rd35 + 0 ], 0x10, %r53;
\tfma.rn.f32 %r6, %r7, %r8, %r6;
$L__BB0_5:                              // %exit
\tret;
}
"""


def test_nested_loops_and_async_copies_are_read() -> None:
    """Nested loops annotate blocks on the lines after the label; tl.dot loads by cp.async."""
    lines = _NESTED_PTX.splitlines()
    loop = resources.loop_lines(lines, resources._PTX_BLOCK)
    assert [line for line in loop if line.startswith("$L__BB")] == [
        lines[2],
        lines[6],
        lines[9],
    ]
    assert "\tret;" not in loop and lines[1] not in loop
    assert [resources._ptx_load_bits(line) for line in (lines[8], lines[12])] == [64, 128]


def test_amdgcn_loop_blocks_are_read() -> None:
    text = [
        "; %bb.0:",
        "\tglobal_load_ushort v1, v[0:1], off",
        ".LBB0_1:                                ; =>This Inner Loop Header: Depth=1",
        "\tbuffer_load_dwordx4 v[2:5], v6, s[0:3], 0 offen",
        "\tv_add_f64 v[8:9], v[8:9], v[10:11]",
        "\ts_cbranch_scc1 .LBB0_1",
        ".LBB0_2:",
        "\ts_endpgm",
    ]
    loop = resources.loop_lines(text, resources._GCN_BLOCK)
    assert loop == text[2:6]
    assert resources._GCN_LOAD.match(loop[1]).group(1) == "dwordx4"


def test_traffic_reads_the_logits_once_or_twice() -> None:
    shape = traffic.BENCH_SHAPE
    logits = shape.rows * shape.vocab * shape.itemsize
    online = traffic.predicted_seconds("triton_online", shape, 1.0)
    exact = traffic.predicted_seconds("triton_exact_sum", shape, 1.0)
    assert logits <= online < 1.001 * logits
    assert 2 * logits <= exact < 2.001 * logits
    h200 = traffic.predicted_seconds("triton_online", shape, traffic.PEAK_BANDWIDTH["H200"])
    assert h200 == pytest.approx(logits / 4.8e12, rel=1e-3)


def test_traffic_functions_name_the_launched_kernels() -> None:
    launched = {
        x.name
        for x in recorder.record(["cuda"], ["aligned"], (torch.int64,), recorder.Coverage.SINGLES)
    }
    for stages in traffic.TRAFFIC.values():
        assert {stage.kernel for stage in stages(traffic.BENCH_SHAPE)} <= launched


def test_readiness_doc_is_generated_from_the_full_matrix() -> None:
    doc = Path(__file__).resolve().parents[2] / "docs" / "gpu-readiness.md"
    text = doc.read_text()
    assert "Generated by `nox -s compile`" in text
    assert "--matrix full" in text
    for target in aot.TARGETS:
        assert f"| {target} |" in text


@pytest.mark.parametrize(("cached", "said"), [(0, "a cold Triton cache"), (7, "a warm Triton")])
def test_the_headline_says_where_the_time_went(cached: int, said: str) -> None:
    readiness = pytest.importorskip("tools.gpu_readiness.readiness")
    timing = aot.Timing(recorded_s=75.0, compiled_s=1100.0, compiles=6538, workers=2, cached=cached)
    report = readiness.Report(aot.MATRICES["full"], ("sm_90",), [], [], 1175.0, [], timing)
    line = readiness.headline(report).splitlines()[2]
    assert line.startswith("where the time went: 75 s recording and specializing, 1100 s ")
    assert "6538 distinct compiles on 2 worker(s)" in line and said in line


def test_the_full_matrix_records_every_case_and_both_target_dtypes() -> None:
    full = aot.MATRICES["full"]
    cases = {case for part in full.parts for case in part.cases}
    assert cases == {
        (layout, dtype) for layout in recorder.LAYOUTS for dtype in ("bf16", "fp16", "fp32")
    }
    assert {"EXHAUSTIVE", "PAIRS"} == {part.coverage for part in full.parts}
    assert {"int64", "int32"} <= {name for part in full.parts for name in part.target_dtypes}
