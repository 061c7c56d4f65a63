"""The cross-platform-bits instruction gate: its rule tables, on recorded code and on real compiles.

The fast tests read code recorded from ``triton.compile`` (Triton 3.9) of the gate's
probe kernels (``tools.gpu_readiness.probes``); the slow test compiles the probes for
one NVIDIA and one AMD target in a subprocess without ``TRITON_INTERPRET``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

bitwise = pytest.importorskip("tools.gpu_readiness.bitwise")
aot = pytest.importorskip("tools.gpu_readiness.aot")
resources = pytest.importorskip("tools.gpu_readiness.resources")

ROOT = Path(__file__).resolve().parents[2]

# vendor_math_probe_kernel, sm_90, fp fusion on: exp(x * y + z) / z
_PTX_VENDOR = """\
\tld.global.b32 { %r1 }, [ %rd1 + 0 ];
\tfma.rn.f32 \t%r7, %r1, %r3, %r5;
\tmul.f32 \t%r9, %r7, 0f3FB8AA3B;
\tex2.approx.f32 %r10, %r9;
\tdiv.full.f32 \t%r11, %r10, %r5;
\t@%p1 st.global.b32 [ %rd4 + 0 ], { %r11 };
\tret;
"""
# ieee_probe_kernel, sm_90, fp fusion off: div_rn(x * y + z, z) + sqrt_rn(x)
_PTX_IEEE = """\
\tmul.rn.f32 \t%r7, %r1, %r3;
\tadd.rn.f32 \t%r8, %r7, %r5;
\tdiv.rn.f32 \t%r9, %r8, %r5;
\tsqrt.rn.f32 \t%r10, %r1;
\tadd.rn.f32 \t%r11, %r9, %r10;
\tmad.lo.s32 \t%r12, %r13, %r14, %r15;
\tret;
"""
# LLVM's correctly rounded f32 division on gfx942: one v_rcp_f32 seed, five fmas
_GCN_DIVISION = """\
\tv_div_scale_f32 v2, s[0:1], v3, v3, v1
\tv_rcp_f32_e32 v4, v2
\tv_div_scale_f32 v5, vcc, v1, v3, v1
\tv_fma_f32 v6, -v2, v4, 1.0
\tv_fmac_f32_e32 v4, v6, v4
\tv_mul_f32_e32 v6, v5, v4
\tv_fma_f32 v7, -v2, v6, v5
\tv_fmac_f32_e32 v6, v7, v4
\tv_fma_f32 v2, -v2, v6, v5
\tv_div_fmas_f32 v2, v2, v4, v6
\tv_div_fixup_f32 v1, v2, v3, v1
"""
# and its square root: v_sqrt_f32 with two residual fmas
_GCN_SQRT = """\
\tv_sqrt_f32_e32 v8, v1
\tv_add_u32_e32 v9, -1, v8
\tv_fma_f32 v10, -v9, v8, v1
\tv_add_u32_e32 v11, 1, v8
\tv_fma_f32 v12, -v11, v8, v1
\tv_cmp_class_f32_e32 vcc, v1, 0x260
"""
_GCN_DESCRIPTOR = "\t\t.amdhsa_float_denorm_mode_32 3\n\t\t.amdhsa_float_denorm_mode_16_64 3\n"
# vendor_math_probe_kernel, gfx942, fp fusion on
_GCN_VENDOR = (
    "\tv_fma_f32 v1, v1, v2, v3\n\tv_mul_f32_e32 v1, 0x3fb8aa3b, v1\n\tv_exp_f32_e32 v1, v1\n"
    + _GCN_DIVISION
    + _GCN_DESCRIPTOR
)
_GCN_IEEE = "\tv_mul_f32_e32 v1, v1, v2\n\tv_add_f32_e32 v1, v1, v3\n" + _GCN_DIVISION
_GCN_IEEE += _GCN_SQRT + _GCN_DESCRIPTOR


def _rules(found: tuple[str, ...]) -> set[str]:
    return {line.split(":", 1)[0] for line in found}


def test_every_target_has_a_rule_table_that_says_why() -> None:
    assert set(bitwise.RULES) == set(aot.TARGETS)
    for rules in bitwise.RULES.values():
        assert all(rule.why for rule in rules)
        assert any(rule.unless_asked for rule in rules)
    with pytest.raises(ValueError, match=r"why is empty"):
        bitwise.Rule("x", bitwise.re.compile("x"), "")


def test_ptx_vendor_math_and_contraction_are_found() -> None:
    found = bitwise.findings(_PTX_VENDOR, "sm_90", asked_fma=False)
    assert _rules(found) == {
        "approximate transcendental",
        "approximate reciprocal, division or square root",
        "unrounded add or multiply",
        "fused multiply-add the source did not ask for",
    }
    assert "ex2.approx.f32 x1" in "; ".join(found)


def test_ptx_correctly_rounded_code_passes() -> None:
    for target in ("sm_80", "sm_90", "sm_100"):
        assert bitwise.findings(_PTX_IEEE, target, asked_fma=False) == ()


@pytest.mark.parametrize(
    ("line", "rule"),
    [
        ("\tadd.rn.ftz.f32 %r1, %r2, %r3;", "flush to zero"),
        ("\tcvt.ftz.f32.f16 %r1, %rs1;", "flush to zero"),
        (
            "\t@%p1 rcp.approx.ftz.f64 %fd1, %fd2;",
            "approximate reciprocal, division or square root",
        ),
        ("\tsqrt.approx.f32 %r1, %r2;", "approximate reciprocal, division or square root"),
        ("\tlg2.approx.f32 %r1, %r2;", "approximate transcendental"),
        ("\tfma.rn.bf16x2 %r1, %r2, %r3, %r4;", "fused multiply-add the source did not ask for"),
        ("\tsub.f64 %fd1, %fd2, %fd3;", "unrounded add or multiply"),
    ],
    ids=["ftz-add", "ftz-cvt", "rcp-approx", "sqrt-approx", "lg2", "fma-bf16x2", "sub-f64"],
)
def test_ptx_rules_one_line(line: str, rule: str) -> None:
    assert rule in _rules(bitwise.findings(line, "sm_80", asked_fma=False))


def test_an_fma_the_source_asked_for_is_allowed_but_not_beside_fp_fusion() -> None:
    line = "\tfma.rn.f32 %r1, %r2, %r3, %r4;\n"
    assert bitwise.findings(line, "sm_90", asked_fma=True, fp_fusion=False) == ()
    found = bitwise.findings(line, "sm_90", asked_fma=True, fp_fusion=True)
    assert _rules(found) == {"fp fusion beside tl.fma"}
    assert bitwise.asks_for_fma("%3 = math.fma %0, %1, %2 : tensor<256xf32>")
    assert not bitwise.asks_for_fma("%3 = arith.mulf %0, %1 : tensor<256xf32>")


def test_amdgcn_vendor_math_and_contraction_are_found() -> None:
    found = bitwise.findings(_GCN_VENDOR, "gfx942", asked_fma=False)
    assert _rules(found) == {
        "approximate exp or log",
        "fused multiply-add the source did not ask for",
    }
    assert "(1 beyond the IEEE expansions')" in "; ".join(found)


def test_amdgcn_correctly_rounded_division_and_sqrt_pass() -> None:
    for target in ("gfx942", "gfx950"):
        assert bitwise.findings(_GCN_IEEE, target, asked_fma=False) == ()


def test_amdgcn_seeds_beyond_the_expansions_are_found() -> None:
    extra_rcp = _GCN_IEEE + "\tv_rcp_f32_e32 v20, v21\n"
    assert _rules(bitwise.findings(extra_rcp, "gfx950", asked_fma=False)) == {
        "approximate reciprocal"
    }
    bare_sqrt = "\tv_sqrt_f32_e32 v1, v2\n" + _GCN_DESCRIPTOR
    found = bitwise.findings(bare_sqrt, "gfx942", asked_fma=True)
    assert _rules(found) == {"incomplete IEEE expansion"}
    integer_division = "\tv_cvt_f32_u32_e32 v1, s2\n\tv_rcp_iflag_f32_e32 v1, v1\n"
    assert bitwise.findings(integer_division, "gfx942", asked_fma=False) == ()


@pytest.mark.parametrize(
    ("code", "rule"),
    [
        ("\tv_log_f32_e32 v1, v2\n", "approximate exp or log"),
        ("\tv_rsq_f32_e32 v1, v2\n", "approximate reciprocal square root"),
        ("\tv_mac_f32_e32 v1, v2, v3\n", "unfused multiply-add"),
        (
            "\tv_pk_fma_f32 v[0:1], v[2:3], v[4:5], v[6:7]\n",
            "fused multiply-add the source did not ask for",
        ),
        ("\ts_denorm_mode 0\n", "denormal mode"),
        ("\t\t.amdhsa_float_denorm_mode_32 0\n", "denormals flushed"),
    ],
    ids=["log", "rsq", "mac", "pk-fma", "s_denorm_mode", "descriptor"],
)
def test_amdgcn_rules_one_line(code: str, rule: str) -> None:
    assert rule in _rules(bitwise.findings(code, "gfx950", asked_fma=False))


def test_unknown_target_is_refused() -> None:
    with pytest.raises(ValueError, match=r"target='sm_70': no rule table"):
        bitwise.findings("", "sm_70", asked_fma=False)


def _row(kernel: str, target: str, found: tuple[str, ...], **fields: Any) -> Any:
    res = resources.Resources(32, None, 0, 0, 0, 128, (), 0, 0, found)
    base = aot.CompiledLaunch(
        kernel, target, "aligned", "fp32", "defaults", "b", False, False, False, 4, 256, res, None
    )
    return replace(base, **fields)


def test_gate_holds_promised_launches_and_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aot, "bitwise_backends", lambda platform: ())  # coverage: below
    ok = _row("k", "sm_90", ())
    broken = _row("k", "gfx942", ("approximate exp or log: v_exp_f32 x1",))
    assert aot.gate_failures([ok, broken]) == []  # nothing promised: not gated
    failures = aot.gate_failures([replace(broken, promises_bits=True)])
    assert failures and failures[0].startswith(f"{aot.BITWISE_GATE}: k on gfx942")
    probe = {"backend": aot.PROBE_BACKEND, "promises_bits": True}
    blind = _row("vendor_math_probe_kernel", "sm_90", (), **probe)
    assert "the gate is blind here" in aot.gate_failures([blind])[0]
    flagged = _row("ieee_probe_kernel", "gfx950", ("denormal mode: s_denorm_mode x1",), **probe)
    assert "the IEEE probe is flagged" in aot.gate_failures([flagged])[0]
    seen = (
        "approximate exp or log: v_exp_f32 x1",
        "fused multiply-add the source did not ask for: x",
    )
    assert aot.gate_failures([_row("vendor_math_probe_kernel", "gfx942", seen, **probe)]) == []


def test_backends_claiming_the_scope_are_looked_up_by_capability() -> None:
    import tp_logprob as tpl

    for platform in ("cuda", "rocm"):
        claimed = {
            capability.backend_id
            for capability in tpl.registry.backends(platform)
            if platform in capability.bitwise_platforms
        }
        assert set(aot.bitwise_backends(platform)) == claimed


_COMPILE_PROBES = """\
import json
from tools.gpu_readiness import aot
out = {}
for platform, target in (("cuda", "sm_90"), ("rocm", "gfx942")):
    for launch in aot._probe_launches(platform):
        resources, error = aot._compile(aot._job(launch, target))
        out[f"{launch.name} {target}"] = error or list(resources.bitwise_findings)
