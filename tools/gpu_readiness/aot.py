"""Ahead-of-time compilation of every recorded Triton launch for every GPU target, on a CPU.

The launches come from :mod:`.recorder` (the backends' real launch path, so no
hand-written signature list can drift). For each launch and target, the JIT's
own binder turns the recorded arguments into the signature, constexprs and
alignment attributes it would pick on that GPU, and ``triton.compile`` lowers the
``ASTSource`` to a cubin (NVIDIA ``sm_80``, ``sm_90``, ``sm_100``; the ``ptxas``
in the Triton wheel) or an hsaco (AMD ``gfx942``, ``gfx950``; LLVM and lld are
linked into Triton). Equal specializations are compiled once; Triton's cache
(``TRITON_CACHE_DIR``) makes reruns cheap. :mod:`.resources` reads each binary.

Where the time goes (Triton 3.9, 2 shared cores): first the recording, one op call
per backend x platform x layout x TP view x target dtype x contract variant (the full
matrix crosses 1728 logits and 6912 hidden-input variants: about 0.8 M op calls);
torch on one thread and the options described once per call made it 5.4x faster
(``recorder.record(["cuda"], ["aligned"], (torch.int64,))``: 366 s on main, 68 s here,
back to back), and it is split over the workers. Then one compile per distinct
specialization and target (launches that bind to the same signature, constexprs,
attributes and options share it; a hash of the source TTIR merges none further).
The CI matrix has 1683 (311 per NVIDIA target, 375 per AMD one): ``--estimate 6``
measured about 2.3 s each cold on NVIDIA and 1.2 s on AMD, 0.03-0.06 s from Triton's
cache, and ``--matrix ci --jobs 2`` ran in 843 s with a partly warm cache, every gate
passing. The full matrix (``--matrix full --estimate 3 --jobs 2``: 984964 launches
recorded in 1029 s on 2 workers, load about 13) has 29240 (5356 per NVIDIA target,
6586 per AMD one): at the CI sample's cold means about 7 h on 2 workers, from a warm
cache (``TRITON_CACHE_DIR``, how ``nox -s compile`` reruns) about 12 min of compiles
after the recording.

This module needs the real compiler: run it where ``TRITON_INTERPRET`` is unset
(under the interpreter ``@triton.jit`` yields objects that cannot be compiled).

Run: ``python -m tools.gpu_readiness [--matrix ci|full] [--jobs N]
[--json PATH] [--markdown PATH]``; it exits 1 when a gate fails (see :func:`gate_failures`).
``--estimate N`` records and specializes only, compiles N distinct kernels per target and
prints what the whole matrix would take (:func:`estimate_matrix`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import multiprocessing
import os
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BITWISE_GATE",
    "GATED_LAYOUTS",
    "PROBE_BACKEND",
    "MATRICES",
    "TARGETS",
    "CompiledLaunch",
    "Matrix",
    "bitwise_backends",
    "compile_matrix",
    "estimate_matrix",
    "gate_failures",
    "main",
    "plan_matrix",
]

# name -> (Triton backend, arch, threads per warp)
TARGETS: dict[str, tuple[str, Any, int]] = {
    "sm_80": ("cuda", 80, 32),
    "sm_90": ("cuda", 90, 32),
    "sm_100": ("cuda", 100, 32),
    "gfx942": ("hip", "gfx942", 64),
    "gfx950": ("hip", "gfx950", 64),
}
_PLATFORM = {"cuda": "cuda", "hip": "rocm"}
GATED_LAYOUTS = ("aligned", "aligned-2gib")  # where per-element loads must be vectorized
BITWISE_GATE = "cross-platform bits"
PROBE_BACKEND = "gate probe"  # the rows of tools.gpu_readiness.probes


@dataclass(frozen=True)
class Part:
    """Launches to record: (layout, logits dtype) cases, target-id dtypes, and how the
    contract options and target dtype combine (a :class:`recorder.Coverage` name)."""

    cases: tuple[tuple[str, str], ...]
    target_dtypes: tuple[str, ...]
    coverage: str


@dataclass(frozen=True)
class Matrix:
    """Which recorded launches to compile: the union of its parts' launches."""

    name: str
    parts: tuple[Part, ...]
    description: str


