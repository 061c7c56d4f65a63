"""``python -m tp_logprob hardware``: which CPU code paths the math libraries took here.

A bitwise promise (batch invariance, cross-TP bits) is a promise about the
libraries' code paths on the machine it runs on. This command says which paths
were taken, so that a run with the libraries restricted (say, to their AVX2
paths on an AVX-512 machine) can be confirmed before its pass is trusted:

* torch's ATen kernels: the CPU capability it dispatches to (``ATEN_CPU_CAPABILITY``);
* numpy's OpenBLAS (the Triton interpreter's ``tl.dot``): the core it chose
  (``OPENBLAS_CORETYPE``);
* torch's BLAS (MKL on x86 builds): MKL does not report its code path, so the
  command prints a fingerprint of a few fp32 products: a restriction that took
  effect changes it (``MKL_CBWR=AVX2`` does on every x86 CPU; ``MKL_ENABLE_INSTRUCTIONS``
  is a ceiling that some CPUs never reach);
* for both libraries, whether a row of a matrix product gets other bits at
  another position of the batch: the premise the fused LM heads do not rely on
  (``docs/fused-lm-head.md``, "Batch invariance").
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
from pathlib import Path
from typing import Any

__all__ = ["add_command", "blas_report", "openblas_core"]

_ENV = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "OPENBLAS_CORETYPE")
_CORENAME_SYMBOLS = (
    "scipy_openblas_get_corename64_",
    "scipy_openblas_get_corename",
    "openblas_get_corename",
)


def add_command(commands: Any) -> None:
    """Add ``hardware`` to the CLI's subparsers."""
    parser = commands.add_parser(
        "hardware",
        help="show which CPU code paths torch and numpy's BLAS took on this machine",
        description="Print the ATen CPU capability, numpy's OpenBLAS core, a fingerprint of "
        "torch's fp32 matrix products and whether a row's bits depend on its position in a "
        "product: run it with and without a restriction (e.g. to AVX2) to confirm it took effect.",
    )
    parser.set_defaults(handler=_hardware)


def _hardware(args: argparse.Namespace) -> int:
    for line in blas_report():
        print(line)
    return 0


def openblas_core() -> str | None:
    """The core numpy's OpenBLAS chose (``Haswell``, ``SkylakeX``, ...), or None if unknown.

    Read from the loaded library itself (``openblas_get_corename``), so it is what
    the library uses, not what the environment asked for.
    """
    import numpy as np

    np.ones((2, 2)) @ np.ones((2, 2))  # the library is loaded by now
    for path in _loaded_libraries("openblas"):
        library = ctypes.CDLL(path)
        for symbol in _CORENAME_SYMBOLS:
            function = getattr(library, symbol, None)
            if function is not None:
                function.restype = ctypes.c_char_p
                name: bytes = function()
                return name.decode()
    return None


def _loaded_libraries(fragment: str) -> list[str]:
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return []
    found = []
    for line in maps.read_text().splitlines():
        path = line.split()[-1] if line.split() else ""
        if fragment in Path(path).name.lower() and path not in found:
            found.append(path)
    return found


def _position_dependence(matmul: Any, rows: Any, weight: Any) -> int:
    """How many rows of ``rows @ weight`` change bits when the batch is rotated by one row."""
    import numpy as np

    full = np.asarray(matmul(rows, weight))
    rotated = np.asarray(matmul(np.roll(rows, 1, axis=0), weight))
    return int(
        np.count_nonzero(
            (full.view(np.uint32) != np.roll(rotated, -1, 0).view(np.uint32)).any(axis=1)
        )
    )


_SHAPES = ((67, 61, 37), (3, 5, 4), (128, 1000, 64), (257, 64, 513))
"""``(n, k, m)`` of the products fingerprinted: small and edge-sized blocks, a long ``k``."""


def _operands(seed: int, shape: tuple[int, int, int] = _SHAPES[0]) -> tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = rng.standard_normal(shape[:2]).astype(np.float32)
    weight = rng.standard_normal(shape[1:]).astype(np.float32)
    return rows, weight


def blas_report() -> list[str]:
    """The lines ``hardware`` prints (torch lines only where torch is installed)."""
    import numpy as np

    env = ", ".join(f"{name}={os.environ[name]}" for name in _ENV if name in os.environ)
    lines = [f"environment: {env or 'no ATen, MKL or OpenBLAS restriction set'}"]
    rows, weight = _operands(0)
    core = openblas_core()
    moved = _position_dependence(np.matmul, rows, weight)
    lines.append(
        f"numpy {np.__version__}: OpenBLAS core {core or 'unknown (not OpenBLAS?)'}; "
        f"{_moved(moved, rows.shape[0])}"
    )
    try:
        import torch
    except ImportError:
        lines.append("torch: not installed")
        return lines
    capability = torch.backends.cpu.get_cpu_capability()
    blas = "MKL" if torch.backends.mkl.is_available() else "not MKL"
    with torch.inference_mode():
        products = []
        for seed, shape in enumerate(_SHAPES):
            a, b = (torch.from_numpy(x) for x in _operands(seed, shape))
            products += [a @ b, torch.mv(b.T.contiguous(), a[0].contiguous())]
        torch_moved = _position_dependence(
            lambda a, b: (torch.from_numpy(np.ascontiguousarray(a)) @ torch.from_numpy(b)).numpy(),
            rows,
            weight,
        )
    digest = hashlib.sha256(b"".join(p.numpy().tobytes() for p in products)).hexdigest()[:16]
    lines.append(f"torch {torch.__version__}: ATen CPU capability {capability}")
    lines.append(
        f"torch BLAS ({blas}): fp32 product fingerprint {digest}; "
        f"{_moved(torch_moved, rows.shape[0])}"
    )
    return lines


def _moved(count: int, rows: int) -> str:
    if count:
        return f"a row's bits depend on its position in a product ({count} of {rows} rows moved)"
    return "a row's bits did not depend on its position in a product here"
