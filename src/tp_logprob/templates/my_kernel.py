"""A third-party vocab-parallel logprob backend, verified by tp-logprob's property suite.

This is what a kernel author outside this project writes: an op with the
standard signature, a capability that says which contracts it serves, and a
``register(registry)`` function the suite calls. Write a copy and verify it with::

    python -m tp_logprob template my_kernel.py
    pytest --pyargs tp_logprob.properties --tp-logprob-backend=my_kernel.py:register

The algorithm is the plain one of docs/semantics.md, in torch, on
``z = x / T``: each rank reduces its live columns to ``(max, sum exp(z - max),
target z, sum exp(z - max) (z - max))``, the partials are all-gathered and
merged in rank order. Role ``train`` goes through an autograd Function whose
backward is ``(g ([v == target] - p) - h p (z - LSE + H)) / T``.

It opts into temperature and entropy: ``supports_temperature=True`` and
``exports_entropy=True`` in the capability, ``z = x / T`` as one IEEE division
by a tensor (not a Python float, which CUDA would turn into a multiplication
by a rounded reciprocal), and ``LogprobResult(selected, lse, entropy)``.
"""

from __future__ import annotations

from typing import Any

import torch

import tp_logprob as tpl
from tp_logprob.kernels.validation import check_op_inputs

CAPABILITY = tpl.LogprobBackendCapability(
    backend_id="my_kernel",
    roles=frozenset({tpl.LogprobRole.TRAIN, tpl.LogprobRole.INFER}),
    dtypes=frozenset({tpl.LogprobDType.FP32, tpl.LogprobDType.BF16, tpl.LogprobDType.FP16}),
    cp_world_sizes=frozenset({1}),
    supports_vocab_padding=True,
    mask_modes=frozenset({tpl.MaskMode.EXPLICIT_ACTIVE_MASK}),
    exports_vocab_lse=True,
    determinism_scopes=frozenset({tpl.DeterminismScope.FIXED_TOPOLOGY}),
    supports_temperature=True,
    exports_entropy=True,
)


def my_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: tpl.LogprobContract,
    group: Any = None,
) -> tpl.LogprobResult:
    """One rank's ``(selected_logp, lse[, entropy])``; every rank gets the same bits."""
    active = check_op_inputs(local_logits, targets, contract, group)  # LogprobContractError
    if contract.role is tpl.LogprobRole.TRAIN:
        selected, lse, entropy = _Logprob.apply(local_logits, targets, active, contract, group)
    else:
        with torch.no_grad():
            selected, lse, entropy = _forward(local_logits, targets, active, contract, group)
    return tpl.LogprobResult(
        selected,
        lse if contract.export_lse else None,
        entropy if contract.export_entropy else None,
    )


def _live(local_logits: torch.Tensor, contract: tpl.LogprobContract) -> tuple[torch.Tensor, int]:
    """This rank's real (non-padding) columns as ``z = fp32(x) / fp32(T)``, and the first id.

    Row-major whatever the caller's layout: torch's row reductions pick their order by the
    tensor's strides, and a column-major view would sum a row in another order in a batch
    than alone, which breaks batch invariance."""
    start, live_end = contract.sharding.live_bounds()
    live = local_logits[:, : live_end - start].float()
    divisor = torch.tensor(contract.temperature_fp32, device=live.device)
    return (live / divisor).contiguous(), start


