"""Static resources and code-quality facts of one compiled kernel, read from its artifacts.

:func:`analyze` reads a ``triton.compile`` result for NVIDIA (PTX, and the cubin
through ``cuobjdump -res-usage``, and its SASS ``STL`` stores when it uses local
memory) or AMD (the AMDGCN text and its metadata notes):

- registers per thread (NVIDIA ``REG``; AMD VGPRs, AGPRs included) and spills
  (NVIDIA local-memory store bytes in the SASS; AMD VGPR/SGPR spill counts and scratch bytes);
- shared memory the launch requests (``metadata.shared``);
- the widest global load in the *element code*: the loop bodies of a kernel with
  loops (a per-row kernel's column-tile loop), or the whole kernel when it has
  none (a one-tile-per-program kernel). 128 bits is ``ld.global.v4.b32`` in PTX
  (or a 16-byte ``cp.async`` global-to-shared copy, how ``tl.dot`` operands load
  there), ``global_load_dwordx4`` (or ``buffer_load_dwordx4``, the same
  width through AMD's buffer ops) in AMDGCN;
- fp64 instructions in loop bodies, and fp32 divisions in the element code by kind
  (PTX's IEEE ``div.rn.f32`` against the approximate ``div.full.f32``/``div.approx``);
- what in the whole kernel breaks cross-platform bits (:func:`.bitwise.findings`:
  approximate exp/log/rcp/div/sqrt, flushed subnormals, contractions), read from the
  same PTX or AMDGCN, for every kernel; the gate holds only the promised ones to it.

Loop bodies are the basic blocks LLVM's asm printer annotates as loop members
(``=>This Inner Loop Header`` / ``in Loop: Header=...`` on the block label, or, in
nested loops, on the comment lines right after it), in PTX and AMDGCN alike.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tools.gpu_readiness import bitwise

__all__ = ["Resources", "analyze", "element_lines", "loop_lines"]

_PTX_BLOCK = re.compile(r"^(?:\$L__BB\d+_\d+:|// %bb\.\d+:)")
_GCN_BLOCK = re.compile(r"^(?:\.LBB\d+_\d+:|; %bb\.\d+:)")
_FUNCTION_END = re.compile(r"^(?:\.Lfunc_end|\$L__func_end|\})")
_COMMENT_LINE = re.compile(r"^\s+(?://|;)")  # continues the annotation of the label above
_LOOP_MARKS = ("Loop Header", "in Loop:")
_PTX_LOAD = re.compile(r"\bld\.global((?:\.[\w:]+)*)\s")
_PTX_ASYNC_COPY = re.compile(r"\bcp\.async\.\w+\.shared\.global\b[^,]*,[^,]*,\s*(0x[0-9a-f]+|\d+)")
_GCN_LOAD = re.compile(r"^\s*(?:global|buffer)_load_(\w+)")
_GCN_LOAD_BITS = {
    "ubyte": 8, "sbyte": 8, "ushort": 16, "sshort": 16, "short_d16": 16, "short_d16_hi": 16,
    "dword": 32, "dwordx2": 64, "dwordx3": 96, "dwordx4": 128,
    "b8": 8, "u8": 8, "i8": 8, "b16": 16, "u16": 16, "i16": 16, "b32": 32, "b64": 64,
    "b96": 96, "b128": 128,
}  # fmt: skip
_PTX_OPCODE = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z][\w.:]*)")
_PTX_APPROX_DIV = re.compile(r"^div\.(?:full|approx)(?:\.ftz)?\.f32$")
_PTX_IEEE_DIV = re.compile(r"^div\.rn(?:\.ftz)?\.f32$")
_RES_USAGE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
_STL = re.compile(r"\bSTL((?:\.\w+)*)\s")


@dataclass(frozen=True)
class Resources:
    """What one compiled kernel uses and how its element code looks (see the module docstring)."""

    registers: int
    scalar_registers: int | None  # AMD SGPRs; None on NVIDIA
    spill_bytes: int
    spill_registers: int  # AMD VGPR + SGPR spill counts; 0 on NVIDIA
    shared_bytes: int
    widest_load_bits: int  # widest global load in the element code (0: none)
    fp64_in_loop: tuple[str, ...]  # the fp64 opcodes found in loop bodies
    approx_div_f32: int  # approximate fp32 divisions in the element code (NVIDIA)
    ieee_div_f32: int  # IEEE fp32 divisions in the element code (NVIDIA)
    bitwise_findings: tuple[str, ...]  # what breaks cross-platform bits (bitwise.findings)

    @property
    def vectorized(self) -> bool:
        return self.widest_load_bits >= 128

    @property
    def spills(self) -> bool:
        return self.spill_bytes > 0 or self.spill_registers > 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "vectorized": self.vectorized, "spills": self.spills}


def analyze(compiled: Any, target: str) -> Resources:
    """The :class:`Resources` of ``compiled`` (a ``triton.compile`` result) for ``target``."""
    code = compiled.asm["ptx"] if target.startswith("sm_") else compiled.asm["amdgcn"]
    found = bitwise.findings(
        code,
        target,
        asked_fma=bitwise.asks_for_fma(compiled.asm["ttir"]),
        fp_fusion=getattr(compiled.metadata, "enable_fp_fusion", None),
    )
    if target.startswith("sm_"):
        return _analyze_nvidia(compiled, found)
    return _analyze_amd(compiled, found)


def loop_lines(lines: list[str], block: re.Pattern[str]) -> list[str]:
    """Lines of the basic blocks LLVM marks as loop members (``block`` matches a block start)."""
    blocks: list[list[str]] = [[]]
    for line in lines:
        if block.match(line) or _FUNCTION_END.match(line):
            blocks.append([])
        blocks[-1].append(line)
    return [line for body in blocks if _in_loop(body, block) for line in body]


def _in_loop(body: list[str], block: re.Pattern[str]) -> bool:
    if not body or not block.match(body[0]):
        return False
    marks = [body[0], *itertools.takewhile(_COMMENT_LINE.match, body[1:])]
    return any(mark in line for line in marks for mark in _LOOP_MARKS)


def element_lines(lines: list[str], block: re.Pattern[str]) -> list[str]:
    """Loop bodies when the kernel has loops, else every line (one tile per program)."""
    return loop_lines(lines, block) or lines


def _analyze_nvidia(compiled: Any, bitwise_findings: tuple[str, ...]) -> Resources:
    ptx = compiled.asm["ptx"].splitlines()
    registers, stack, local = _res_usage(compiled.asm["cubin"], compiled.metadata.name)
    name = compiled.metadata.name
    spill = _local_store_bytes(compiled.asm["cubin"], name) if stack or local else 0
    element = element_lines(ptx, _PTX_BLOCK)
    opcodes = [found.group(1) for line in element if (found := _PTX_OPCODE.match(line))]
    loop_opcodes = [
        found.group(1) for line in loop_lines(ptx, _PTX_BLOCK) if (found := _PTX_OPCODE.match(line))
    ]
    return Resources(
        registers=registers,
        scalar_registers=None,
        spill_bytes=spill,
        spill_registers=0,
        shared_bytes=int(compiled.metadata.shared),
        widest_load_bits=max((_ptx_load_bits(line) for line in element), default=0),
        fp64_in_loop=tuple(sorted({op for op in loop_opcodes if ".f64" in op})),
        approx_div_f32=sum(bool(_PTX_APPROX_DIV.match(op)) for op in opcodes),
        ieee_div_f32=sum(bool(_PTX_IEEE_DIV.match(op)) for op in opcodes),
        bitwise_findings=bitwise_findings,
    )


def _analyze_amd(compiled: Any, bitwise_findings: tuple[str, ...]) -> Resources:
    text = compiled.asm["amdgcn"]
    lines = text.splitlines()
    notes = {key: int(value) for key, value in re.findall(r"^\s+\.(\w+):\s+(\d+)\s*$", text, re.M)}
    element = element_lines(lines, _GCN_BLOCK)
    loop_ops = [line.split()[0] for line in loop_lines(lines, _GCN_BLOCK) if line.strip()]
    widest = 0
    for line in element:
        found = _GCN_LOAD.match(line)
        if found:
            widest = max(widest, _GCN_LOAD_BITS.get(found.group(1), 0))
    return Resources(
        registers=notes.get("vgpr_count", 0) + notes.get("agpr_count", 0),
        scalar_registers=notes.get("sgpr_count"),
        spill_bytes=notes.get("private_segment_fixed_size", 0),
        spill_registers=notes.get("vgpr_spill_count", 0) + notes.get("sgpr_spill_count", 0),
        shared_bytes=int(compiled.metadata.shared),
        widest_load_bits=widest,
        fp64_in_loop=tuple(sorted({op for op in loop_ops if "f64" in op.split("_")})),
        approx_div_f32=0,
        ieee_div_f32=0,
        bitwise_findings=bitwise_findings,
    )


def _ptx_load_bits(line: str) -> int:
    copy = _PTX_ASYNC_COPY.search(line)
    if copy:
        return int(copy.group(1), 0) * 8
    found = _PTX_LOAD.search(line)
    if not found:
        return 0
    parts = found.group(1).split(".")
    lanes = next((int(part[1:]) for part in parts if re.fullmatch(r"v\d", part)), 1)
    width = next((int(part[1:]) for part in reversed(parts) if re.fullmatch(r"[bfsu]\d+", part)), 0)
    return lanes * width


def _cuobjdump(cubin: bytes, name: str, flag: str) -> str:
    from triton import knobs

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.cubin"
        path.write_bytes(cubin)
        return subprocess.run(
            [knobs.nvidia.cuobjdump.path, flag, str(path)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout


def _res_usage(cubin: bytes, name: str) -> tuple[int, int, int]:
    """``(registers, stack bytes, local bytes)`` from ``cuobjdump -res-usage``."""
    out = _cuobjdump(cubin, name, "-res-usage")
    found = _RES_USAGE.search(out)
    if found is None:
        raise RuntimeError(f"cuobjdump -res-usage printed no resource line for {name}:\n{out}")
    registers, stack, _, local = (int(value) for value in found.groups())
    return registers, stack, local


def _local_store_bytes(cubin: bytes, name: str) -> int:
    """Bytes stored to local memory (``STL``: register spills) in the cubin's SASS."""
    total = 0
    for suffix in _STL.findall(_cuobjdump(cubin, name, "-sass")):
        widths = [int(part) for part in re.findall(r"\d+", suffix)]
        total += max(widths, default=32) // 8
    return total
