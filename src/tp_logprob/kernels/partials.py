"""One rank's share of the logprob in plain torch: its partial, and its local gradient.

torch_native reduces a rank's logits to this partial, torch_native_fused reduces
each chunk of LM-head logits to it, both backwards write the same local gradient,
and the planted-bug backends (``tests/mutants``) copy these steps with one change.

The partial is ``(m_r, s_r, t_r[, q_r])`` (``merge.pack_partial``'s layout) over
the live columns only (padding columns are sliced off, whatever they hold), all in
``promote(dtype, fp32)`` on ``z = x / T``. ``s_r`` is a fixed pairwise tree of
elementwise adds over the shard width padded with zeros to a power of two, never
``torch.sum``: torch's reductions change how they split the reduced dimension with
N and with thread count, elementwise ops do not, so a row's bits never depend on
the other rows. ``max`` is exact in any order.

Temperature: ``z = fp32(x) / fp32(T)``, divided by a 0-dim tensor on the logits'
device. (A Python-scalar divisor would let CUDA multiply by a rounded reciprocal,
which is not the contract's IEEE division.) ``T = 1`` skips the division, which is
exact anyway.
"""

from __future__ import annotations

import torch

from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.merge import pack_partial
from tp_logprob.kernels.shards import live_width, owned_local_targets

__all__ = [
    "compute_dtype",
    "identity_partial",
    "live_logits",
    "live_partial",
    "local_grad",
    "local_partial",
    "owned_target_logit",
    "scaled_logits",
    "shift_by_max",
    "sparse_tree_sum",
    "target_one_hot",
    "tree_sum",
]