_ALL_DTYPES = ("bf16", "fp16", "fp32")
_ALL_CASES = tuple(
    (layout, dtype)
    for layout in ("aligned", "aligned-2gib", "padded", "unaligned")
    for dtype in _ALL_DTYPES
)
MATRICES = {
    "full": Matrix(
        "full",
        (
            Part((("aligned", "bf16"),), ("int64",), "EXHAUSTIVE"),
            Part(_ALL_CASES, ("int64", "int32"), "PAIRS"),
        ),
        "every combination of contract options in the aligned bf16 layout (int64 targets: "
        "every constexpr combination each kernel can be launched with), and every layout x "
        "logits dtype with every pair of option values, the target dtype (int64, int32) among "
        "the options, together in some launch",
    ),
    "ci": Matrix(
        "ci",
        (
            Part(
                (
                    ("aligned", "bf16"),
                    ("aligned-2gib", "bf16"),
                    ("padded", "bf16"),
                    ("unaligned", "fp32"),
                ),
                ("int64",),
                "SINGLES",
            ),
        ),
        "aligned and padded bf16 (4096-column tiles), unaligned fp32 (2048-column tiles), both "
        "roles, each other contract option changed alone, int64 targets: every kernel, launch "
        "config and constexpr on every target",
    ),
}


@dataclass(frozen=True)
class CompiledLaunch:
    """One recorded launch compiled for one target: its resources, or the compile error."""

    kernel: str
    target: str
    layout: str
    dtype: str
    contract: str
    backend: str
    reads_logits: bool
    forms_logits: bool  # reads hidden states and weight (the fused LM head)
    scales: bool  # divides by the temperature (constexpr ``SCALE``)
    num_warps: int
    block: int
    resources: Any  # resources.Resources, or None when compiling failed
    error: str | None
    promises_bits: bool = False  # launched for a cross_platform_bitwise contract, or a probe
    job: str = ""  # the compile job's key: rows with one key share one compile


