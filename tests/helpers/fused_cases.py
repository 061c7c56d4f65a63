"""Shared cases of the fused LM-head kernel tests: shapes, contracts, operands, the oracle.

``REAL`` live columns of ``PADDED``; the Triton fused tests use hidden size
``FUSED_SIZE`` (two 16-deep K chunks on CPU, the second half masked).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import tp_logprob as tpl
from tp_logprob.kernels.dtypes import TORCH_DTYPES
from tp_logprob.oracle import (
    dot_product_error_bound,
    exact_entropy,
    exact_hidden_logits,
    exact_selected_logprob,
    fused_extra_bounds,
)
from tp_logprob.oracle.tolerance import within_tolerance

REAL, PADDED = 19, 24
FUSED_SIZE = 24
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = ("fp32", "bf16", "fp16")
MASK = np.array([True, True, False, True, True, True])
GRAD_REL = {"fp32": 2.0**-14, "bf16": 2.0**-6, "fp16": 2.0**-9}


def fused_contract(
    bounds: tuple[tuple[int, int], ...],
    *,
    num_tokens: int = 6,
    dtype: str = "fp32",
    role: str = "infer",
    active_mask: Any = None,
    size: int = FUSED_SIZE,
    **fields: Any,
) -> tpl.LogprobContract:
    return tpl.LogprobContract(
        role=role,
        dtype=dtype,
        mask=tpl.MaskSpec(num_tokens, active_mask),
        sharding=tpl.ShardingSpec(0, len(bounds), bounds, REAL, PADDED),
        reduction=tpl.ReductionSpec("fixed_topology"),
        input_kind="hidden",
        hidden_size=size,
        **fields,
    )


def fused_and_logits_contracts(
    bounds: tuple[tuple[int, int], ...],
    support: tpl.SupportSpec,
    rows: int,
    *,
    size: int,
    temperature: float,
    **fields: Any,
) -> tuple[tpl.LogprobContract, tpl.LogprobContract]:
    """A biased fused contract with ``support``, temperature and entropy, and the logits
    path's contract for the same invocation (its role, mask, sharding and scope)."""
    fused = fused_contract(
        bounds,
        num_tokens=rows,
        size=size,
        has_bias=True,
        temperature=temperature,
        export_entropy=True,
        support=support,
        **fields,
    )
    plain = tpl.LogprobContract(
        fused.role,
        fused.dtype,
        fused.mask,
        fused.sharding,
        fused.reduction,
        temperature=temperature,
        export_entropy=True,
        support=support,
    )
    return fused, plain


def fused_case(
    dtype: str, *, seed: int, num_tokens: int = 6, size: int = FUSED_SIZE, bias: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Hidden, weight (padding rows hold NaN and inf), bias (-inf padding) and targets."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(num_tokens, size, generator=gen).to(TORCH_DTYPES[dtype])
    weight = (torch.randn(PADDED, size, generator=gen) * 0.6).to(TORCH_DTYPES[dtype])
    weight[REAL:] = float("nan")
    weight[REAL + 1, :3] = float("inf")
    biases = torch.randn(PADDED, generator=gen).to(TORCH_DTYPES[dtype]) if bias else None
    if biases is not None:
        biases[REAL:] = float("-inf")
    targets = torch.randint(0, REAL, (num_tokens,), generator=gen)
    return hidden, weight, biases, targets


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.float().view(torch.int32), b.float().view(torch.int32))


def as_f64(tensor: torch.Tensor | None) -> Any:
    return None if tensor is None else tensor.detach().double().numpy()


def oracle(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    active_mask: Any = None,
) -> dict[str, Any]:
    """Exact values on fp32(x_exact) and the extra room the kernel's own fp32 ``x`` needs."""
    h, w = as_f64(hidden), as_f64(weight)[:REAL]
    b = None if bias is None else as_f64(bias)[:REAL]
    x = exact_hidden_logits(h, w, b)
    x32 = x.astype(np.float32).astype(np.float64)
    args: dict[str, Any] = {"active_mask": active_mask, "temperature": temperature}
    selected, lse = exact_selected_logprob(x32, targets.numpy(), **args)
    dot = dot_product_error_bound(h, w, b)
    extra = fused_extra_bounds(x, dot, targets.numpy(), temperature=temperature)
    z = x32 / np.float32(temperature)
    return {
        "selected": selected,
        "lse": lse,
        "entropy": exact_entropy(x32, **args),
        "extra": extra,
        "row_max": z.max(axis=1),
    }


def assert_within(got: Any, want: Any, bound: Any, what: str) -> None:
    got = np.asarray(got, np.float64)
    ok = within_tolerance(got, np.asarray(want, np.float64), np.asarray(bound, np.float64))
    bad = np.nonzero(~ok)[0]
    assert bad.size == 0, f"{what}: rows {bad.tolist()}: got {got[bad]!r}, want {want[bad]!r}"
