"""Shared setup of the Triton backend tests: interpreter or GPU, skip, the two ops, oracle checks.

With a visible GPU (and ``TRITON_INTERPRET`` not set) the ops run compiled on it:
``BACKENDS`` and ``online_merge`` move their tensors to the GPU and their results
back, so every test reads the same on either device. Without one, importing this
module turns the Triton interpreter on before triton is first imported (``import
torch`` does not import triton). It skips the importing test module cleanly when
triton is not installed.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib
import math
from typing import Any

import numpy as np
import pytest

import tp_logprob as tpl
from tests.helpers.native_cases import REAL, on_device
from tests.helpers.native_cases import oracle_report as shared_oracle_report
from tp_logprob.emulate import run_tp
from tp_logprob.kernels.dtypes import TORCH_DTYPES
from tp_logprob.kernels.native import torch_native_logprob
from tp_logprob.oracle import tolerance

pytest.importorskip("triton", reason="the Triton backends need triton (on CPU, its interpreter)")

_online = importlib.import_module("tp_logprob.kernels.triton.online")
_exact_sum = importlib.import_module("tp_logprob.kernels.triton.exact_sum")
_launch = importlib.import_module("tp_logprob.kernels.triton.launch")

_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = torch.device("cpu" if _INTERPRETED or not torch.cuda.is_available() else "cuda")

BACKENDS: dict[str, Any] = {
    "triton_online": on_device(_online.triton_online_logprob, DEVICE),
    "triton_exact_sum": on_device(_exact_sum.triton_exact_sum_logprob, DEVICE),
}
fraction_bits = _exact_sum.fraction_bits
online_merge = on_device(_online.online_merge, DEVICE)


def row_block(dtype: str) -> int:
    """The column tile of the row kernels on CPU (the tests span several tiles)."""
    torch_dtype = TORCH_DTYPES[dtype]
    return int(_launch.launch_config("cpu", _launch.KernelKind.ROW, torch_dtype).block)


def backend_tolerance(backend: str, contract: tpl.LogprobContract, real: int = REAL) -> Any:
    """The oracle's tolerance for ``backend``'s algorithm on ``contract``'s layout."""
    sharding = contract.sharding
    dtype = contract.dtype.value
    if backend == "triton_exact_sum":
        bits = fraction_bits(sharding.padded_vocab_size)
        return tolerance(dtype, real, num_shards=sharding.tp_world_size, fixed_point_bits=bits)
    widest = max(end - start for start, end in sharding.vocab_shard_bounds)
    tiles = math.ceil(widest / row_block(dtype))
    return tolerance(dtype, real, num_shards=sharding.tp_world_size, rescales=tiles + 1)


def oracle_report(
    backend: str,
    result: tpl.LogprobResult,
    logits: torch.Tensor,
    targets: torch.Tensor,
    contract: tpl.LogprobContract,
    real: int = REAL,
) -> str | None:
    """None when ``result`` is within ``backend``'s oracle tolerance, else the offending rows."""
    report = shared_oracle_report(
        result,
        logits,
        targets,
        active_mask=contract.mask.dense(),
        table=backend_tolerance(backend, contract, real),
        real=real,
    )
    return None if report is None else f"{backend}: {report}"


def native_report(
    backend: str,
    result: tpl.LogprobResult,
    logits: torch.Tensor,
    targets: torch.Tensor,
    contract: tpl.LogprobContract,
    real: int = REAL,
) -> str | None:
    """None when ``result`` matches torch_native: the same NaN/inf, finite values within
    twice the tolerance (each is within it of the exact value)."""
    native = run_tp(torch_native_logprob, logits, targets, contract)[0]
    tol = backend_tolerance(backend, contract, real)
    mask = contract.mask.dense()
    for name in ("selected_logp", "lse"):
        got = getattr(result, name).double().numpy()
        want = getattr(native, name).double().numpy()
        special = ~np.isfinite(want)
        same_special = (np.isnan(got) & np.isnan(want)) | (got == want)
        finite_want = np.where(special, 0.0, want)
        if name == "lse":
            bound = tol.lse_bound(finite_want)
        else:
            native_lse = native.lse.double().numpy()
            bound = tol.selected_bound(
                finite_want, np.where(np.isfinite(native_lse), native_lse, 0)
            )
        with np.errstate(invalid="ignore"):
            close = np.abs(got - want) <= 2 * bound
        ok = np.where(special, same_special, close)
        if name == "selected_logp":
            ok = np.where(mask, ok, got == want)
        if not ok.all():
            rows = np.flatnonzero(~ok)[:5].tolist()
            return f"{backend} vs torch_native, {name} rows {rows}: {got[rows]} vs {want[rows]}"
    return None


def bits_of(result: tpl.LogprobResult) -> tuple[list[int], list[int]]:
    """The raw bits of both outputs (NaN payloads and signed zeros included)."""
    view = {2: torch.int16, 4: torch.int32}[result.selected_logp.element_size()]
    return (
        result.selected_logp.contiguous().view(view).tolist(),
        result.lse.contiguous().view(view).tolist(),
    )
