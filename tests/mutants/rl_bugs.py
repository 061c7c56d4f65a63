"""Mutants with one bug in temperature or entropy, the RL trainers' reported bugs (issue 11).

Each private function is a copy of a step of torch_native (``local_partial``,
``native_forward``, ``local_grad``, ``merge_entropy``) with one change, marked
``# BUG:``. Every mutant here claims ``supports_temperature`` and
``exports_entropy``, as torch_native does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from tests.mutants._compose import MutantPair, forward_from, mutant
from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.merge import merge_entropy, pack_partial
from tp_logprob.kernels.native import native_forward
from tp_logprob.kernels.partials import (
    compute_dtype,
    identity_partial,
    owned_target_logit,
    scaled_logits,
    shift_by_max,
    target_one_hot,
    tree_sum,
)
from tp_logprob.kernels.shards import live_width

_NEG_INF = float("-inf")


def _rl_mutant(name: str, **steps: Any) -> MutantPair:
    return mutant(name, supports_temperature=True, exports_entropy=True, **steps)


def _identity(rows: int, like: torch.Tensor, contract: LogprobContract) -> torch.Tensor:
    dtype = compute_dtype(like.dtype)
    return identity_partial(rows, dtype, like.device, entropy=contract.export_entropy)


def _entropy_sum(shifted: torch.Tensor, contract: LogprobContract) -> torch.Tensor | None:
    """native's guarded ``sum exp(d) d``, or None without ``export_entropy``."""
    if not contract.export_entropy:
        return None
    return tree_sum(torch.where(shifted == _NEG_INF, 0.0, torch.exp(shifted) * shifted))


