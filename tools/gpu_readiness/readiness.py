"""The GPU-readiness report: gates, per-kernel resources and the roofline, as JSON and markdown.

Built from :func:`tools.gpu_readiness.aot.compile_matrix`'s rows;
``nox -s compile`` writes the markdown to ``docs/gpu-readiness.md``.
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.gpu_readiness import bitwise, traffic
from tools.gpu_readiness.recorder import LAYOUTS

__all__ = [
    "Report",
    "bitwise_rules_markdown",
    "headline",
    "summary",
    "write_json",
    "write_markdown",
]

_MAX_LISTED_FAILURES = 40


@dataclass(frozen=True)
class Report:
    """One compile run: what was compiled, the rows, the gate failures, how long it took."""

    matrix: Any  # aot.Matrix
    targets: tuple[str, ...]
    rows: Sequence[Any]  # aot.CompiledLaunch
    failures: Sequence[str]
    elapsed_s: float
    argv: Sequence[str]
    timing: Any = None  # aot.Timing: recording against compiling, and the cache


def summary(rows: Sequence[Any]) -> list[dict[str, Any]]:
    """Per kernel x target x layout: variants and the worst value of each resource."""
    groups: dict[tuple[str, str, str], list[Any]] = {}
    for row in rows:
        groups.setdefault((row.kernel, row.target, row.layout), []).append(row)
    order = {name: index for index, name in enumerate(LAYOUTS)}
    table = []
    for (kernel, target, layout), members in sorted(
        groups.items(), key=lambda item: (item[0][0], item[0][1], order[item[0][2]])
    ):
        built = [row.resources for row in members if row.error is None]
        table.append(
            {
                "kernel": kernel,
                "target": target,
                "layout": layout,
                "dtypes": sorted({row.dtype for row in members}),
                "launches": len(members),
                "errors": sum(row.error is not None for row in members),
                "reads_logits": any(row.reads_logits for row in members),
                "forms_logits": any(row.forms_logits for row in members),
                "registers": max((r.registers for r in built), default=None),
                "spill_bytes": max((r.spill_bytes for r in built), default=None),
                "spill_registers": max((r.spill_registers for r in built), default=None),
                "shared_bytes": max((r.shared_bytes for r in built), default=None),
                "narrowest_widest_load_bits": min((r.widest_load_bits for r in built), default=0),
                "vectorized": bool(built) and all(r.vectorized for r in built),
                "fp64_in_loop": sorted({op for r in built for op in r.fp64_in_loop}),
                "approx_div_f32": max((r.approx_div_f32 for r in built), default=0),
                "ieee_div_f32": max((r.ieee_div_f32 for r in built), default=0),
            }
        )
    return table


def headline(report: Report) -> str:
    """Max registers per target kind, spills, which kernels vectorize, gate status."""
    built = [row for row in report.rows if row.error is None]
    nvidia = [row.resources.registers for row in built if row.target.startswith("sm_")]
    amd = [row.resources.registers for row in built if row.target.startswith("gfx")]
    spilled = sum(row.resources.spills for row in built)
    readers = sorted({row.kernel for row in report.rows if row.reads_logits or row.forms_logits})
    vector = [
        kernel
        for kernel in readers
        if all(
            row.resources is not None and row.resources.vectorized
            for row in report.rows
            if row.kernel == kernel and row.layout in ("aligned", "aligned-2gib")
        )
    ]
    kernels = len({row.kernel for row in report.rows})
    specializations = len(report.rows)
    compiles = {
        target: len({r.job for r in report.rows if r.target == target}) for target in report.targets
    }
    lines = [
        f"{kernels} kernels, {specializations} launch x target rows "
        f"({report.matrix.name} matrix) in {report.elapsed_s:.0f} s",
        f"distinct compiles (one per specialization and target): {sum(compiles.values())} "
        f"({', '.join(f'{target} {count}' for target, count in compiles.items())})",
        f"max registers/thread: NVIDIA {max(nvidia, default=0)}, AMD {max(amd, default=0)} VGPRs; "
        f"rows with spills: {spilled}",
        f"128-bit loads in the aligned layouts: {', '.join(vector) or 'none'}"
        f" (of {len(readers)} kernels that read the logits or form them from hidden states)",
        f"gates: {'PASS' if not report.failures else f'{len(report.failures)} FAILED'}",
    ]
    if report.timing is not None:
        lines.insert(2, _time_line(report.timing))
    return "\n".join(lines)


def _time_line(timing: Any) -> str:
    cache = (
        "a cold Triton cache"
        if timing.cached == 0
        else f"a warm Triton cache ({timing.cached} entries at the start)"
    )
    return (
        f"where the time went: {timing.recorded_s:.0f} s recording and specializing, "
        f"{timing.compiled_s:.0f} s for {timing.compiles} distinct compiles on "
        f"{timing.workers} worker(s), from {cache}"
    )


def write_json(report: Report, path: str | Path) -> None:
    rows = [
        {
            "kernel": row.kernel,
            "target": row.target,
            "layout": row.layout,
            "dtype": row.dtype,
            "contract": row.contract,
            "backend": row.backend,
            "reads_logits": row.reads_logits,
            "forms_logits": row.forms_logits,
            "num_warps": row.num_warps,
            "block": row.block,
            "error": row.error,
            "resources": None if row.resources is None else row.resources.to_dict(),
        }
        for row in report.rows
    ]
    document = {
        "matrix": report.matrix.name,
        "targets": list(report.targets),
        "elapsed_s": report.elapsed_s,
        "versions": _versions(),
        "gates_passed": not report.failures,
        "failures": list(report.failures),
        "summary": summary(report.rows),
        "rows": rows,
    }
    Path(path).write_text(json.dumps(document, indent=1) + "\n")


def write_markdown(report: Report, path: str | Path) -> None:
    Path(path).write_text(_markdown(report))


def _markdown(report: Report) -> str:
    versions = _versions()
    out = [
        "# GPU readiness: every Triton kernel compiled for every target",
        "",
        "Generated by `nox -s compile` (`python -m tools.gpu_readiness "
        f"--matrix {report.matrix.name} --markdown docs/gpu-readiness.md`); do not edit by hand.",
        f"Triton {versions['triton']}, ptxas {versions['ptxas']}, on {versions['machine']}, "
        f"no GPU; {len(report.rows)} launch x target rows in {report.elapsed_s:.0f} s "
        "(through Triton's cache, `TRITON_CACHE_DIR`: the headline says whether it was cold).",
        "",
        "Every launch comes from the backends' real launch path "
        "(`tools.gpu_readiness.recorder`): each Triton backend's forward and `train` "
        "backward run on tiny CPU tensors (logits; for the fused LM-head backends, which "
        'take `input_kind="hidden"`, hidden states, weight rows and bias, H=64, 61 when '
        "unaligned) with `launch` recorded instead of run and the "
        "platform forced to cuda or rocm, so the launch table picks the configs; every "
        "contract variant (role, dtypes, determinism scope, export flags, temperature, bias) "
        f"and TP=1 and TP=2. Matrix `{report.matrix.name}`: {report.matrix.description}. "
        "The JIT's own binder picks each specialization; `triton.compile` builds it "
        "(`tools.gpu_readiness.aot`), and `tools.gpu_readiness.resources` "
        "reads the cubin (`cuobjdump -res-usage`) and PTX, or the AMDGCN.",
        "",
        "## Headline",
        "",
        *[f"- {line}" for line in headline(report).splitlines()],
        "",
        "## Gates",
        "",
        "- every launch compiles for every target (`sm_80`, `sm_90`, `sm_100`, `gfx942`, "
        "`gfx950`);",
        "- zero spills everywhere;",
        "- the kernels that read the logits, and those that form them from hidden states "
        "and weight rows (the fused LM head's `tl.dot`), are held to the rest:",
        "  - in the aligned layouts, their widest global load in the element code is 128 bits "
        "(`ld.global.v4`, or a 16-byte `cp.async` into shared memory, in PTX; "
        "`global_load_dwordx4` or `buffer_load_dwordx4` in AMDGCN);",
        "  - no fp64 instruction in their loops (fp64 is fine in the per-row merges);",
        "  - no approximate fp32 division (`div.full.f32`) in them, and with a temperature "
        "(`SCALE`) at least one `div.rn.f32`: the contract's `fp32(x) / T` is IEEE "
        "(NVIDIA; AMD not checked);",
        "- cross-platform bits: every launch made for a `cross_platform_bitwise` contract "
        "breaks no rule of its target's table (below), every backend whose capability claims "
        "the scope on a platform is compiled under it there, and the gate's probes "
        "(`tools.gpu_readiness.probes`) are judged as they must be on every target: "
        "`vendor_math_probe_kernel` (`tl.exp`, fp fusion on) flagged, `ieee_probe_kernel` "
        "(`div_rn`, `sqrt_rn`, fp fusion off) clean.",
        "",
    ]
    if not report.failures:
        out += ["All gates pass.", ""]
    else:
        out += [f"**{len(report.failures)} gate failures:**", ""]
        out += [f"- {line}" for line in report.failures[:_MAX_LISTED_FAILURES]]
        if len(report.failures) > _MAX_LISTED_FAILURES:
            out.append(f"- ... and {len(report.failures) - _MAX_LISTED_FAILURES} more")
        out.append("")
    out += _bitwise_section(report)
    out += _layouts_section()
    out += _resources_section(report)
    out += _roofline_section(report)
    return "\n".join(out)


def bitwise_rules_markdown() -> str:
    """The cross-platform-bits rule tables (:data:`.bitwise.RULES`) as markdown."""
    tables: dict[tuple[bitwise.Rule, ...], list[str]] = {}
    for target, rules in bitwise.RULES.items():
        tables.setdefault(rules, []).append(target)
    lines = [
        "## Cross-platform bits: the instruction rules",
        "",
        "A kernel launched for a `cross_platform_bitwise` contract may use only what IEEE 754 "
        "rounds correctly on every conforming unit (`+ - * /`, `sqrt`, `fma`), in the order "
        "its source wrote, on unflushed subnormals. `tools.gpu_readiness.bitwise` reads the "
        "code each compile already produced (no extra compile) and names what breaks that. "
        "NVIDIA is judged on the PTX: ptxas expands the correctly rounded `div.rn`, "
        "`sqrt.rn` and `rcp.rn` into SASS with `MUFU.RCP`, `FFMA` and `.FTZ` compares of its "
        "own, correct by the PTX ISA, so the SASS cannot be held to the same table. AMDGCN is "
        "the final ISA, where LLVM's correctly rounded f32 division and square root use the "
        "approximate instructions as seeds: each `v_div_fixup_f32` (`_f64`) allows one "
        "`v_rcp_f32` (`_f64`) and five fmas, each `v_sqrt_f32` two residual fmas, and each "
        "`v_fma_f32` by -2^32 is the exact remainder of an f32 -> 64-bit integer conversion; "
        "fewer fmas than the expansions need is an approximate expansion. An fma rule is "
        "lifted when the source wrote `tl.fma` (TTIR `math.fma`), and then the compile must "
        "have `enable_fp_fusion=False`.",
        "",
    ]
    for rules, targets in tables.items():
        lines += [
            f"Targets {', '.join(f'`{target}`' for target in targets)}:",
            "",
            "| rule | opcodes (regex) | why it breaks the bits |",
            "|---|---|---|",
        ]
        for rule in rules:
            asked = " (lifted by `tl.fma`)" if rule.unless_asked else ""
            pattern = rule.opcode.pattern.replace("|", "\\|")
            lines.append(f"| {rule.name}{asked} | `{pattern}` | {rule.why} |")
        lines.append("")
    lines += [
        "Beside the tables: on AMD, `incomplete IEEE expansion` (fewer fmas than the "
        "divisions and square roots need: an approximate `v_sqrt_f32` or division) and "
        "`denormals flushed` (a kernel descriptor's `.amdhsa_float_denorm_mode_32` or "
        "`_16_64` other than 3, which keeps them); on every target, `fp fusion beside tl.fma` "
        "(the source asks for fma and the compile has `enable_fp_fusion=True`).",
        "",
    ]
    return "\n".join(lines)


def _bitwise_section(report: Report) -> list[str]:
    promised: dict[tuple[str, str], list[Any]] = {}
    for row in report.rows:
        if row.promises_bits:
            promised.setdefault((row.backend, row.kernel), []).append(row)
    lines = [
        *bitwise_rules_markdown().splitlines(),
        "Covered kernels (launches promised bits, and the gate's probes):",
        "",
    ]
    for (backend, kernel), members in sorted(promised.items()):
        broken = sorted({t.target for t in members if t.resources and t.resources.bitwise_findings})
        status = f"rules broken on {', '.join(broken)}" if broken else "no rule broken"
        lines.append(f"- {backend}: `{kernel}`, {len(members)} launch x target rows: {status}")
    return [*lines, ""]


def _layouts_section() -> list[str]:
    lines = ["## Layouts (JIT specializations)", ""]
    lines += [f"- `{layout.name}`: {layout.description}" for layout in LAYOUTS.values()]
    return [*lines, ""]


def _resources_section(report: Report) -> list[str]:
    lines = [
        "## Resources per kernel x target x layout",
        "",
        "Worst case over the layout's launches (dtypes and contract variants). Registers: "
        "per thread (AMD: VGPRs + AGPRs). Shared: bytes the launch requests. Widest load: "
        "the narrowest, over the launches, of the widest global load in the element code "
        "(loop bodies, or the whole kernel when it has no loop). fp32 div: IEEE / approximate "
        "count in the element code (NVIDIA).",
        "",
        "| kernel | target | layout | dtypes | launches | registers | spills | shared B "
        "| widest load | 128-bit | fp64 in loop | fp32 div |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for item in summary(report.rows):
        if item["errors"]:
            lines.append(
                f"| {item['kernel']} | {item['target']} | {item['layout']} | "
                f"{'/'.join(item['dtypes'])} | {item['launches']} | "
                f"**{item['errors']} failed to compile** | | | | | | |"
            )
            continue
        spills = item["spill_bytes"] + item["spill_registers"]
        fp64 = ", ".join(item["fp64_in_loop"]) or "no"
        div = (
            "-"
            if item["target"].startswith("gfx")
            else (f"{item['ieee_div_f32']} / {item['approx_div_f32']}")
        )
        lines.append(
            f"| {item['kernel']} | {item['target']} | {item['layout']} | "
            f"{'/'.join(item['dtypes'])} | {item['launches']} | {item['registers']} | "
            f"{spills} | {item['shared_bytes']} | {item['narrowest_widest_load_bits']} | "
            f"{'yes' if item['vectorized'] else 'no'} | {fp64} | {div} |"
        )
    return [*lines, ""]


def _roofline_section(report: Report) -> list[str]:
    shape = traffic.BENCH_SHAPE
    names = list(traffic.PEAK_BANDWIDTH)
    lines = [
        "## Roofline at the bench shape",
        "",
        f"N={shape.rows}, V={shape.vocab}, bf16 logits, TP={shape.tp}, fp32 outputs. Bytes "
        "per row from `tools.gpu_readiness.traffic` (one function per backend); "
        "predicted time = N x bytes per row / peak HBM bandwidth "
        f"({', '.join(f'{n} {bw / 1e12:.2f} TB/s' for n, bw in traffic.PEAK_BANDWIDTH.items())}"
        "). `benchmarks/bench_kernels.py` prints measured / predicted on a GPU.",
        "",
        "| backend | kernels | read B/row | written B/row | "
        + " | ".join(f"{name} ms" for name in names)
        + " |",
        f"|---|---|---:|---:|{'---:|' * len(names)}",
    ]
    for backend, stages in traffic.TRAFFIC.items():
        read = sum(stage.read for stage in stages(shape))
        written = sum(stage.written for stage in stages(shape))
        times = " | ".join(
            f"{traffic.predicted_seconds(backend, shape, bw) * 1e3:.3f}"
            for bw in traffic.PEAK_BANDWIDTH.values()
        )
        kernels = ", ".join(stage.kernel for stage in stages(shape))
        lines.append(f"| {backend} | {kernels} | {read} | {written} | {times} |")
    fused = sorted({row.backend for row in report.rows if row.forms_logits})
    if fused:
        lines += ["", f"Not modelled: {', '.join(fused)}. {traffic.FUSED_NOT_MODELLED}"]
    return [*lines, ""]


def _versions() -> dict[str, str]:
    import triton
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = {}
    for label, capability in (("sm_80", 80), ("sm_90+", 90)):
        try:
            out = subprocess.run(
                [get_ptxas(capability).path, "--version"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            found = re.search(r"release ([\d.]+)", out)
            ptxas[label] = found.group(1) if found else "unknown"
        except (OSError, subprocess.CalledProcessError):
            ptxas[label] = "unknown"
    return {
        "triton": triton.__version__,
        "ptxas": ", ".join(f"{version} ({label})" for label, version in ptxas.items()),
        "machine": f"{platform.machine()} {platform.system()}",
    }
