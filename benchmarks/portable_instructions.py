"""Which floating-point instructions ``triton_portable``'s kernels compile to, per GPU target.

Records the backend's launches (``tools.gpu_readiness.recorder``, no GPU needed) for a few
contracts (bf16 and fp32, with temperature and entropy, and the backward of role
``train``), compiles each kernel ahead of time for every target with
``enable_fp_fusion=False`` (as ``launch`` does for it), and
counts, in the PTX or AMDGCN, the instructions that could break the same-bits promise:
fused multiply-adds, approximate exp/log/reciprocal/division and flush-to-zero variants.
``--fusion`` compiles with fusion on instead (the control: the same kernels then hold
hundreds of fmas). See ``docs/tolerances.md``, "Portable exp and log", P4, for how to
read the AMD counts (the IEEE division's own correctly rounded sequence, and the exact
f32 -> i64 conversion).

``--loop`` prints the length of the fixed-point pass's column loop for ``triton_exact_sum``
and ``triton_portable`` on sm_90 (``docs/tolerances.md``, P5).

Run: python benchmarks/portable_instructions.py [--targets sm_90 gfx942] [--fusion] [--loop]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import re

import torch
import triton
from tools.gpu_readiness import aot, recorder
from triton.compiler import ASTSource

from tp_logprob.contract import LogprobInputKind

PATTERN = re.compile(
    r"\b(?:fma|mad)\.rn\.f(?:32|64)|\bmad\.f32|ex2\.approx\S*|lg2\.approx\S*|rcp\.approx\S*"
    r"|div\.full\S*|div\.approx\S*|\w+\.ftz\S*|sqrt\.approx\S*"
    r"|v_(?:fma|fmac|mad|mac|pk_fma)_f(?:32|64)|v_(?:exp|log|rcp|rsq|sqrt)_f(?:16|32|64)"
    r"|v_div_(?:scale|fmas|fixup)_f(?:32|64)"
)

DENORM_MODE = re.compile(r"\.amdhsa_float_denorm_mode_(\w+)\s+(\d)")


def launches(platform: str) -> dict[tuple[str, str], recorder.KernelLaunch]:
    layout = recorder.LAYOUTS["aligned"]
    base = recorder._base_contract(layout, 0, 0, LogprobInputKind.LOGITS)
    variants = [
        base,
        dataclasses.replace(base, export_entropy=True, temperature=0.7),
        dataclasses.replace(base, dtype="fp32", export_entropy=True, temperature=0.7),
        dataclasses.replace(base, role="train", export_entropy=True, temperature=0.7),
    ]
    chosen: dict[tuple[str, str], recorder.KernelLaunch] = {}
    for contract in variants:
        for launch in recorder._record_one(
            "triton_portable", platform, layout, contract, torch.int64
        ):
            key = (launch.kernel.__name__, repr(sorted(launch.constexprs)))
            chosen.setdefault(key, launch)
    return chosen


def count(target: str, fusion: bool) -> list[tuple[str, dict[str, int]]]:
    platform = "cuda" if target.startswith("sm_") else "rocm"
    rows = []
    for (name, _), launch in launches(platform).items():
        signature, values, attrs, options = aot._specialize(
            launch.kernel, launch.args, launch.constexprs, launch.num_warps, target
        )
        settings = {**options.__dict__, "enable_fp_fusion": fusion}
        compiled = triton.compile(
            ASTSource(launch.kernel, signature, values, attrs),
            target=aot._gpu_target(target),
            options=settings,
        )
        asm = compiled.asm.get("ptx") or compiled.asm["amdgcn"]
        found = collections.Counter(match.group(0) for match in PATTERN.finditer(asm))
        for mode in DENORM_MODE.finditer(asm):  # AMD: 3 keeps subnormal inputs and outputs
            found[f"denorm_mode_{mode.group(1)}={mode.group(2)}"] = 1
        flags = dict(launch.constexprs)
        label = f"{name} SCALE={flags.get('SCALE')} ENTROPY={flags.get('ENTROPY')}"
        rows.append((label, dict(sorted(found.items()))))
    return rows


def loop_length(backend: str, target: str = "sm_90") -> int:
    """PTX instructions in the column loop of ``backend``'s ``exact_sum_kernel`` (bf16, the
    aligned layout), compiled as it runs: the fixed-point pass's per-tile work."""
    layout = recorder.LAYOUTS["aligned"]
    base = recorder._base_contract(layout, 0, 0, LogprobInputKind.LOGITS)
    launch = next(
        item
        for item in recorder._record_one(backend, "cuda", layout, base, torch.int64)
        if item.kernel.__name__ == "exact_sum_kernel"
    )
    signature, values, attrs, options = aot._specialize(
        launch.kernel, launch.args, launch.constexprs, launch.num_warps, target
    )
    compiled = triton.compile(
        ASTSource(launch.kernel, signature, values, attrs),
        target=aot._gpu_target(target),
        options=options.__dict__,
    )
    lines = [line.strip() for line in compiled.asm["ptx"].splitlines()]
    header = next(i for i, line in enumerate(lines) if "Inner Loop Header" in line)
    label = lines[header].split(":")[0]
    end = next(i for i in range(header + 1, len(lines)) if lines[i].endswith(f"{label};"))
    body = lines[header + 1 : end + 1]
    return sum(1 for line in body if line and not line.startswith(("$", "//", ".", "{", "}")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="*", default=list(aot.TARGETS))
    parser.add_argument("--fusion", action="store_true", help="compile with fp fusion on")
    parser.add_argument("--loop", action="store_true", help="only the sum pass's loop length")
    args = parser.parse_args()
    if args.loop:
        for backend in ("triton_exact_sum", "triton_portable"):
            print(f"{backend}: {loop_length(backend)} PTX instructions in the sm_90 sum loop")
        return
    for target in args.targets:
        for label, found in count(target, args.fusion):
            print(f"{target:7} {label:50} {found or 'none'}")


if __name__ == "__main__":
    main()