print(json.dumps(out))
"""


@pytest.mark.slow
def test_probes_compiled_for_nvidia_and_amd_are_judged_as_they_must_be() -> None:
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", _COMPILE_PROBES],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.splitlines()[-1])
    assert found["ieee_probe_kernel sm_90"] == []
    assert found["ieee_probe_kernel gfx942"] == []
    assert _rules(tuple(found["vendor_math_probe_kernel sm_90"])) >= {
        "approximate transcendental",
        "fused multiply-add the source did not ask for",
    }
    assert _rules(tuple(found["vendor_math_probe_kernel gfx942"])) >= {
        "approximate exp or log",
        "fused multiply-add the source did not ask for",
    }


def test_readiness_doc_prints_the_rule_tables_from_the_code() -> None:
    readiness = pytest.importorskip("tools.gpu_readiness.readiness")
    doc = (ROOT / "docs" / "gpu-readiness.md").read_text()
    assert readiness.bitwise_rules_markdown() in doc


def test_a_triton_backend_claiming_the_scope_must_be_compiled_under_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder = pytest.importorskip("tools.gpu_readiness.recorder")
    monkeypatch.setattr(aot, "bitwise_backends", lambda platform: ("portable", "torch_portable"))
    monkeypatch.setattr(recorder, "triton_backends", lambda platform: ("portable",))
    plain = _row("k", "sm_90", (), backend="portable")
    failures = aot.gate_failures([plain])
    assert failures == [
        f"{aot.BITWISE_GATE}: portable claims cross_platform_bitwise on cuda but no launch of "
        "it was recorded under that scope for sm_90"
    ]  # torch_portable launches no Triton kernel: not asked for
    assert aot.gate_failures([replace(plain, promises_bits=True)]) == []


# gfx942, triton_portable's exact_sum_kernel: LLVM's f32 -> i64 conversion of a column's
# fixed-point value, x - floor(x 2^-32) 2^32, an exact fma by -2^32 held in s55
_GCN_F32_TO_I64 = """\
\ts_mov_b32 s53, 0x2f800000
\ts_mov_b32 s55, 0xcf800000
\tv_trunc_f32_e32 v13, v15
\tv_mul_f32_e64 v21, |v13|, s53
\tv_floor_f32_e32 v21, v21
\tv_fma_f32 v13, v21, s55, |v13|
\tv_cvt_u32_f32_e32 v13, v13
"""
# and its merge's fp64 division
_GCN_F64_DIVISION = """\
\tv_div_scale_f64 v[4:5], s[0:1], v[2:3], v[2:3], v[0:1]
\tv_rcp_f64_e32 v[6:7], v[4:5]
\tv_fma_f64 v[8:9], -v[4:5], v[6:7], 1.0
\tv_fmac_f64_e32 v[6:7], v[6:7], v[8:9]
\tv_fma_f64 v[8:9], -v[4:5], v[6:7], 1.0
\tv_fmac_f64_e32 v[6:7], v[6:7], v[8:9]
\tv_div_scale_f64 v[8:9], vcc, v[0:1], v[2:3], v[0:1]
\tv_mul_f64 v[10:11], v[8:9], v[6:7]
\tv_fma_f64 v[4:5], -v[4:5], v[10:11], v[8:9]
\tv_div_fmas_f64 v[4:5], v[4:5], v[6:7], v[10:11]
\tv_div_fixup_f64 v[0:1], v[4:5], v[2:3], v[0:1]
"""


def test_amdgcn_exact_conversion_and_f64_division_pass() -> None:
    code = _GCN_F32_TO_I64 + _GCN_F64_DIVISION + _GCN_DESCRIPTOR
    assert bitwise.findings(code, "gfx942", asked_fma=False) == ()
    other = code.replace("v_fma_f32 v13, v21, s55", "v_fma_f32 v13, v21, s53")
    assert _rules(bitwise.findings(other, "gfx942", asked_fma=False)) == {
        "fused multiply-add the source did not ask for"
    }
    extra = code + "\tv_fma_f64 v[0:1], v[2:3], v[4:5], v[6:7]\n\tv_rcp_f64_e32 v[0:1], v[2:3]\n"
    assert _rules(bitwise.findings(extra, "gfx950", asked_fma=False)) == {
        "approximate reciprocal (f64)",
        "fused multiply-add the source did not ask for (f64)",
    }
    short = code.replace("\tv_fmac_f64_e32 v[6:7], v[6:7], v[8:9]\n", "", 1)
    assert "incomplete IEEE expansion" in _rules(bitwise.findings(short, "gfx942", asked_fma=False))


def test_amdgcn_fma_by_one_is_the_add_it_stands_for() -> None:
    """LLVM folds ``fp32(x_f16) - s`` into ``v_fma_mix_f32 d, -s, 1.0, x``: one rounding of an
    exact product, the add's bits; by any other multiplier, or rounded to f16, it is not."""
    by_one = "\tv_fma_mix_f32 v11, -s4, 1.0, v5 op_sel_hi:[0,1,1]\n" + _GCN_DESCRIPTOR
    assert bitwise.findings(by_one, "gfx942", asked_fma=False) == ()
    plain = "\tv_fma_f32 v1, v2, -1.0, v3\n\tv_fmac_f32_e32 v1, 1.0, v3\n" + _GCN_DESCRIPTOR
    assert bitwise.findings(plain, "gfx950", asked_fma=False) == ()
    for other in (
        by_one.replace("1.0", "2.0"),
        by_one.replace("v_fma_mix_f32", "v_fma_mixlo_f16"),
        by_one.replace("v_fma_mix_f32 v11, -s4, 1.0, v5", "v_fma_mix_f32 v11, -s4, v6, 1.0"),
    ):
        found = bitwise.findings(other, "gfx942", asked_fma=False)
        assert _rules(found) == {"fused multiply-add the source did not ask for"}, other
