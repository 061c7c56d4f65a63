"""Mutants with one bug in the backward pass (role ``train``); the forward is torch_native's.

Each private function is a copy of ``partials.local_grad`` with one change,
marked ``# BUG:``.
"""

from __future__ import annotations

import torch

from tests.mutants._compose import mutant
from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.partials import compute_dtype, local_grad, local_partial, target_one_hot
from tp_logprob.kernels.shards import live_width


def _grad_no_one_hot(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    lse: torch.Tensor,
    grad_selected: torch.Tensor,
    contract: LogprobContract,
) -> torch.Tensor:
    dtype = compute_dtype(local_logits.dtype)
    grad = torch.zeros(local_logits.shape, dtype=dtype, device=local_logits.device)
    width = live_width(contract)
    if width > 0:
        live = local_logits[:, :width].to(dtype)
        probs = torch.exp(live - lse.unsqueeze(1))
        g = grad_selected.to(dtype).unsqueeze(1)
        live_grad = -g * probs  # BUG: the one-hot [v == target] term is missing
        grad[:, :width] = torch.where(active.unsqueeze(1), live_grad, 0.0)
    return grad.to(local_logits.dtype)


def _grad_padding_nonzero(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    lse: torch.Tensor,
    grad_selected: torch.Tensor,
    contract: LogprobContract,
) -> torch.Tensor:
    dtype = compute_dtype(local_logits.dtype)
    width = local_logits.shape[1]  # BUG: the whole shard, padding columns included
    grad = torch.zeros(local_logits.shape, dtype=dtype, device=local_logits.device)
    if live_width(contract) > 0:
        live = local_logits.to(dtype)
        one_hot = target_one_hot(targets, contract, width, live.device)
        probs = torch.exp(live - lse.unsqueeze(1))
        g = grad_selected.to(dtype).unsqueeze(1)
        live_grad = g * (one_hot.to(dtype) - probs)
        grad[:, :width] = torch.where(active.unsqueeze(1), live_grad, 0.0)
    return grad.to(local_logits.dtype)


def _grad_ignores_upstream(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    lse: torch.Tensor,
    grad_selected: torch.Tensor,
    contract: LogprobContract,
) -> torch.Tensor:
    dtype = compute_dtype(local_logits.dtype)
    grad = torch.zeros(local_logits.shape, dtype=dtype, device=local_logits.device)
    width = live_width(contract)
    if width > 0:
        live = local_logits[:, :width].to(dtype)
        one_hot = target_one_hot(targets, contract, width, live.device)
        probs = torch.exp(live - lse.unsqueeze(1))
        live_grad = one_hot.to(dtype) - probs  # BUG: not multiplied by the upstream gradient
        grad[:, :width] = torch.where(active.unsqueeze(1), live_grad, 0.0)
    return grad.to(local_logits.dtype)


def _grad_local_lse(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    lse: torch.Tensor,
    grad_selected: torch.Tensor,
    contract: LogprobContract,
) -> torch.Tensor:
    # BUG: softmax from this shard's own LSE (m_r + log s_r), not the merged one saved in forward.
    partial = local_partial(local_logits.detach(), targets, contract)
    local_lse = partial[:, 0] + torch.log(partial[:, 1])
    return local_grad(local_logits, targets, active, local_lse, grad_selected, contract)


grad_no_one_hot = mutant("grad_no_one_hot", grad=_grad_no_one_hot)
grad_padding_nonzero = mutant("grad_padding_nonzero", grad=_grad_padding_nonzero)
grad_ignores_upstream = mutant("grad_ignores_upstream", grad=_grad_ignores_upstream)
grad_local_lse = mutant("grad_local_lse", grad=_grad_local_lse)