def _partial(
    live: torch.Tensor, targets: torch.Tensor, contract: LogprobContract
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """native's ``(row_max, shifted, sum_exp, target_logit)`` of scaled live logits ``z``."""
    row_max = torch.amax(live, dim=1)
    shifted = shift_by_max(live, row_max)
    target_logit = owned_target_logit(live, targets, contract)
    return row_max, shifted, tree_sum(torch.exp(shifted)), target_logit


def _partial_zero_times_neg_inf(
    local_logits: torch.Tensor, targets: torch.Tensor, contract: LogprobContract
) -> torch.Tensor:
    dtype = compute_dtype(local_logits.dtype)
    width = live_width(contract)
    if width == 0:
        return _identity(local_logits.shape[0], local_logits, contract)
    # Padding made -inf in place (the masked_fill idiom) instead of sliced off.
    padding = torch.arange(local_logits.shape[1], device=local_logits.device) >= width
    live = scaled_logits(local_logits.to(dtype), contract).masked_fill(padding, _NEG_INF)
    row_max, shifted, sum_exp, target_logit = _partial(live, targets, contract)
    if not contract.export_entropy:
        return pack_partial(row_max, sum_exp, target_logit)
    entropy_sum = tree_sum(torch.exp(shifted) * shifted)  # BUG: exp(-inf) * -inf = 0 * -inf = NaN
    return pack_partial(row_max, sum_exp, target_logit, entropy_sum)


def _partial_entropy_over_padding(
    local_logits: torch.Tensor, targets: torch.Tensor, contract: LogprobContract
) -> torch.Tensor:
    dtype = compute_dtype(local_logits.dtype)
    width = live_width(contract)
    if width == 0:
        return _identity(local_logits.shape[0], local_logits, contract)
    live = scaled_logits(local_logits[:, :width].to(dtype), contract)
    row_max, _, sum_exp, target_logit = _partial(live, targets, contract)
    # BUG: the entropy term over the whole shard: padding columns are counted.
    shifted = shift_by_max(scaled_logits(local_logits.to(dtype), contract), row_max)
    return pack_partial(row_max, sum_exp, target_logit, _entropy_sum(shifted, contract))


def _partial_reciprocal(
    local_logits: torch.Tensor, targets: torch.Tensor, contract: LogprobContract
) -> torch.Tensor:
    dtype = compute_dtype(local_logits.dtype)
    width = live_width(contract)
    if width == 0:
        return _identity(local_logits.shape[0], local_logits, contract)
    inverse = torch.tensor(1.0 / contract.temperature_fp32, dtype=dtype, device=local_logits.device)
    live = local_logits[:, :width].to(dtype) * inverse  # BUG: x * fp32(1/T) is not x / T
    row_max, shifted, sum_exp, target_logit = _partial(live, targets, contract)
    return pack_partial(row_max, sum_exp, target_logit, _entropy_sum(shifted, contract))


def _forward_entropy_before_temperature(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    selected, lse, _ = native_forward(local_logits, targets, active, contract, group)
    raw = dataclasses.replace(contract, temperature=1.0)
    _, _, entropy = native_forward(local_logits, targets, active, raw, group)  # BUG: H(softmax(x))
    return selected, lse, entropy


def _forward_temperature_on_logprobs(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    raw = dataclasses.replace(contract, temperature=1.0)
    selected, lse, _ = native_forward(local_logits, targets, active, raw, group)
    _, _, entropy = native_forward(local_logits, targets, active, contract, group)
    t = contract.temperature_fp32
    return selected / t, lse / t, entropy  # BUG: log_softmax(x) / T, not log_softmax(x / T)


def _grad_nan_to_num(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    lse: torch.Tensor,
    grad_selected: torch.Tensor,
    contract: LogprobContract,
    entropy: torch.Tensor | None = None,
    grad_entropy: torch.Tensor | None = None,
) -> torch.Tensor:
    dtype = compute_dtype(local_logits.dtype)
    grad = torch.zeros(local_logits.shape, dtype=dtype, device=local_logits.device)
    width = live_width(contract)
    if width > 0:
        live = scaled_logits(local_logits[:, :width].to(dtype), contract)
        one_hot = target_one_hot(targets, contract, width, live.device)
        centred = live - lse.unsqueeze(1)
        probs = torch.exp(centred)
        probs = torch.where(torch.isfinite(lse).unsqueeze(1), probs, float("nan"))
        g = grad_selected.to(dtype).unsqueeze(1)
        live_grad = g * (one_hot.to(dtype) - probs)
        if grad_entropy is not None and entropy is not None:
            h = grad_entropy.to(dtype).unsqueeze(1)
            # p (z - LSE + H) unguarded: 0 * -inf = NaN on a -inf column ...
            live_grad = live_grad - h * probs * (centred + entropy.to(dtype).unsqueeze(1))
            # BUG: ... "fixed" by nan_to_num, which also zeroes the NaN rows and clips infinities.
            live_grad = torch.nan_to_num(live_grad)
        live_grad = scaled_logits(live_grad, contract)
        grad[:, :width] = torch.where(active.unsqueeze(1), live_grad, 0.0)
    return grad.to(local_logits.dtype)


def _entropy_rank0(partials: Sequence[torch.Tensor], active: torch.Tensor) -> torch.Tensor:
    # BUG: rank 0's shard entropy, never merged (every rank reads the same gathered partial).
    return merge_entropy(partials[:1], active)


entropy_zero_times_neg_inf = _rl_mutant(
    "entropy_zero_times_neg_inf", forward=forward_from(_partial_zero_times_neg_inf)
)
entropy_before_temperature = _rl_mutant(
    "entropy_before_temperature", forward=_forward_entropy_before_temperature
)
temperature_on_logprobs = _rl_mutant(
    "temperature_on_logprobs", forward=_forward_temperature_on_logprobs
)
entropy_grad_nan_to_num = _rl_mutant("entropy_grad_nan_to_num", grad=_grad_nan_to_num)
entropy_over_padding = _rl_mutant(
    "entropy_over_padding", forward=forward_from(_partial_entropy_over_padding)
)
entropy_unmerged = _rl_mutant(
    "entropy_unmerged", forward=forward_from(entropy_merge=_entropy_rank0)
)
temperature_reciprocal = _rl_mutant(
    "temperature_reciprocal", forward=forward_from(_partial_reciprocal)
)
