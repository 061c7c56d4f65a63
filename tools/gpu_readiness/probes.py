"""Two kernels that keep the cross-platform-bits gate honest on every target.

Both compute ``(x * y + z) / z`` on fp32. :func:`vendor_math_probe_kernel` takes
``exp`` of it and is compiled with Triton's default fp fusion: the gate must find its
approximate ``exp`` and the contracted ``x * y + z`` on every target (if it does not,
the gate is blind there). :func:`ieee_probe_kernel` uses only correctly rounded
operations (``div_rn``, ``sqrt_rn``) and is compiled with ``enable_fp_fusion=False``:
the gate must find nothing. The compile matrix compiles both for every target beside
the backends' kernels (:func:`probe_launches`), a few tiny compiles.
"""

# The kernels are @triton.jit source, typed by Triton rather than by annotations.
# mypy: disable-error-code="untyped-decorator, no-untyped-def"

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

__all__ = [
    "PROBES",
    "PROBE_BLOCK",
    "PROBE_WARPS",
    "Probe",
    "ieee_probe_kernel",
    "probe_args",
    "vendor_math_probe_kernel",
]


@triton.jit
def vendor_math_probe_kernel(x_ptr, y_ptr, z_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = offsets < n
    x = tl.load(x_ptr + offsets, mask=live)
    y = tl.load(y_ptr + offsets, mask=live)
    z = tl.load(z_ptr + offsets, mask=live)
    tl.store(out_ptr + offsets, tl.exp(x * y + z) / z, mask=live)


@triton.jit
def ieee_probe_kernel(x_ptr, y_ptr, z_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = offsets < n
    x = tl.load(x_ptr + offsets, mask=live)
    y = tl.load(y_ptr + offsets, mask=live)
    z = tl.load(z_ptr + offsets, mask=live)
    tl.store(out_ptr + offsets, tl.div_rn(x * y + z, z) + tl.sqrt_rn(x), mask=live)


@dataclass(frozen=True)
class Probe:
    """A probe kernel, the fp fusion it is compiled with, and the rules it must break."""

    kernel: Any  # the @triton.jit function
    fp_fusion: bool
    must_break: dict[str, tuple[str, ...]]  # target kind ("sm", "gfx") -> rule names

    @property
    def name(self) -> str:
        return str(getattr(self.kernel, "__name__", self.kernel))


PROBES: tuple[Probe, ...] = (
    Probe(
        vendor_math_probe_kernel,
        True,
        {
            "sm": ("approximate transcendental", "fused multiply-add the source did not ask for"),
            "gfx": ("approximate exp or log", "fused multiply-add the source did not ask for"),
        },
    ),
    Probe(ieee_probe_kernel, False, {"sm": (), "gfx": ()}),
)

PROBE_BLOCK = 256
PROBE_WARPS = 4
PROBE_SIZE = 4096  # elements per buffer; a multiple of 16, as the JIT specializes


def probe_args() -> tuple[object, ...]:
    """The probes' arguments as the recorder describes them (fp32 buffers, 16-byte aligned)."""
    from tools.gpu_readiness.recorder import TensorArg

    buffer = TensorArg(torch.float32, 0, 4 * PROBE_SIZE, None)
    return (buffer, buffer, buffer, buffer, PROBE_SIZE)
