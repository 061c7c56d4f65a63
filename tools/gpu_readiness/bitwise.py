"""The instruction gate for kernels that promise the same bits on every platform.

A kernel launched for a ``cross_platform_bitwise`` contract may use only operations
IEEE 754 rounds correctly everywhere (``+ - * /``, ``sqrt``, ``fma``), in the order
its source wrote them, on unflushed subnormals. :func:`findings` reads one compiled
kernel's code (PTX for NVIDIA, AMDGCN for AMD, the artifacts the compile matrix
already has) and names every instruction that breaks that promise, by the rule
table of its target (:data:`RULES`); docs/gpu-readiness.md prints the same tables.

NVIDIA is judged on the PTX, the contract ptxas honours: ``div.rn``, ``sqrt.rn`` and
``rcp.rn`` are correctly rounded by the PTX ISA, and ptxas expands them into SASS
with ``MUFU.RCP``, ``FFMA`` and ``.FTZ`` compares of its own (correct by
construction), so the SASS cannot be held to the same table. AMDGCN is the final
ISA: LLVM's correctly rounded f32 division (``v_div_scale``, one ``v_rcp_f32`` seed,
five fmas, ``v_div_fmas``, ``v_div_fixup``) and square root (``v_sqrt_f32`` and two
residual fmas) use the approximate instructions as seeds, so :func:`findings`
accounts for them: one ``v_rcp_f32`` per ``v_div_fixup_f32``, and exactly the
expansions' fmas when the source asked for none (at least them when it did).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["GCN_RULES", "PTX_RULES", "RULES", "Rule", "asks_for_fma", "findings", "opcodes"]


def _none(counts: Counter[str]) -> int:
    return 0


def _division_seeds(counts: Counter[str]) -> int:
    return counts["v_div_fixup_f32"]


def _division_seeds_f64(counts: Counter[str]) -> int:
    return counts["v_div_fixup_f64"]


def _expansion_fmas(counts: Counter[str]) -> int:
    return _ieee_fmas(counts) + counts[_EXACT_REMAINDERS] + counts[_UNIT_PRODUCTS]


def _expansion_fmas_f64(counts: Counter[str]) -> int:
    return _DIVISION_FMAS * counts["v_div_fixup_f64"]


@dataclass(frozen=True)
class Rule:
    """Instructions (``opcode`` matches the opcode) that break cross-platform bits, and why.

    ``unless_asked``: allowed when the source itself asked for a fused multiply-add
    (``tl.fma``), since the compiler cannot then be told apart from the source.
    ``allowed``: how many of the matched instructions the kernel's correctly rounded
    expansions account for, given every opcode's count.
    """

    name: str
    opcode: re.Pattern[str]
    why: str
    unless_asked: bool = False
    allowed: Callable[[Counter[str]], int] = _none  # how many the kernel's IEEE expansions use

    def __post_init__(self) -> None:
        if not self.why:
            raise ValueError(f"Rule(name={self.name!r}).why is empty: say why it breaks bits")


_FLOAT = r"(?:f16|f16x2|bf16|bf16x2|f32|f64)"
PTX_RULES: tuple[Rule, ...] = (
    Rule(
        "approximate transcendental",
        re.compile(r"^(?:ex2|lg2|sin|cos|tanh)\.approx\b"),
        "MUFU (special-function unit) approximations of 2^x, log2 and the trigonometric "
        "functions: about 2 ulp, NVIDIA's own rounding; AMD's v_exp_f32 and a CPU libm "
        "round elsewhere",
    ),
    Rule(
        "approximate reciprocal, division or square root",
        re.compile(r"^(?:(?:rcp|rsqrt|sqrt)\.approx|div\.(?:approx|full))\b"),
        "1-2 ulp approximations (div.full is x * rcp.approx(y)); IEEE div.rn, sqrt.rn and "
        "rcp.rn are correctly rounded, the same bits on every conforming unit",
    ),
    Rule(
        "flush to zero",
        re.compile(r"\.ftz\b"),
        ".ftz flushes subnormal inputs and results to zero, which IEEE 754 and the CPU "
        "(and AMD with f32 denormals on) keep",
    ),
    Rule(
        "unrounded add or multiply",
        re.compile(rf"^(?:add|sub|mul)(?:\.sat)?\.{_FLOAT}$"),
        "without a rounding modifier (.rn) ptxas may fuse a mul and an add into an FFMA "
        "(PTX ISA: mul/add with no rounding modifier may be optimized aggressively); the "
        "source's a*b+c rounds twice, the FFMA once. Triton writes .rn with "
        "enable_fp_fusion=False",
    ),
    Rule(
        "fused multiply-add the source did not ask for",
        re.compile(rf"^(?:fma|mad)(?:\.(?:rn|rz|rm|rp|sat|relu))*\.{_FLOAT}$"),
        "fma rounds a*b+c once where the source's a*b+c rounds twice: the compiler's "
        "contraction (Triton's enable_fp_fusion, on by default) is its own choice and "
        "differs between compilers; only a tl.fma the source wrote is the same everywhere",
        unless_asked=True,
    ),
)

GCN_RULES: tuple[Rule, ...] = (
    Rule(
        "approximate exp or log",
        re.compile(r"^v_(?:exp|log)(?:_legacy)?_f(?:16|32)$"),
        "the transcendental unit's 2^x and log2: about 1 ulp, AMD's own rounding, and f32 "
        "subnormal results flushed; NVIDIA's ex2.approx and a CPU libm round elsewhere",
    ),
    Rule(
        "approximate reciprocal square root",
        re.compile(r"^v_rsq(?:_clamp|_legacy)?_f(?:16|32|64)$"),
        "a 1-ulp approximation with no IEEE expansion around it",
    ),
    Rule(
        "approximate reciprocal",
        re.compile(r"^v_rcp(?:_legacy)?_f(?:16|32)$"),
        "a 1-ulp approximation; allowed only as the seed of LLVM's correctly rounded "
        "division, one per v_div_fixup_f32 (v_rcp_iflag_f32, integer division's seed, is "
        "exact after its integer correction and not matched)",
        allowed=_division_seeds,
    ),
    Rule(
        "approximate reciprocal (f64)",
        re.compile(r"^v_rcp(?:_legacy)?_f64$"),
        "as for f32: allowed only as the seed of a correctly rounded f64 division, one per "
        "v_div_fixup_f64",
        allowed=_division_seeds_f64,
    ),
    Rule(
        "unfused multiply-add",
        re.compile(r"^v_(?:mad|mac)(?:_legacy)?_f(?:16|32)$"),
        "v_mad_f32/v_mac_f32 round the product and flush f32 subnormals: neither IEEE "
        "a*b+c nor fma",
    ),
    Rule(
        "fused multiply-add the source did not ask for",
        re.compile(r"^v_(?:pk_)?(?:fmac?|fma_mix(?:lo|hi)?|mad_mix(?:lo|hi)?)_(?:f16|bf16|f32)$"),
        "the compiler's contraction of a*b+c (rounds once where the source rounds twice); "
        "beyond the fmas of the correctly rounded division (five per v_div_fixup_f32), "
        "square root (two residuals per v_sqrt_f32) and f32 -> 64-bit integer conversion "
        "(one v_fma_f32 by -2^32 per conversion, whose remainder is exact), and an f32 fma "
        "with a multiplicand of 1.0 or -1.0 (the product is exact, so it rounds as the "
        "source's add: LLVM folds an f16 -> f32 conversion into such a v_fma_mix_f32), only "
        "a tl.fma the source wrote is the same everywhere",
        unless_asked=True,
        allowed=_expansion_fmas,
    ),
    Rule(
        "fused multiply-add the source did not ask for (f64)",
        re.compile(r"^v_fmac?_f64$"),
        "as for f32, beyond the five fmas of each correctly rounded f64 division (v_div_fixup_f64)",
        unless_asked=True,
        allowed=_expansion_fmas_f64,
    ),
    Rule(
        "denormal mode",
        re.compile(r"^(?:s_denorm_mode|s_setreg(?:_imm32)?_b32)$"),
        "switches the float mode mid-kernel (f32 subnormals flushed where the CPU and "
        "NVIDIA's .rn keep them)",
    ),
)

RULES: dict[str, tuple[Rule, ...]] = {
    "sm_80": PTX_RULES,
    "sm_90": PTX_RULES,
    "sm_100": PTX_RULES,
    "gfx942": GCN_RULES,
    "gfx950": GCN_RULES,
}
"""One rule table per compile target (``tools.gpu_readiness.aot.TARGETS``)."""

_PTX_OPCODE = re.compile(r"^\s+(?:@!?%p\d+\s+)?([a-z][\w.:]*)")
_GCN_OPCODE = re.compile(r"^\s+([vs]_\w+)")
_GCN_ENCODING = re.compile(r"_(?:e32|e64|sdwa|dpp|vop3)$")
_GCN_DENORM_MODE = re.compile(r"^\s*\.amdhsa_float_denorm_mode_(\w+)\s+(\d+)", re.M)
_GCN_KEEP_DENORMS = 3
_EXACT_REMAINDERS = "(f32 -> i64 remainder fmas)"  # a count findings() adds, not an opcode
_UNIT_PRODUCTS = "(f32 fmas by +-1.0)"  # likewise: fmas whose product is exact
_GCN_F32_FMA_LINE = re.compile(r"^\s+(v_fma(?:c|_mix)?_f32)(?:_e32|_e64)?\s+(.*)$", re.M)
_UNIT_PLAIN = "(v_fma_f32 and v_fmac_f32 by +-1.0)"  # of them, those _fma_count counts
_MINUS_2_32 = "0xcf800000"  # -2^32 in f32: LLVM's f32 -> i64 takes x - floor(x 2^-32) 2^32
_GCN_SCALAR_CONSTANT = re.compile(r"^\s+s_mov_b32\s+(s\d+),\s*(0x[0-9a-f]+)\s*$", re.M)
_GCN_FMA_F32 = re.compile(
    r"^\s+v_fma_f32\s+(.*)$", re.M
)  # the kernel descriptor's "preserve input and output denormals"
_DIVISION_FMAS = 5  # LLVM's correctly rounded f32 division: 3 v_fma_f32 + 2 v_fmac_f32
_SQRT_FMAS = 2  # LLVM's correctly rounded f32 sqrt: v_sqrt_f32 and two residual fmas


def opcodes(asm: str, target: str) -> list[str]:
    """The instruction opcodes of ``asm`` (PTX for ``sm_*``, AMDGCN for ``gfx*``)."""
    if target.startswith("sm_"):
        return [found.group(1) for line in asm.splitlines() if (found := _PTX_OPCODE.match(line))]
    return [
        _GCN_ENCODING.sub("", found.group(1))
        for line in asm.splitlines()
        if (found := _GCN_OPCODE.match(line))
    ]


def asks_for_fma(ttir: str) -> bool:
    """Whether the kernel's source asked for a fused multiply-add (``tl.fma``: ``math.fma``)."""
    return "math.fma" in ttir


