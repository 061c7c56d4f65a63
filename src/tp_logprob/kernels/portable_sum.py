"""``torch_portable``: ``triton_portable``'s forward in torch, for the same bits on CPU.

The same steps as the Triton kernels, each an fp32 or fp64 torch op that rounds
correctly (no fma, no libm or SLEEF call; ``kernels/portable.py``), so the outputs are
the bits ``triton_portable`` gives under the interpreter and on every GPU:

1. ``z = fp32(x) / fp32(T)``; per row, ``m_r`` the max over live columns (NaN if one is
   NaN) and ``t_r`` the owned target's ``z``; all-gathered; ``M = max_r m_r``.
2. Where ``M`` is finite: ``floor(portable_exp(z - M) 2^K)`` as int64, summed (and with
   entropy ``portable_exp(d) d 2^K`` truncated toward zero); all-gathered and added.
3. In fp64: ``S = S_int 2^-K``, ``LSE = M + portable_log(S)``,
   ``selected = (t - M) - portable_log(S)``, ``entropy = portable_log(S) - Q / S``, each
   rounded once to fp32 and then to the output dtype; the special values of
   ``docs/semantics.md``. ``M = -0`` counts as ``+0``, as in the kernels.

Integer sums are exact in any order, so ``torch.sum`` may split them as it likes. The
full vocabulary and role ``infer`` only: no support, no backward.
"""

from __future__ import annotations

import torch

from tp_logprob.comm import GroupHandle
from tp_logprob.contract import LogprobContract, LogprobResult, LogprobRole
from tp_logprob.errors import LogprobContractError
from tp_logprob.kernels.dtypes import TORCH_DTYPES
from tp_logprob.kernels.fixed_point import fraction_bits
from tp_logprob.kernels.merge import gather
from tp_logprob.kernels.partials import live_logits, owned_target_logit
from tp_logprob.kernels.portable import portable_exp, portable_log
from tp_logprob.kernels.results import cast_outputs, exported_result
from tp_logprob.kernels.shards import owner_ranks
from tp_logprob.kernels.validation import check_op_inputs

__all__ = ["portable_outputs", "torch_portable_logprob"]

_NEG_INF = float("-inf")
_NAN = float("nan")


def torch_portable_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: GroupHandle | None = None,
) -> LogprobResult:
    """One rank's ``(selected_logp, lse[, entropy])``, bit for bit ``triton_portable``'s.

    >>> # result = torch_portable_logprob(local_logits, targets, contract, group=handle)
    """
    active = check_op_inputs(local_logits, targets, contract, group)
    if contract.role is LogprobRole.TRAIN:
        raise LogprobContractError(
            "role='train': torch_portable computes the forward only (role 'infer')"
        )
    if contract.support is not None:
        raise LogprobContractError(
            f"support={contract.support!r}: torch_portable serves the full vocabulary only"
        )
    with torch.no_grad():
        outputs = portable_outputs(local_logits, targets, active, contract, group)
    return exported_result(contract, *cast_outputs(outputs, TORCH_DTYPES[contract.output.dtype]))


def portable_outputs(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: GroupHandle | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 ``(selected_logp, lse, entropy)``; ``entropy`` empty unless exported."""
    z = live_logits(local_logits, contract).to(torch.float32)
    stage = torch.stack(_rank_stage(z, targets, contract), dim=1)
    gathered = torch.stack(gather(stage.contiguous(), group))  # [R, N, 2]
    maxima = gathered[..., 0]
    has_nan = torch.isnan(maxima).any(dim=0)
    maximum = torch.where(torch.isnan(maxima), _NEG_INF, maxima).amax(dim=0)
    finite = torch.isfinite(maximum) & ~has_nan

    bits = fraction_bits(contract.sharding.padded_vocab_size)
    shifted = torch.where(
        finite.unsqueeze(1), z - torch.where(finite, maximum, 0.0).unsqueeze(1), _NEG_INF
    )
    weights = portable_exp(shifted)
    scale = float(2**bits)
    fields = [(weights * scale).to(torch.int64).sum(dim=1)]
    if contract.export_entropy:
        moment = weights * torch.where(shifted > _NEG_INF, shifted, 0.0)
        fields.append((moment * scale).to(torch.int64).sum(dim=1))
    sums = torch.stack(gather(torch.stack(fields, dim=1).contiguous(), group)).sum(dim=0)

    inv_scale = float(2.0**-bits)
    total = torch.where(finite, sums[:, 0].to(torch.float64) * inv_scale, 1.0)
    log_total = portable_log(total)
    shift = torch.where(finite, maximum, 0.0).to(torch.float64) + 0.0
    special = torch.where(has_nan, _NAN, maximum)
    lse = torch.where(finite, (shift + log_total).to(torch.float32), special)
    owners = owner_ranks(targets, contract).long()
    target_logit = gathered[..., 1].gather(0, owners.unsqueeze(0)).squeeze(0)
    relative = (target_logit.to(torch.float64) - shift) - log_total
    selected = torch.where(finite, relative.to(torch.float32), _NAN)
    selected = torch.where(active, selected, 0.0)
    entropy = selected.new_empty(0)
    if contract.export_entropy:
        moment_total = sums[:, 1].to(torch.float64) * inv_scale
        entropy64 = log_total - moment_total / total
        entropy = torch.where(finite, entropy64.to(torch.float32), _NAN)
        entropy = torch.where(active, entropy, 0.0)
    return selected, lse, entropy


def _rank_stage(
    z: torch.Tensor, targets: torch.Tensor, contract: LogprobContract
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(m_r, t_r)``: the max of the live ``z`` (NaN if one is NaN, ``-inf`` with no live
    column) and the owned target's ``z`` (0 where another rank owns it)."""
    if z.shape[1] == 0:
        return z.new_full((z.shape[0],), _NEG_INF), z.new_zeros(z.shape[0])
    nan = torch.isnan(z)
    rank_max = torch.where(nan, _NEG_INF, z).amax(dim=1)
    rank_max = torch.where(nan.any(dim=1), _NAN, rank_max)
    return rank_max, owned_target_logit(z, targets, contract)