def _forward(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: tpl.LogprobContract,
    group: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    live, start = _live(local_logits, contract)
    rows = live.shape[0]
    if live.shape[1] == 0:  # a shard of padding only: the identity partial (-inf, 0, 0)
        row_max = torch.full((rows,), float("-inf"), device=live.device)
        sum_exp = moment = torch.zeros(rows, device=live.device)
    else:
        row_max = live.amax(dim=1)
        shift = torch.where(row_max == float("-inf"), 0.0, row_max)  # never -inf - -inf
        shifted = live - shift[:, None]
        weights = torch.exp(shifted)
        sum_exp = weights.sum(dim=1)
        # exp(d) * d is 0 * -inf = NaN for a -inf logit: its true contribution is 0.
        moment = torch.where(shifted == float("-inf"), 0.0, weights * shifted).sum(dim=1)
    owned = (targets >= start) & (targets < start + live.shape[1])
    local_target = (targets - start).clamp(0, max(live.shape[1] - 1, 0)).long()
    picked = live.gather(1, local_target[:, None])[:, 0] if live.shape[1] else sum_exp
    target_logit = torch.where(owned, picked, 0.0)
    partial = torch.stack((row_max, sum_exp, target_logit, moment), dim=1)
    partials = [partial] if group is None else group.all_gather(partial)
    maxima = torch.stack([p[:, 0] for p in partials])
    merged_max = maxima.amax(dim=0)
    finite = torch.isfinite(merged_max)
    total = torch.zeros(rows, device=live.device)
    moments = torch.zeros(rows, device=live.device)
    for p in partials:  # rank order, so every rank adds in the same order
        gap = p[:, 0] - merged_max
        scale = torch.exp(gap)
        # A shard whose rescale underflows to 0 adds nothing, and must not: gap * s can
        # overflow fp32 there (m_r = -1e38, M = 1e38), and 0 * -inf is NaN.
        alive = finite & (p[:, 0] != float("-inf")) & (scale > 0.0)
        total = total + torch.where(alive, p[:, 1] * scale, 0.0)
        moments = moments + torch.where(alive, scale * (p[:, 3] + gap * p[:, 1]), 0.0)
    lse = torch.where(merged_max == float("inf"), merged_max, merged_max + torch.log(total))
    lse = torch.where(merged_max == float("-inf"), merged_max, lse)
    entropy = torch.where(finite, torch.log(total) - moments / total, float("nan"))
    ends = torch.tensor(
        [end for _, end in contract.sharding.vocab_shard_bounds], device=live.device
    )
    # Targets may arrive as a strided view, which bucketize reads only with a warning.
    owner = torch.bucketize(targets.contiguous(), ends, right=True).clamp(0, len(partials) - 1)
    target = torch.stack([p[:, 2] for p in partials]).gather(0, owner[None, :].long())[0]
    selected = torch.where(lse == float("inf"), float("nan"), target - lse)
    return torch.where(active, selected, 0.0), lse, torch.where(active, entropy, 0.0)


class _Logprob(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, local_logits: Any, targets: Any, active: Any, contract: Any, group: Any
    ) -> Any:
        selected, lse, entropy = _forward(local_logits, targets, active, contract, group)
        ctx.save_for_backward(local_logits, targets, active, lse, entropy)
        ctx.contract = contract
        ctx.mark_non_differentiable(lse)
        return selected, lse, entropy

    @staticmethod
    def backward(ctx: Any, grad_selected: Any, _grad_lse: Any, grad_entropy: Any) -> Any:
        local_logits, targets, active, lse, entropy = ctx.saved_tensors
        live, start = _live(local_logits, ctx.contract)
        grad = torch.zeros(local_logits.shape, device=local_logits.device)
        columns = torch.arange(live.shape[1], device=live.device) + start
        one_hot = (columns[None, :] == targets[:, None]).float()
        centred = live - lse[:, None]
        probs = torch.exp(centred)
        probs = torch.where(torch.isfinite(lse)[:, None], probs, float("nan"))  # NaN rows
        spread = torch.where(probs == 0.0, 0.0, probs * (centred + entropy[:, None]))
        live_grad = grad_selected[:, None] * (one_hot - probs) - grad_entropy[:, None] * spread
        live_grad = live_grad / torch.tensor(ctx.contract.temperature_fp32, device=live.device)
        grad[:, : live.shape[1]] = torch.where(active[:, None], live_grad, 0.0)
        return grad.to(local_logits.dtype), None, None, None, None


def register(registry: tpl.KernelRegistry) -> None:
    """Register ``my_kernel`` on every platform (the suite picks the one it runs on)."""
    for platform in ("cpu", "cuda", "rocm"):
        registry.register_logprob_backend(platform, lambda: my_logprob, CAPABILITY)