def findings(
    asm: str, target: str, *, asked_fma: bool, fp_fusion: bool | None = None
) -> tuple[str, ...]:
    """What in ``asm`` (one kernel, compiled for ``target``) breaks cross-platform bits.

    One line per rule broken: the rule, the opcodes and counts. ``asked_fma``: the
    source wrote ``tl.fma`` (:func:`asks_for_fma`); ``fp_fusion``: the compile's
    ``enable_fp_fusion``, which must be off beside an fma the source asked for, or the
    compiler's contractions could not be told from the source's.
    """
    if target not in RULES:
        raise ValueError(f"target={target!r}: no rule table; expected one of {sorted(RULES)}")
    counts = Counter(opcodes(asm, target))
    if target.startswith("gfx"):
        counts[_EXACT_REMAINDERS] = _exact_remainder_fmas(asm)
        unit = _unit_product_fmas(asm)
        counts[_UNIT_PRODUCTS] = sum(unit.values())
        counts[_UNIT_PLAIN] = unit["v_fma_f32"] + unit["v_fmac_f32"]
    out = []
    for rule in RULES[target]:
        if rule.unless_asked and asked_fma:
            continue
        matched = {op: n for op, n in sorted(counts.items()) if rule.opcode.search(op)}
        excess = sum(matched.values()) - rule.allowed(counts)
        if matched and excess > 0:
            listed = ", ".join(f"{op} x{n}" for op, n in matched.items())
            beyond = f" ({excess} beyond the IEEE expansions')" if rule.allowed(counts) else ""
            out.append(f"{rule.name}: {listed}{beyond}")
    if target.startswith("gfx"):
        out += _gcn_incomplete_expansions(counts) + _gcn_denormal_modes(asm)
    if asked_fma and fp_fusion:
        out.append(
            "fp fusion beside tl.fma: the source asks for fma and the compile has "
            "enable_fp_fusion=True, so the compiler's contractions cannot be told apart"
        )
    return tuple(out)