_NEG_INF = float("-inf")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype partials and gradients are computed in: fp32, or float64 for float64 input."""
    return torch.promote_types(dtype, torch.float32)


def tree_sum(values: torch.Tensor) -> torch.Tensor:
    """Row sums of ``[N, W]`` by a fixed pairwise tree of elementwise adds.

    The tree depends only on ``W``, so each row's bits are independent of N, of
    the other rows and of the device's reduction strategy.
    """
    width = values.shape[1]
    size = 1 << (width - 1).bit_length()
    if size != width:
        values = torch.nn.functional.pad(values, (0, size - width))
    while size > 1:
        size //= 2
        values = values[:, :size] + values[:, size:]
    return values[:, 0]


def sparse_tree_sum(
    rows: torch.Tensor, places: torch.Tensor, values: torch.Tensor, num_rows: int, width: int
) -> torch.Tensor:
    """:func:`tree_sum` of ``[num_rows, width]`` rows that are 0 except ``values`` at
    ``(rows, places)`` (each at most once), bitwise, in O(entries) instead of O(width).

    Each level of the tree adds column ``i + size`` into column ``i``; a zero adds exactly
    nothing, so a column with one entry carries it unchanged and two entries meet in the
    same ``fl(a + b)`` (addition is commutative). Only a zero's sign could differ, and a
    sum of same-signed terms (exps, or entropy terms that are all ``<= 0`` with a ``+0``
    at the row's maximum) is never a signed zero the dense tree would not give."""
    size = 1 << max(width - 1, 0).bit_length()
    rows, places = rows.long(), places.long()
    while size > 1:
        size //= 2
        keys = rows * size + places % size
        keys, order = torch.sort(keys, stable=True)
        values = values[order]
        keys, counts = torch.unique_consecutive(keys, return_counts=True)
        first = torch.cumsum(counts, 0) - counts
        pairs = counts == 2
        merged = values[first].clone()
        merged[pairs] = values[first[pairs]] + values[first[pairs] + 1]
        rows, places, values = keys // size, keys % size, merged
    found = torch.zeros(num_rows, dtype=values.dtype, device=values.device)
    found[rows] = values
    return found


def scaled_logits(live: torch.Tensor, contract: LogprobContract, begin: int = 0) -> torch.Tensor:
    """``z = x / fp32(T)`` in ``live``'s (compute) dtype, one IEEE division per element; with a
    per-row temperature each row by its own (``live`` holds the batch's rows from ``begin``)."""
    if isinstance(contract.temperature, tuple):
        divisors = contract.row_divisors()[begin : begin + live.shape[0]]
        return live / torch.from_numpy(divisors).to(live.device, live.dtype).unsqueeze(1)
    if contract.temperature == 1.0:
        return live
    divisor = torch.tensor(contract.temperature_fp32, dtype=live.dtype, device=live.device)
    return live / divisor


def identity_partial(
    rows: int, dtype: torch.dtype, device: torch.device, *, entropy: bool
) -> torch.Tensor:
    """The partial of a shard with no live column: ``(-inf, 0, 0[, 0])`` on every row."""
    full = torch.full((rows,), _NEG_INF, dtype=dtype, device=device)
    zeros = torch.zeros(rows, dtype=dtype, device=device)
    return pack_partial(full, zeros, zeros, zeros if entropy else None)


def shift_by_max(live: torch.Tensor, row_max: torch.Tensor) -> torch.Tensor:
    """``live - row_max`` per row; a row whose max is ``-inf`` is shifted by 0 instead.

    ``exp(-inf - -inf)`` is NaN; an all ``-inf`` row's terms are all 0 either way.
    """
    shift = torch.where(row_max == _NEG_INF, 0.0, row_max)
    return live - shift.unsqueeze(1)


def owned_target_logit(
    live: torch.Tensor, targets: torch.Tensor, contract: LogprobContract
) -> torch.Tensor:
    """Each row's target logit where this rank's live columns hold the target, else 0."""
    owned, local = owned_local_targets(targets, contract)
    target_logit = live.gather(1, local.unsqueeze(1)).squeeze(1)
    return torch.where(owned, target_logit, 0.0)


def target_one_hot(
    targets: torch.Tensor, contract: LogprobContract, width: int, device: torch.device
) -> torch.Tensor:
    """bool ``[N, width]``: ``[v == target]`` over this rank's first ``width`` columns."""
    owned, local = owned_local_targets(targets, contract)
    columns = torch.arange(width, device=device)
    return (columns.unsqueeze(0) == local.unsqueeze(1)) & owned.unsqueeze(1)


def live_logits(local_logits: torch.Tensor, contract: LogprobContract) -> torch.Tensor:
    """This rank's live tempered logits ``z = x / T``, ``[N, live_width]`` in the compute dtype."""
    dtype = compute_dtype(local_logits.dtype)
    return scaled_logits(local_logits[:, : live_width(contract)].to(dtype), contract)


def live_partial(
    live: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    *,
    entropy: bool | None = None,
) -> torch.Tensor:
    """The packed ``(m_r, s_r, t_r[, q_r])`` of live tempered logits ``live`` (``[N, w]``).

    ``q_r`` is added when ``entropy`` (default: ``contract.export_entropy``); ``w = 0``
    gives the identity partial. A processed op passes ``z`` with the columns outside
    its support set to ``-inf``, which is how padding counts.
    """
    entropy = contract.export_entropy if entropy is None else entropy
    if live.shape[1] == 0:
        return identity_partial(live.shape[0], live.dtype, live.device, entropy=entropy)
    row_max = torch.amax(live, dim=1)  # NaN propagates; an all -inf row gives -inf
    shifted = shift_by_max(live, row_max)
    terms = torch.exp(shifted)
    sum_exp = tree_sum(terms)
    target_logit = owned_target_logit(live, targets, contract)
    entropy_sum = None
    if entropy:
        # exp(d) * d with d = -inf is 0 * -inf: a -inf column adds exactly 0 instead.
        entropy_sum = tree_sum(torch.where(shifted == _NEG_INF, 0.0, terms * shifted))
    return pack_partial(row_max, sum_exp, target_logit, entropy_sum)


def local_partial(
    local_logits: torch.Tensor, targets: torch.Tensor, contract: LogprobContract
) -> torch.Tensor:
    """This rank's packed ``(m_r, s_r, t_r[, q_r])``; the identity ``(-inf, 0, 0[, 0])``
    with no live column. ``q_r = sum exp(z - m_r) (z - m_r)``, where a ``-inf``
    column adds exactly 0."""
    return live_partial(live_logits(local_logits, contract), targets, contract)


def local_grad(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    lse: torch.Tensor,
    grad_selected: torch.Tensor,
    contract: LogprobContract,
    entropy: torch.Tensor | None = None,
    grad_entropy: torch.Tensor | None = None,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(g ([v == target] - p) - h p (z - LSE + H)) / T`` on live columns of active rows.

    ``p = exp(z - LSE)`` from the merged LSE (and entropy ``H``), so no collective.
    Exactly 0 on padding columns and inactive rows; the entropy term is 0 where
    ``p`` is 0 (a ``-inf`` column), never ``0 * -inf``. In ``local_logits``' dtype.

    With a sampling support, ``keep`` (bool ``[N, live_width]``) is the rank's part of
    ``S`` and ``lse`` / ``entropy`` are ``LSE_S`` and the entropy over ``S``: the
    gradient of ``z_y - LSE_S`` with ``S`` held fixed, exactly 0 on every column
    outside ``S``, the target's included. ``keep=None`` is every live column.
    """
    dtype = compute_dtype(local_logits.dtype)
    grad = torch.zeros(local_logits.shape, dtype=dtype, device=local_logits.device)
    width = live_width(contract)
    if width > 0:
        live = scaled_logits(local_logits[:, :width].to(dtype), contract)
        one_hot = target_one_hot(targets, contract, width, live.device)
        if keep is not None:  # columns outside S count as -inf, and get 0 below
            live = torch.where(keep, live, _NEG_INF)
        centred = live - lse.unsqueeze(1)
        probs = torch.exp(centred)
        # A row whose selected_logp is NaN (LSE NaN, +inf or -inf) gets NaN on every live
        # column, as torch's log_softmax backward gives; exp(x - inf) alone would give 0.
        probs = torch.where(torch.isfinite(lse).unsqueeze(1), probs, float("nan"))
        g = grad_selected.to(dtype).unsqueeze(1)
        live_grad = g * (one_hot.to(dtype) - probs)
        if grad_entropy is not None and entropy is not None:
            h = grad_entropy.to(dtype).unsqueeze(1)
            spread = probs * (centred + entropy.to(dtype).unsqueeze(1))
            live_grad = live_grad - h * torch.where(probs == 0.0, 0.0, spread)
        live_grad = scaled_logits(live_grad, contract)
        written = active.unsqueeze(1) if keep is None else active.unsqueeze(1) & keep
        grad[:, :width] = torch.where(written, live_grad, 0.0)
    return grad.to(local_logits.dtype)
