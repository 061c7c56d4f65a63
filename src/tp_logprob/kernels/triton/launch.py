"""Per-platform launch configurations for the Triton kernels, in one table.

A config depends only on the platform, the kind of kernel and the input dtype,
never on the number of rows: that is what keeps the row kernels batch invariant
(a row's reduction order is fixed by ``block`` and ``num_warps`` alone).

- cuda: 8 warps of 32 lanes; 4096-column tiles for 16-bit inputs (16 elements,
  two 16-byte loads per lane), 2048 for fp32. Merges take 256 rows on 8 warps, one
  row per lane: with 4 warps (two rows a lane) the entropy merge spilled on sm_90.
  exact_sum's fixed-point pass takes 2048-column tiles for 16-bit inputs too (8
  elements, one 16-byte load per lane): with temperature and entropy it keeps
  more values live per element, and 4096-column tiles spilled on sm_100. (ROCm's
  64-lane wavefronts keep 4096, which is 8 elements a lane there.) Its integer
  sums are exact, so the tile width cannot change a bit.
- rocm: 8 wavefronts of 64 lanes; tiles are multiples of 512 lanes, same sizes.
- fused (``triton_fused``'s LM head): ``block`` is the column tile; ``FUSED_TILES``
  adds the rows per program and the hidden-size chunk of its ``tl.dot`` K-loop. Its
  operands are widened to fp32 (an ``ieee`` dot, no tensor cores), so both dtypes
  share one size. cuda: 16 x 64 tiles with 16-deep chunks on 4 warps (8 fp32
  accumulators a lane; 32-deep chunks spilled 12 bytes on sm_90 and sm_100 for
  fp32 without 16-byte alignment, and 8 warps narrowed bf16 loads to 64 bits);
  ``triton_fused_exact_sum``'s fixed-point pass (``FUSED_SUM``) keeps int64 sums
  per element and takes 32-column tiles (64 spilled 4 bytes with temperature).
  A logit's bits do not depend on the column tile, so the two passes may differ.
  rocm: 16 x 64 x 32 on 4 wavefronts; 16 x 16 x 16 under the interpreter, without
  ``tl.dot`` (``FUSED_DOT``: numpy's matmul is not row-position independent).
- cpu (the Triton interpreter): 16-column tiles, so small test shapes still run
  the multi-tile loops. Launches on CPU hold the interpreter (``interpreted``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
from triton.runtime.interpreter import InterpretedFunction

from tp_logprob.kernels.triton.interpreted import interpreting

__all__ = [
    "FUSED_DOT",
    "FUSED_SUM_DEPTH",
    "FUSED_TILES",
    "KernelKind",
    "LaunchConfig",
    "RecordedLaunch",
    "launch",
    "launch_config",
    "platform_of",
    "recording_launches",
]


class KernelKind(str, Enum):
    """The shapes of work the kernels do."""

    ROW = "row"  # one program per row, looping over column tiles (forward passes)
    SUM = "sum"  # ROW, for exact_sum's fixed-point pass: narrower tiles, more live values
    TILE = "tile"  # one program per (row, column tile) (backward)
    MERGE = "merge"  # one program per block of rows (cross-rank merges)
    FUSED = "fused"  # one program per block of rows (x column tile), tl.dot over hidden
    FUSED_SUM = "fused_sum"  # FUSED, for the fused fixed-point pass: int64 sums per element


@dataclass(frozen=True)
class LaunchConfig:
    """``block`` columns (rows for merges) per tile and ``num_warps`` per program.

    ``fp_fusion=False`` launches with Triton's ``enable_fp_fusion=False``: no product and
    sum contracted into an fma (``triton_portable``, whose bits must not depend on the
    target's compiler). The interpreter never contracts, so there it changes nothing.
    """

    block: int
    num_warps: int
    fp_fusion: bool = True


# (platform, kind) -> (block for 16-bit inputs, block for fp32 inputs, num_warps)
_TABLE: dict[tuple[str, KernelKind], tuple[int, int, int]] = {
    ("cuda", KernelKind.ROW): (4096, 2048, 8),
    ("cuda", KernelKind.SUM): (2048, 2048, 8),
    ("cuda", KernelKind.TILE): (4096, 2048, 8),
    ("cuda", KernelKind.MERGE): (256, 256, 8),
    ("cuda", KernelKind.FUSED): (64, 64, 4),
    ("cuda", KernelKind.FUSED_SUM): (64, 64, 8),
    ("rocm", KernelKind.ROW): (4096, 2048, 8),
    ("rocm", KernelKind.SUM): (4096, 2048, 8),
    ("rocm", KernelKind.TILE): (4096, 2048, 8),
    ("rocm", KernelKind.MERGE): (256, 256, 4),
    ("rocm", KernelKind.FUSED): (64, 64, 4),
    ("rocm", KernelKind.FUSED_SUM): (64, 64, 4),
    ("cpu", KernelKind.ROW): (16, 16, 1),
    ("cpu", KernelKind.SUM): (16, 16, 1),
    ("cpu", KernelKind.TILE): (16, 16, 1),
    ("cpu", KernelKind.MERGE): (8, 8, 1),
    ("cpu", KernelKind.FUSED): (16, 16, 1),
    ("cpu", KernelKind.FUSED_SUM): (16, 16, 1),
}

FUSED_TILES: dict[str, tuple[int, int]] = {"cuda": (16, 16), "rocm": (16, 32), "cpu": (16, 16)}
"""platform -> (rows per program, hidden-size chunk) of the fused kernels: fixed, as ``block``."""

FUSED_DOT: dict[str, bool] = {"cuda": True, "rocm": True, "cpu": False}
"""platform -> whether the fused kernels form a K chunk with ``tl.dot`` (constexpr ``DOT``).

Not under the interpreter: its ``tl.dot`` is numpy's matmul, whose BLAS gives a row other
bits at another position in the tile. There a chunk is its fp32 products, one rounded
product per element, summed over the chunk by one numpy reduction that treats every
element of the tile alike (see ``fused_kernels``). That sum depends on the chunk depth,
so on CPU every pass takes the same depth (``FUSED_SUM_DEPTH``)."""

FUSED_SUM_DEPTH: dict[str, tuple[int, int]] = {"cuda": (32, 16), "rocm": (32, 32), "cpu": (16, 16)}
"""platform -> hidden-size chunk of ``triton_fused_exact_sum``'s fixed-point pass, for 16-bit
and fp32 inputs: on cuda's 8 warps that is 16 bytes a lane per load either way. Where
``FUSED_DOT`` holds, a logit's bits do not depend on the chunk depth, so the passes may
differ; on CPU they match ``FUSED_TILES``'s depth."""


@dataclass(frozen=True)
class RecordedLaunch:
    """One launch as :func:`launch` was asked for it, seen by :func:`recording_launches`."""

    kernel: Any
    grid: tuple[int, ...]
    config: LaunchConfig
    args: tuple[Any, ...]
    constexprs: dict[str, Any]


@dataclass
class _Recording:
    platform: str
    sink: Callable[[RecordedLaunch], None]


_RECORDING: _Recording | None = None
_RECORDING_LOCK = threading.Lock()


@contextlib.contextmanager
def recording_launches(platform: str, sink: Callable[[RecordedLaunch], None]) -> Iterator[None]:
    """Within the block, every :func:`launch` goes to ``sink`` instead of running, and
    :func:`platform_of` answers ``platform``: the launchers choose their configs exactly as
    on that GPU, with CPU tensors and no GPU. The seam the GPU-readiness tools record
    through (``tools.gpu_readiness.recorder``); one recording at a time per process.
    """
    global _RECORDING
    if platform not in ("cuda", "rocm"):
        raise ValueError(f"platform={platform!r}: expected 'cuda' or 'rocm'")
    with _RECORDING_LOCK:
        if _RECORDING is not None:
            raise RuntimeError("recording_launches: a recording is already active")
        _RECORDING = _Recording(platform, sink)
    try:
        yield
    finally:
        with _RECORDING_LOCK:
            _RECORDING = None


def platform_of(tensor: torch.Tensor) -> str:
    """``cpu`` for a CPU tensor (the interpreter), ``rocm`` on a HIP build, else ``cuda``
    (inside :func:`recording_launches`, the platform being recorded)."""
    recording = _RECORDING
    if recording is not None:
        return recording.platform
    if tensor.device.type == "cpu":
        return "cpu"
    return "rocm" if getattr(torch.version, "hip", None) else "cuda"


def launch_config(
    platform: str, kind: KernelKind, dtype: torch.dtype, *, fp_fusion: bool = True
) -> LaunchConfig:
    """The fixed config for ``kind`` kernels over ``dtype`` inputs on ``platform``."""
    block_16, block_32, num_warps = _TABLE[(platform, kind)]
    return LaunchConfig(block_16 if dtype.itemsize <= 2 else block_32, num_warps, fp_fusion)


def launch(
    kernel: Any,
    grid: Sequence[int],
    config: LaunchConfig,
    device_tensor: torch.Tensor,
    *args: Any,
    **constexprs: Any,
) -> None:
    """Launch ``kernel[grid]`` with ``config``'s block and warps; an empty grid launches nothing.

    Inside :func:`recording_launches` the launch is handed to the recording instead.
    """
    recording = _RECORDING
    if recording is not None:
        recording.sink(RecordedLaunch(kernel, tuple(grid), config, args, constexprs))
        return
    if min(grid) == 0:
        return
    options: dict[str, Any] = {"num_warps": config.num_warps}
    if not config.fp_fusion:
        options["enable_fp_fusion"] = False
    with _launching(kernel, device_tensor):
        kernel[tuple(grid)](*args, BLOCK=config.block, **options, **constexprs)


@contextlib.contextmanager
def _launching(kernel: Any, tensor: torch.Tensor) -> Iterator[None]:
    """Guard one kernel launch on ``tensor``'s device; on CPU, check and hold the interpreter."""
    if tensor.device.type != "cpu":
        yield
        return
    if not isinstance(kernel, InterpretedFunction):
        raise RuntimeError(
            "the Triton backends run on CPU tensors only through the Triton interpreter: "
            "set TRITON_INTERPRET=1 before tp_logprob's Triton kernels are first imported"
        )
    with interpreting():
        yield