def _gcn_incomplete_expansions(counts: Counter[str]) -> list[str]:
    """A division or square root short of its fmas was approximated, not correctly rounded."""
    needed = _ieee_fmas(counts)
    fmas = _fma_count(counts) - counts[_EXACT_REMAINDERS] - counts[_UNIT_PLAIN]
    out = []
    if fmas < needed:
        out.append(
            f"incomplete IEEE expansion: {fmas} fmas where {counts['v_div_fixup_f32']} "
            f"correctly rounded division(s) and {counts['v_sqrt_f32']} square root(s) need "
            f"{needed} (an approximate v_sqrt_f32 or division)"
        )
    wide = counts["v_fma_f64"] + counts["v_fmac_f64"]
    if wide < _expansion_fmas_f64(counts):
        out.append(
            f"incomplete IEEE expansion: {wide} f64 fmas where {counts['v_div_fixup_f64']} "
            f"correctly rounded f64 division(s) need {_expansion_fmas_f64(counts)}"
        )
    return out


def _exact_remainder_fmas(asm: str) -> int:
    """The v_fma_f32 by -2^32 (a literal, or a scalar register set to it) of LLVM's
    f32 -> 64-bit integer conversion: ``x - floor(x 2^-32) 2^32`` is exact."""
    holders = {reg for reg, value in _GCN_SCALAR_CONSTANT.findall(asm) if value == _MINUS_2_32}
    count = 0
    for operands in _GCN_FMA_F32.findall(asm):
        parts = {part.strip().lstrip("-") for part in operands.split(",")}
        count += bool(parts & (holders | {_MINUS_2_32}))
    return count


