"""The support of sampling parameters, vocab-parallel: one threshold ``tau`` per row.

``docs/semantics.md``, "Processed logprobs": min-p, then top-k, then top-p each
keep an upper set of the tempered logits ``z``, so a row's support is
``S = {live v : z_v >= tau}``. :func:`support_threshold` finds ``tau`` and ``|S|``
from one rank's live ``z`` without gathering the vocabulary. Every collective is
one ``group.all_gather`` of a small per-row tensor that every rank folds the same
way, so the results are the same bits on every rank, for every shard layout, and
a row's result depends on that row alone (maxima, minima and top-k values are
exact, masses are int64 sums, ``exp`` is elementwise).

Steps, each skipped when its rule is off (min-p at 0, top-p at 1, top-k at least
the live vocabulary); ``M`` is the row's maximum over every rank's live columns:

1. Row extremes, one all-gather of ``[N, 2]``: ``M`` and the minimum. A row whose
   ``M`` is not finite (a NaN or ``+inf`` live value, or no finite one) has no
   support: ``tau`` NaN, ``|S| = 0``. With every rule off this is the only
   collective: ``tau`` is the minimum and ``|S|`` the live vocabulary.
2. min-p: each rank keeps ``exp(z - M) >= min_p`` (fp32 ``exp``; compared exactly,
   with the least fp32 not below the float64 ``min_p``) and contributes the least
   kept ``z``; their minimum is ``tau_1`` (one all-gather). The survivors are
   ``{z >= tau_1}``, an upper set closed under ties even where ``exp`` is not
   monotone.
3. top-k, ``k <= CANDIDATES``: each rank's ``k`` largest survivors (``-inf``
   padded), one all-gather of ``[N, k]``; the k-th largest of all of them with
   multiplicity is ``tau_2`` (every survivor when fewer than ``k``). A larger
   ``k`` takes the radix select of ``kernels/radix_select.py`` (4 all-gathers).
4. top-p over the survivors ``S_2``, with fixed-point masses
   ``floor(exp(z - M) 2^K)`` (``kernels/fixed_point.py``) whose int64 sums are
   exact: each rank sends its ``CANDIDATES`` largest survivors, its survivors'
   total mass (over the candidates alone when they are all its survivors, the
   usual case after top-k) and its survivor count: one all-gather of
   ``[N, CANDIDATES + 2]`` int64. Every rank recomputes the candidates' masses,
   and ``tau_3`` is the least candidate whose strictly larger candidates weigh
   ``< top_p Z`` (``Z`` the survivors' total; one float64 comparison of
   integers). That is exact where ``tau_3`` lies above every truncated rank's
   least candidate and the candidates at or above it reach ``top_p Z``; the rows
   where it is not (a nucleus wider than a rank's candidates) go to the radix
   select over the masses, the same rows on every rank (4 more all-gathers).

``|S|`` is one more all-gather of counts when min-p or top-k is the last rule on
(top-p and the radix selects count as they select). Collectives for fp32 with
``min_p``, ``top_k <= 256`` and ``top_p``: 4 (8 when some row's nucleus outgrows
a rank's candidates). Host syncs: whether any row lacks a support, and whether top-p
needs the radix select. Memory: a few ``[N, w]`` temporaries (fp32, bool, and int64
masses only where a rank's survivors outnumber its candidates),
``[N, R CANDIDATES]`` gathered candidates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tp_logprob.comm import GroupHandle
from tp_logprob.contract import LogprobContract
from tp_logprob.errors import LogprobContractError
from tp_logprob.kernels.fixed_point import fixed_point_terms, fraction_bits
from tp_logprob.kernels.merge import gather
from tp_logprob.kernels.radix_select import (
    float_keys,
    key_passes,
    keys_to_float,
    radix_kth,
    radix_top_p,
)
from tp_logprob.support import SupportMode

__all__ = ["CANDIDATES", "SamplingRules", "sampling_rules", "support_threshold"]

CANDIDATES = 256
"""Values per rank and row that the candidate selections gather: top-k with ``k`` up to
this, and top-p. Top-k's ``k`` fp32 values are at most half the bytes of one radix pass
(256 int64 counts), and one all-gather instead of four."""

_INF = float("inf")


@dataclass(frozen=True)
class SamplingRules:
    """The rules of a support that can change ``S`` (None: off), in the order applied."""

    min_p: float | None
    top_k: int | None
    top_p: float | None

    @property
    def all_off(self) -> bool:
        """True when ``S`` is every live column."""
        return (self.min_p, self.top_k, self.top_p) == (None, None, None)


def sampling_rules(contract: LogprobContract) -> SamplingRules:
    """The contract's sampling parameters, each None where it keeps every token.

    min-p at 0, top-p at 1 and top-k at least ``real_vocab_size`` are off (as in vLLM).
    """
    support = contract.support
    if support is None or support.mode is not SupportMode.SAMPLING_PARAMS:
        mode = contract.support_mode.value
        raise LogprobContractError(
            f"support_mode={mode!r}: a support threshold needs sampling parameters"
        )
    real = contract.sharding.real_vocab_size
    top_k, top_p, min_p = support.batch_rules()
    return SamplingRules(
        min_p=min_p if min_p else None,
        top_k=top_k if top_k is not None and top_k < real else None,
        top_p=top_p if top_p is not None and top_p < 1.0 else None,
    )


def support_threshold(
    z: torch.Tensor, contract: LogprobContract, group: GroupHandle | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tau, size)`` of every row from this rank's live tempered logits ``z`` (``[N, w]``).

    ``tau`` (``z``'s dtype: fp32, or float64 on the gradcheck path) is the smallest
    kept value, never ``-0.0``, so the support is ``{live v : z_v >= tau}``; NaN
    where the row has no support (a NaN or ``+inf`` live value, or no finite one).
    ``size`` is int64 ``|S|`` (0 there). Every rank passes its own ``z`` (``w`` may
    be 0) and gets the same bits; ``group=None`` is TP = 1. Example, on rank r::

        z = live_logits(local_logits, contract)   # kernels/partials.py
        tau, size = support_threshold(z, contract, group)
        keep = threshold_keep(z, tau)             # kernels/support_mask.py
    """
    rules = sampling_rules(contract)
    row_max, row_min = _row_extremes(z, group)
    defined = torch.isfinite(row_max)
    if rules.all_off:
        live = torch.full_like(row_max, contract.sharding.real_vocab_size, dtype=torch.int64)
        return _finish(row_min, live, defined)
    if not bool(defined.all()):  # rows without support: any values that keep the steps valid
        z = torch.where(defined.unsqueeze(1), z, 0.0)
        row_max = torch.where(defined, row_max, 0.0)
    tau: torch.Tensor | None = None
    size: torch.Tensor | None = None
    if rules.min_p is not None:
        kept = torch.exp(z - row_max.unsqueeze(1)) >= _least_not_below(rules.min_p, z)
        tau = _canonical(_gathered_min(torch.where(kept, z, _INF), group))
        if rules.top_k is None and rules.top_p is None:
            size = _gathered_count(z >= tau.unsqueeze(1), group)
    if rules.top_k is not None:
        tau, size = _top_k(z, tau, rules.top_k, rules.top_p is None, group)
    if rules.top_p is not None:
        bits = fraction_bits(contract.sharding.padded_vocab_size)
        tau, size = _top_p(z, row_max, tau, rules.top_p, bits, group)
    if tau is None or size is None:
        raise AssertionError(f"{rules}: some rule is on, and the last one counts |S|")
    return _finish(tau, size, defined)


