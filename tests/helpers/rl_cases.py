"""Shared builders for the temperature and entropy tests of all three backends.

Importing it imports ``tests.helpers.triton_cases`` (the Triton interpreter, or a clean skip
of the importing module when triton is missing).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

import tp_logprob as tpl
from tests.helpers.native_cases import REAL, as_float64, make_contract
from tests.helpers.triton_cases import BACKENDS as TRITON_BACKENDS
from tests.helpers.triton_cases import backend_tolerance
from tp_logprob.kernels.native import torch_native_logprob
from tp_logprob.oracle import apply_temperature, exact_entropy, exact_selected_logprob, tolerance

OPS: dict[str, Any] = {"torch_native": torch_native_logprob, **TRITON_BACKENDS}

BACKEND_PARAMS = [
    pytest.param(name, marks=() if name == "torch_native" else pytest.mark.triton) for name in OPS
]
"""Every backend as a parametrize value; the Triton ones carry the ``triton`` marker."""


def rl_contract(
    bounds: tuple[tuple[int, int], ...],
    *,
    temperature: float = 1.0,
    entropy: bool = True,
    **contract_args: Any,
) -> tpl.LogprobContract:
    """``make_contract`` with a temperature and (by default) ``export_entropy``."""
    contract = make_contract(bounds, **contract_args)
    return dataclasses.replace(contract, temperature=temperature, export_entropy=entropy)


def backend_table(backend: str, contract: tpl.LogprobContract, real: int = REAL) -> Any:
    """The tolerance each backend's forward tests use (rescales, fixed-point bits, shards)."""
    if backend == "torch_native":
        return tolerance(contract.dtype.value, real, num_shards=contract.sharding.tp_world_size)
    return backend_tolerance(backend, contract, real)


def live_z(logits: torch.Tensor, temperature: float, real: int = REAL) -> np.ndarray:
    """``z = fp32(x) / fp32(T)`` of the live columns, as the oracle forms it (float64)."""
    return apply_temperature(as_float64(logits)[:, :real], temperature)


def z_row_max(z: np.ndarray) -> np.ndarray:
    """Each row's max of ``z``; NaN when the row holds a NaN."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(z).any(axis=1), np.nan, z.max(axis=1))


def exact_outputs(
    logits: torch.Tensor, targets: torch.Tensor, contract: tpl.LogprobContract, real: int = REAL
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The exact ``(selected_logp, lse, entropy)`` of ``contract`` (its mask and temperature)."""
    x, mask, t = as_float64(logits), contract.mask.dense(), contract.temperature
    selected, lse = exact_selected_logprob(
        x, targets.numpy(), active_mask=mask, real_vocab_size=real, temperature=t
    )
    entropy = exact_entropy(x, active_mask=mask, real_vocab_size=real, temperature=t)
    return selected, lse, entropy


def oracle_report(
    backend: str,
    result: tpl.LogprobResult,
    logits: torch.Tensor,
    targets: torch.Tensor,
    contract: tpl.LogprobContract,
    real: int = REAL,
) -> str | None:
    """None when all three outputs are within ``backend``'s tolerance of the exact values
    (``row_max`` = the max of ``z``), else the offending rows."""
    want = exact_outputs(logits, targets, contract, real)
    got = [getattr(result, name).double().numpy() for name in ("selected_logp", "lse", "entropy")]
    table = backend_table(backend, contract, real)
    bad = table.violations(
        got[0],
        got[1],
        want[0],
        want[1],
        row_max=z_row_max(live_z(logits, contract.temperature, real)),
        active_mask=contract.mask.dense(),
        kernel_entropy=got[2],
        exact_entropy=want[2],
    )
    if not bad.any():
        return None
    lines = [f"{backend}: {int(bad.sum())} of {bad.size} rows outside {table}"]
    lines += [
        f"  row {i}: selected {got[0][i]!r} want {want[0][i]!r}; lse {got[1][i]!r} want "
        f"{want[1][i]!r}; entropy {got[2][i]!r} want {want[2][i]!r}"
        for i in np.flatnonzero(bad)[:5].tolist()
    ]
    return "\n".join(lines)


def result_bits(result: tpl.LogprobResult) -> list[list[int]]:
    """Raw bits of every output present (``None`` outputs are skipped)."""
    out = []
    for tensor in (result.selected_logp, result.lse, result.entropy):
        if tensor is not None:
            view = {2: torch.int16, 4: torch.int32}[tensor.element_size()]
            out.append(tensor.detach().contiguous().view(view).tolist())
    return out