def _unit_product_fmas(asm: str) -> Counter[str]:
    """Per opcode, the f32-result fmas (``v_fma_f32``, ``v_fmac_f32``, ``v_fma_mix_f32``)
    one of whose multiplicands is the literal 1.0 or -1.0: ``fma(a, +-1, c)`` rounds
    ``+-a + c`` once, exactly as the add it stands for (f16 sources convert exactly).
    An f16-result ``v_fma_mixlo_f16`` is not among them: it rounds to f16 once where the
    source rounds to f32 and then to f16."""
    found: Counter[str] = Counter()
    for opcode, operands in _GCN_F32_FMA_LINE.findall(asm):
        parts = [part.strip() for part in operands.split(" op_sel")[0].split(",")]
        multiplicands = parts[1:3]  # after the destination, in every one of the three
        if any(source.lstrip("-|").rstrip("|") == "1.0" for source in multiplicands):
            found[opcode] += 1
    return found


def _ieee_fmas(counts: Counter[str]) -> int:
    """The fmas of the correctly rounded f32 divisions and square roots in ``counts``."""
    return _DIVISION_FMAS * counts["v_div_fixup_f32"] + _SQRT_FMAS * counts["v_sqrt_f32"]


def _fma_count(counts: Counter[str]) -> int:
    return counts["v_fma_f32"] + counts["v_fmac_f32"] + counts["v_pk_fma_f32"]


def _gcn_denormal_modes(asm: str) -> list[str]:
    flushed = [
        f"{kind}={value}"
        for kind, value in _GCN_DENORM_MODE.findall(asm)
        if int(value) != _GCN_KEEP_DENORMS
    ]
    if not flushed:
        return []
    modes = ", ".join(f".amdhsa_float_denorm_mode_{mode}" for mode in flushed)
    return [f"denormals flushed: {modes} (3 keeps them)"]
