"""Shared builders for the processed-logprob tests: contracts with a support, the rules in
float64 numpy, and the threshold run on emulated ranks.

The reference rules here are the definitions of ``docs/semantics.md``, "Processed
logprobs", in float64: min-p compares ``exp(z - M)`` with ``min_p``, top-k takes the
k-th largest value with multiplicity, top-p compares the mass strictly above each
value with ``top_p`` times the survivors' mass. ``margin`` reports how close the
nearest min-p or top-p decision came to its boundary, so a test on "well-separated"
rows can assert that rounding cannot flip one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

import tp_logprob as tpl
from tests.helpers.native_cases import REAL, make_contract
from tp_logprob.kernels.partials import live_logits
from tp_logprob.kernels.support_threshold import support_threshold


def support_contract(
    bounds: tuple[tuple[int, int], ...],
    support: tpl.SupportSpec | None,
    *,
    temperature: float = 1.0,
    entropy: bool = False,
    **contract_args: Any,
) -> tpl.LogprobContract:
    """``make_contract`` with a support, a temperature and (optionally) entropy."""
    contract = make_contract(bounds, **contract_args)
    return dataclasses.replace(
        contract, support=support, temperature=temperature, export_entropy=entropy
    )


@dataclasses.dataclass(frozen=True)
class ReferenceSupport:
    """The rules' support of every row: threshold, size, mask, closeness to a boundary."""

    tau: np.ndarray
    size: np.ndarray
    keep: np.ndarray
    margin: np.ndarray
    """Per row, the smallest relative gap between a min-p or top-p quantity and its
    boundary (inf with neither rule)."""


def live_z32(logits: torch.Tensor, temperature: float = 1.0, real: int = REAL) -> np.ndarray:
    """``z = fp32(x) / fp32(T)`` of the live columns, in fp32 as the kernels form it, as float64."""
    x = logits[:, :real].float()
    if temperature != 1.0:
        x = x / torch.tensor(np.float32(temperature))
    return x.double().numpy()


def reference_support(
    z: np.ndarray,
    *,
    min_p: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
) -> ReferenceSupport:
    """The support of each row of live ``z`` (float64) by the rules, in vLLM's order."""
    rows, width = z.shape
    tau = np.full(rows, np.nan)
    size = np.zeros(rows, dtype=np.int64)
    keep = np.ones((rows, width), dtype=bool)
    margin = np.full(rows, np.inf)
    for row in range(rows):
        values = z[row]
        if np.isnan(values).any() or (values == np.inf).any() or not np.isfinite(values).any():
            continue
        shifted = np.exp(values - values.max())
        kept = np.ones(width, dtype=bool)
        if min_p:
            kept = shifted >= min_p
            margin[row] = min(margin[row], np.min(np.abs(shifted - min_p)) / min_p)
        if top_k is not None and top_k < kept.sum():
            kth = np.sort(values[kept])[::-1][top_k - 1]
            kept &= values >= kth
        if top_p is not None and top_p < 1.0:
            total = shifted[kept].sum()
            above = np.array([shifted[kept & (values > v)].sum() for v in values])
            gap = np.abs(above - top_p * total)[kept] / total
            margin[row] = min(margin[row], gap.min())
            kept &= above < top_p * total
        keep[row] = kept
        tau[row] = values[kept].min()
        size[row] = int(kept.sum())
    return ReferenceSupport(tau, size, keep, margin)


def masked_logits(logits: torch.Tensor, keep: np.ndarray, real: int = REAL) -> torch.Tensor:
    """``logits`` with every live column outside ``keep`` set to ``-inf``: the exact outputs
    over ``S`` are the oracle's on these logits (a column outside ``S`` counts as ``-inf``)."""
    masked = logits.clone()
    live = masked[:, :real]
    live[~torch.from_numpy(keep)] = float("-inf")
    return masked


def threshold_op(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: tpl.LogprobContract,
    group: Any = None,
) -> tpl.LogprobResult:
    """An op for ``run_tp`` that returns the rank's ``(tau, size)`` as the support outputs,
    so ``run_tp`` checks that every rank has the same bits."""
    tau, size = support_threshold(live_logits(local_logits, contract), contract, group)
    return tpl.LogprobResult(tau, None, support_size=size, support_threshold=tau)


def tp_threshold(
    logits: torch.Tensor, contract: tpl.LogprobContract
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tau, size)`` of every row on every rank of the contract's layout (rank 0's)."""
    result = tpl.run_tp(threshold_op, logits, torch.zeros(len(logits), dtype=torch.int64), contract)
    return result[0].support_threshold, result[0].support_size