def _finish(
    tau: torch.Tensor, size: torch.Tensor, defined: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.where(defined, _canonical(tau), float("nan")), torch.where(defined, size, 0)


def _canonical(values: torch.Tensor) -> torch.Tensor:
    """``values`` with ``-0.0`` as ``+0.0``."""
    return torch.where(values == 0.0, 0.0, values)


def _least_not_below(threshold: float, like: torch.Tensor) -> torch.Tensor:
    """The least value of ``like``'s dtype that is ``>= threshold``, as a 0-dim tensor, so
    that ``x >= it`` in that dtype is ``x >= threshold`` exactly."""
    dtype = np.float32 if like.dtype == torch.float32 else np.float64
    value = dtype(threshold)
    if value < threshold:
        value = np.nextafter(value, dtype(np.inf))
    return torch.tensor(float(value), dtype=like.dtype, device=like.device)


def _row_extremes(z: torch.Tensor, group: GroupHandle | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's max (NaN when any live value is NaN) and min over every rank's ``z``."""
    rows, width = z.shape
    if width == 0:
        local = torch.tensor([-_INF, _INF], dtype=z.dtype, device=z.device).expand(rows, 2)
    else:
        local = torch.stack([torch.amax(z, dim=1), torch.amin(z, dim=1)], dim=1)
    stacked = torch.stack(gather(local.contiguous(), group))  # [R, N, 2]
    return stacked[..., 0].amax(dim=0), stacked[..., 1].amin(dim=0)


def _gathered_min(values: torch.Tensor, group: GroupHandle | None) -> torch.Tensor:
    """The least of each row's ``values`` (``[N, w]``) over every rank; ``+inf`` for none."""
    rows, width = values.shape
    local = values.amin(dim=1) if width else values.new_full((rows,), _INF)
    return torch.stack(gather(local, group)).amin(dim=0)


def _gathered_count(mask: torch.Tensor, group: GroupHandle | None) -> torch.Tensor:
    """int64 count of each row's True entries over every rank."""
    return torch.stack(gather(mask.sum(dim=1, dtype=torch.int64), group)).sum(dim=0)


def _local_top(values: torch.Tensor, count: int) -> torch.Tensor:
    """Each row's ``count`` largest ``values``, in descending order, ``-inf`` padded."""
    rows, width = values.shape
    top = torch.topk(values, min(count, width), dim=1).values if width else values[:, :0]
    if top.shape[1] < count:
        pad = top.new_full((rows, count - top.shape[1]), -_INF)
        top = torch.cat([top, pad], dim=1)
    return top


def _survivors(z: torch.Tensor, floor: torch.Tensor | None) -> torch.Tensor | None:
    return None if floor is None else z >= floor.unsqueeze(1)


def _top_k(
    z: torch.Tensor, floor: torch.Tensor | None, top_k: int, count: bool, group: GroupHandle | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The k-th largest survivor (``z >= floor``) with multiplicity, and (``count``) how
    many survivors lie at or above it."""
    survivors = _survivors(z, floor)
    if top_k > CANDIDATES:
        everyone = torch.ones_like(z, dtype=torch.bool) if survivors is None else survivors
        key, size = radix_kth(float_keys(z), everyone, top_k, key_passes(z.dtype), group)
        return keys_to_float(key, z.dtype), size
    values = z if survivors is None else torch.where(survivors, z, -_INF)
    gathered = torch.cat(gather(_local_top(values, top_k), group), dim=1)
    kth = torch.topk(gathered, top_k, dim=1).values[:, -1]
    if floor is not None:  # min-p keeps no -inf: a -inf k-th means fewer than k survivors
        kth = torch.where(kth == -_INF, floor, kth)
    kth = _canonical(kth)
    return kth, _gathered_count(z >= kth.unsqueeze(1), group) if count else None


def _top_p(
    z: torch.Tensor,
    row_max: torch.Tensor,
    floor: torch.Tensor | None,
    top_p: float,
    bits: int,
    group: GroupHandle | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """top-p's threshold over the survivors (``z >= floor``) and the support's size."""
    survivors = _survivors(z, floor)
    values = z if survivors is None else torch.where(survivors, z, -_INF)
    rows, width = z.shape
    counts = z.new_full((rows,), width, dtype=torch.int64)
    if survivors is not None:
        counts = survivors.sum(dim=1, dtype=torch.int64)
    top = _local_top(values, CANDIDATES)
    if bool((counts > CANDIDATES).any()):  # a rank's own decision: no collective depends on it
        total = _masses(z, row_max, survivors, bits).sum(dim=1)
    else:  # every survivor is a candidate (the -inf padding weighs 0)
        total = _masses(top, row_max, None, bits).sum(dim=1)
    local = torch.cat([_as_int64(top), total.unsqueeze(1), counts.unsqueeze(1)], dim=1)
    parts = torch.stack(gather(local, group))  # [R, N, CANDIDATES + 2]
    candidates = _as_float(parts[..., :CANDIDATES], z.dtype)  # [R, N, CANDIDATES]
    limit = top_p * parts[..., CANDIDATES].sum(dim=0).to(torch.float64)
    truncated = parts[..., CANDIDATES + 1] > CANDIDATES
    lowest = torch.where(truncated, candidates[..., -1], -_INF).amax(dim=0)
    pooled = torch.cat(candidates.unbind(0), dim=1)  # [N, R CANDIDATES]
    tau, size, reached = _nucleus(pooled, row_max, limit, bits)
    exact = (tau > lowest) & (reached | ~truncated.any(dim=0))
    if bool(exact.all()):
        return tau, size
    # The same rows on every rank (decided from gathered values) go to the radix select.
    redo = torch.nonzero(~exact).squeeze(1)
    kept = None if survivors is None else survivors[redo]
    masses = _masses(z[redo], row_max[redo], kept, bits)
    everyone = torch.ones_like(masses, dtype=torch.bool) if kept is None else kept
    passes = key_passes(z.dtype)
    key, count = radix_top_p(float_keys(z[redo]), everyone, masses, top_p, passes, group)
    return tau.index_put((redo,), keys_to_float(key, z.dtype)), size.index_put((redo,), count)


def _masses(
    values: torch.Tensor, row_max: torch.Tensor, survivors: torch.Tensor | None, bits: int
) -> torch.Tensor:
    """int64 ``floor(exp(values - M) 2^bits)``, 0 outside ``survivors``."""
    masses = fixed_point_terms(torch.exp(values - row_max.unsqueeze(1)), bits)
    return masses if survivors is None else torch.where(survivors, masses, 0)


def _nucleus(
    candidates: torch.Tensor, row_max: torch.Tensor, limit: torch.Tensor, bits: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Over the pooled candidates: the least one whose strictly larger ones weigh
    ``< limit``, how many lie at or above it, and whether those reach ``limit``."""
    ascending = torch.sort(candidates, dim=1).values.contiguous()  # searchsorted wants it
    masses = fixed_point_terms(torch.exp(ascending - row_max.unsqueeze(1)), bits)
    running = torch.cumsum(masses, dim=1)
    past_ties = torch.searchsorted(ascending, ascending, right=True)  # >= 1
    above = running[:, -1:] - running.gather(1, past_ties - 1)
    kept = above.to(torch.float64) < limit.unsqueeze(1)
    tau = _canonical(torch.where(kept, ascending, _INF).amin(dim=1))
    at_or_above = ascending >= tau.unsqueeze(1)
    reached = torch.where(at_or_above, masses, 0).sum(dim=1).to(torch.float64) >= limit
    return tau, at_or_above.sum(dim=1), reached


def _as_int64(values: torch.Tensor) -> torch.Tensor:
    """The bits of fp32 or float64 ``values`` in int64 (fp32 bits sign-extended)."""
    if values.dtype == torch.float32:
        return values.view(torch.int32).to(torch.int64)
    return values.view(torch.int64)


def _as_float(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of :func:`_as_int64`."""
    if dtype == torch.float32:
        return bits.to(torch.int32).view(torch.float32)
    return bits.contiguous().view(torch.float64)