def plan_matrix(
    matrix: Matrix, targets: Sequence[str] = tuple(TARGETS), jobs: int = 1
) -> tuple[dict[str, _Job], list[tuple[Any, str, str]]]:
    """Record ``matrix`` and specialize each launch for each target, compiling nothing.

    Returns the distinct compile jobs by key (the JIT's signature, constexprs,
    alignment attributes and options on one target: launches equal in all of them
    compile to one binary) and each launch x target with its job's key.
    """
    platforms = sorted({_PLATFORM[TARGETS[name][0]] for name in targets})
    parts = [
        (platform, layout, dtypes, part.target_dtypes, part.coverage)
        for part in matrix.parts
        for platform in platforms
        for layout, dtypes in _dtypes_by_layout(part.cases).items()
    ]
    started = time.perf_counter()
    if jobs <= 1:
        launches = [launch for part in parts for launch in _record_part(part)]
    else:  # the recording runs the backends' torch code: one process per core
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
            launches = [_resolved(item) for done in pool.map(_record_part, parts) for item in done]
    print(f"recorded in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    launches += [probe for platform in platforms for probe in _probe_launches(platform)]
    print(f"recorded {len(launches)} launches", file=sys.stderr)
    _check_compilable(launches)
    pending: dict[str, _Job] = {}
    keys: dict[tuple[Any, ...], str] = {}  # (launch compile key, target) -> job key
    placed: list[tuple[Any, str, str]] = []
    for launch in launches:
        for target in targets:
            if _PLATFORM[TARGETS[target][0]] != launch.platform:
                continue
            found = (launch.compile_key(), target)
            if found not in keys:
                job = _job(launch, target)
                pending.setdefault(job.key, job)
                keys[found] = job.key
            placed.append((launch, target, keys[found]))
    return pending, placed


@dataclass(frozen=True)
class Timing:
    """Where a compile run's time went, and whether Triton's cache was warm."""

    recorded_s: float  # recording and specializing every launch
    compiled_s: float  # the distinct compiles (Triton's cache answers the ones it holds)
    compiles: int
    workers: int
    cached: int  # entries in Triton's cache when the run began: 0 is a cold cache


def compile_matrix(
    matrix: Matrix, targets: Sequence[str] = tuple(TARGETS), jobs: int = 1
) -> tuple[list[CompiledLaunch], Timing]:
    """Record, specialize and compile ``matrix`` for ``targets``; one row per launch x target.

    The recording is split by platform x layout over ``jobs`` processes, as the compiles
    are; each distinct specialization is compiled once per target (:func:`plan_matrix`).
    """
    cached = _cache_entries()
    started = time.perf_counter()
    pending, placed = plan_matrix(matrix, targets, jobs)
    recorded = time.perf_counter()
    results = dict(zip(pending, _run_jobs(list(pending.values()), jobs), strict=True))
    timing = Timing(recorded - started, time.perf_counter() - recorded, len(pending), jobs, cached)
    seen: set[tuple[Any, ...]] = set()
    rows = []
    for launch, target, key in placed:
        resources, error = results[key]
        row = CompiledLaunch(
            kernel=launch.name,
            target=target,
            layout=launch.layout,
            dtype=launch.dtype,
            contract=launch.contract,
            backend=launch.backend,
            reads_logits=launch.reads_logits,
            forms_logits=launch.forms_logits,
            scales=bool(dict(launch.constexprs).get("SCALE", False)),
            num_warps=launch.num_warps,
            block=dict(launch.constexprs)["BLOCK"],
            resources=resources,
            error=error,
            promises_bits=launch.promises_bits,
            job=key,
        )
        identity = (row.kernel, row.target, row.layout, row.dtype, row.contract, key)
        if identity not in seen:
            seen.add(identity)
            rows.append(row)
    return rows, timing


def _cache_entries() -> int:
    """How many kernels Triton's cache holds (``TRITON_CACHE_DIR``, else its default)."""
    from triton import knobs

    found = knobs.cache.dir
    return len(os.listdir(found)) if found and os.path.isdir(found) else 0


def estimate_matrix(matrix: Matrix, targets: Sequence[str], jobs: int, sample: int) -> list[str]:
    """What compiling ``matrix`` would cost: its distinct compiles per target (from
    :func:`plan_matrix`, which records it) times the mean seconds of ``sample`` of them
    compiled here, one after another (a fixed random choice; point ``TRITON_CACHE_DIR``
    at an empty folder for a cold cache), shared by ``jobs`` workers."""
    import random

    started = time.perf_counter()
    pending, placed = plan_matrix(matrix, targets, jobs)
    planned = time.perf_counter() - started
    lines = [
        f"matrix {matrix.name}: recorded and specialized in {planned:.0f} s with {jobs} "
        f"worker(s); {len(placed)} launch x target pairs, {len(pending)} distinct compiles"
    ]
    total = 0.0
    for target in targets:
        mine = [job for job in pending.values() if job.target == target]
        chosen = random.Random(0).sample(mine, min(sample, len(mine)))
        seconds = []
        for job in chosen:
            begun = time.perf_counter()
            _compile(job)
            seconds.append(time.perf_counter() - begun)
        mean = sum(seconds) / max(len(seconds), 1)
        total += mean * len(mine)
        lines.append(
            f"  {target}: {len(mine)} distinct compiles x {mean:.2f} s (mean of {len(seconds)}; "
            f"median {sorted(seconds)[len(seconds) // 2] if seconds else 0:.2f} s) = "
            f"{mean * len(mine):.0f} s"
        )
    lines.append(
        f"estimate: {planned:.0f} s recording + {total:.0f} s compiling / {jobs} worker(s) = "
        f"{(planned + total / max(jobs, 1)) / 60:.1f} min"
    )
    return lines


def _dtypes_by_layout(cases: Sequence[tuple[str, str]]) -> dict[str, tuple[str, ...]]:
    found: dict[str, tuple[str, ...]] = {}
    for layout, dtype in cases:
        found[layout] = (*found.get(layout, ()), dtype)
    return found


def _record_part(part: tuple[str, str, tuple[str, ...], tuple[str, ...], str]) -> list[Any]:
    """The launches of one platform x layout for some logits dtypes (run in a worker:
    kernels named, not pickled)."""
    import torch

    from tools.gpu_readiness import recorder

    platform, layout, dtypes, target_dtypes, coverage = part
    targets = tuple(getattr(torch, name) for name in target_dtypes)
    launches = recorder.record([platform], [layout], targets, recorder.Coverage[coverage], dtypes)
    if multiprocessing.parent_process() is None:
        return launches
    return [dataclasses.replace(item, kernel=_kernel_name(item.kernel)) for item in launches]


def _kernel_name(kernel: Any) -> tuple[str, str]:
    return (kernel.__module__, kernel.__name__)


def _resolved(launch: Any) -> Any:
    """A launch from a worker, its kernel looked up again by module and name."""
    import importlib

    module, name = launch.kernel
    return dataclasses.replace(launch, kernel=getattr(importlib.import_module(module), name))


def gate_failures(rows: Iterable[CompiledLaunch]) -> list[str]:
    """Every gate violation, one line per kernel x target x layout x dtype and finding.

    Gates: every launch compiles for every target; no spills; for every kernel that
    reads the logits or forms them (from hidden states and weight, the fused LM head):
    in the aligned layouts its widest element-code load is 128 bits; no fp64 in its
    loops; no approximate fp32 division, and with a temperature at least one IEEE
    ``div.rn.f32`` (the contract's ``fp32(x) / T`` is IEEE; NVIDIA only, where PTX
    names the two apart). Cross-platform bits: every launch made for a
    ``cross_platform_bitwise`` contract breaks no rule of its target's table
    (:mod:`.bitwise`), every backend claiming the scope is compiled under it, and the
    gate's probes (:mod:`.probes`) are flagged on every target, or not, as they must be.
    """
    rows = list(rows)
    found: dict[tuple[str, str, str], list[str]] = {}
    for row in rows:
        where = f"{row.kernel} on {row.target}, {row.layout} {row.dtype}"
        for gate, detail in _violations(row):
            found.setdefault((gate, where, detail), []).append(row.contract)
    return [
        f"{gate}: {where}, {len(contracts)} launch(es) (e.g. {contracts[0]}): {detail}"
        for (gate, where, detail), contracts in found.items()
    ] + _bitwise_coverage(rows)


def _violations(row: CompiledLaunch) -> list[tuple[str, str]]:
    if row.error is not None:
        return [("compile", row.error)]
    res = row.resources
    found = []
    if row.backend == PROBE_BACKEND:
        return _probe_violations(row)
    if row.promises_bits and res.bitwise_findings:
        found.append((BITWISE_GATE, "; ".join(res.bitwise_findings)))
    if res.spills:
        found.append(
            ("spills", f"{res.spill_bytes} spill bytes, {res.spill_registers} spilled registers")
        )
    if not (row.reads_logits or row.forms_logits):
        return found
    if row.layout in GATED_LAYOUTS and not res.vectorized:
        found.append(
            (
                "vectorized loads",
                f"widest global load in the element code is {res.widest_load_bits} bits",
            )
        )
    if res.fp64_in_loop:
        found.append(("fp64 in loop", ", ".join(res.fp64_in_loop)))
    if res.approx_div_f32:
        found.append(("approximate fp32 division", f"{res.approx_div_f32} div.full/div.approx"))
    if row.scales and TARGETS[row.target][0] == "cuda" and not res.ieee_div_f32:
        found.append(("IEEE fp32 division", "SCALE=True but no div.rn.f32 in the element code"))
    return found


def bitwise_backends(platform: str) -> tuple[str, ...]:
    """The backends whose capability claims ``cross_platform_bitwise`` on ``platform``."""
    import tp_logprob as tpl

    return tuple(
        capability.backend_id
        for capability in tpl.registry.backends(platform)
        if tpl.DeterminismScope.CROSS_PLATFORM_BITWISE in capability.determinism_scopes
        and platform in capability.bitwise_platforms
    )


def _bitwise_coverage(rows: Sequence[CompiledLaunch]) -> list[str]:
    """A Triton backend claiming the scope on a platform must be compiled under it on its
    targets (a torch backend launches no kernel to compile)."""
    from tools.gpu_readiness.recorder import triton_backends

    compiled = {(row.backend, row.target) for row in rows if row.promises_bits}
    targets = sorted({row.target for row in rows})
    missing = []
    for target in targets:
        platform = _PLATFORM[TARGETS[target][0]]
        triton = set(triton_backends(platform))
        for backend in (name for name in bitwise_backends(platform) if name in triton):
            if (backend, target) not in compiled:
                missing.append(
                    f"{BITWISE_GATE}: {backend} claims cross_platform_bitwise on {platform} but "
                    f"no launch of it was recorded under that scope for {target}"
                )
    return missing


def _probe_violations(row: CompiledLaunch) -> list[tuple[str, str]]:
    """The vendor-math probe must break its rules on every target, the IEEE probe none."""
    from tools.gpu_readiness.probes import PROBES

    probe = next(probe for probe in PROBES if probe.name == row.kernel)
    expected = probe.must_break["sm" if row.target.startswith("sm_") else "gfx"]
    found = row.resources.bitwise_findings
    broken = {line.split(":", 1)[0] for line in found}
    if not expected and found:
        return [(BITWISE_GATE, f"the IEEE probe is flagged: {'; '.join(found)}")]
    missed = [rule for rule in expected if rule not in broken]
    if missed:
        return [(BITWISE_GATE, f"the gate is blind here: {', '.join(missed)} not found")]
    return []


def _probe_launches(platform: str) -> list[Any]:
    """The gate's probe kernels (:mod:`.probes`) as recorded launches on ``platform``."""
    from tools.gpu_readiness import probes
    from tools.gpu_readiness.recorder import KernelLaunch

    return [
        KernelLaunch(
            kernel=probe.kernel,
            args=probes.probe_args(),
            constexprs=(("BLOCK", probes.PROBE_BLOCK), ("enable_fp_fusion", probe.fp_fusion)),
            num_warps=probes.PROBE_WARPS,
            grid=(1,),
            backend=PROBE_BACKEND,
            platform=platform,
            layout="aligned",
            dtype="fp32",
            contract=f"enable_fp_fusion={probe.fp_fusion}",
            promises_bits=True,
        )
        for probe in probes.PROBES
    ]


@dataclass(frozen=True)
class _Job:
    """A picklable compile job: the kernel by module and name, args as recorded, one target."""

    key: str
    module: str
    name: str
    target: str
    args: tuple[Any, ...]
    constexprs: tuple[tuple[str, Any], ...]
    num_warps: int


class _TensorStandIn:
    """What the JIT's binder reads from a tensor argument: dtype, alignment, buffer size."""

    def __init__(self, arg: Any) -> None:
        self.dtype = arg.dtype
        self._data_ptr = 4096 + int(arg.data_ptr_mod_16)
        self._nbytes = int(arg.nbytes)

    def data_ptr(self) -> int:
        return self._data_ptr

    def ptr_range(self) -> int:
        return self._nbytes


_BINDERS: dict[tuple[int, str], tuple[Any, Any]] = {}  # (id(kernel), target) -> the JIT's binder


def _check_compilable(launches: Sequence[Any]) -> None:
    for launch in launches:
        if not hasattr(launch.kernel, "params"):
            raise RuntimeError(
                f"{launch.name} is {type(launch.kernel).__name__}, not a JITFunction: "
                "compile where TRITON_INTERPRET is unset"
            )


def _job(launch: Any, target: str) -> _Job:
    kernel = launch.kernel
    signature, constexprs, attrs, options = _specialize(
        kernel, launch.args, launch.constexprs, launch.num_warps, target
    )
    key = repr((kernel.__module__, kernel.__name__, target, signature, constexprs, attrs, options))
    return _Job(
        key,
        kernel.__module__,
        kernel.__name__,
        target,
        launch.args,
        launch.constexprs,
        launch.num_warps,
    )


def _gpu_target(target: str) -> Any:
    from triton.backends.compiler import GPUTarget

    return GPUTarget(*TARGETS[target])


def _specialize(
    kernel: Any,
    args: tuple[Any, ...],
    constexprs: tuple[tuple[str, Any], ...],
    num_warps: int,
    target: str,
) -> tuple[dict[str, Any], dict[Any, Any], dict[Any, Any], Any]:
    """The ``(signature, constexprs, attrs, options)`` the JIT would pick on ``target``."""
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    from tools.gpu_readiness.recorder import TensorArg

    cached = (id(kernel), target)
    if cached not in _BINDERS:
        backend = make_backend(_gpu_target(target))
        _BINDERS[cached] = (
            backend,
            create_function_from_signature(kernel.signature, kernel.params, backend),
        )
    backend, binder = _BINDERS[cached]
    values = [_TensorStandIn(arg) if isinstance(arg, TensorArg) else arg for arg in args]
    kwargs = {**dict(constexprs), "num_warps": num_warps}
    bound, specialization, options = binder(*values, **kwargs)
    options, signature, constexpr_values, attrs = kernel._pack_args(
        backend, kwargs, bound, specialization, options
    )
    return signature, constexpr_values, attrs, options


def _run_jobs(jobs: list[_Job], workers: int) -> list[tuple[Any, str | None]]:
    started = time.perf_counter()
    print(f"compiling {len(jobs)} kernel specializations with {workers} worker(s)", file=sys.stderr)
    if workers <= 1:
        return [_compile(job) for job in jobs]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        results = list(pool.map(_compile, jobs, chunksize=4))
    print(f"compiled in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return results


def _compile(job: _Job) -> tuple[Any, str | None]:
    """Compile one job and read its resources; a compile error is returned, not raised."""
    import importlib

    import triton
    from triton.compiler import ASTSource

    from tools.gpu_readiness.resources import analyze

    kernel = getattr(importlib.import_module(job.module), job.name)
    signature, constexprs, attrs, options = _specialize(
        kernel, job.args, job.constexprs, job.num_warps, job.target
    )
    target = _gpu_target(job.target)
    try:
        compiled = triton.compile(
            ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__
        )
    except Exception as error:  # the report names the kernel, target and error
        lines = [line for line in str(error).splitlines() if line.strip()]
        return None, f"{type(error).__name__}: {' / '.join(lines[:3])}"
    return analyze(compiled, job.target), None


def main(argv: Sequence[str] | None = None) -> int:
    """Compile the matrix, print the gates, write the reports; 1 when a gate fails."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", choices=sorted(MATRICES), default="full")
    parser.add_argument("--targets", nargs="+", choices=list(TARGETS), default=list(TARGETS))
    parser.add_argument("--jobs", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    parser.add_argument("--json", help="write every compiled launch and the gates as JSON")
    parser.add_argument("--markdown", help="write the readiness report (docs/gpu-readiness.md)")
    parser.add_argument(
        "--estimate",
        type=int,
        metavar="N",
        help="record and specialize only, compile N distinct kernels per target, print the "
        "estimated time of the whole matrix",
    )
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        parser.error("unset TRITON_INTERPRET: the interpreter cannot compile for a GPU")
    # The GPU runs pin Triton 3.9's default (FP fusion on) the same way; it warns when unset.
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    from tools.gpu_readiness import readiness

    matrix = MATRICES[args.matrix]
    if args.estimate is not None:
        print("\n".join(estimate_matrix(matrix, args.targets, args.jobs, args.estimate)))
        return 0
    started = time.perf_counter()
    rows, timing = compile_matrix(matrix, args.targets, args.jobs)
    elapsed = time.perf_counter() - started
    failures = gate_failures(rows)
    report = readiness.Report(
        matrix, tuple(args.targets), rows, failures, elapsed, sys.argv, timing
    )
    if args.json:
        readiness.write_json(report, args.json)
    if args.markdown:
        readiness.write_markdown(report, args.markdown)
    print(readiness.headline(report))
    for failure in failures:
        print(f"GATE FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
