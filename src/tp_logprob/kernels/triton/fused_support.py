"""The fused LM head's support: a recomputed threshold from chunks of logits, or a packed mask.

``docs/semantics.md``, "Processed logprobs"; ``docs/fused-lm-head.md``, "Sampling
supports". A replayed mask needs no logits: ``support_inputs.plan_support`` packs the
rank's kept ids into bits, and the fused kernels test each logits tile's columns
against them. Sampling parameters need each row's threshold before the fused
partials run, and the threshold needs the rank's live ``z``:
:func:`fused_threshold` forms it chunk by chunk (``fused_logits``: the forward's
tiles, so the forward's bits; then ``z = x / T`` in torch, one IEEE division as in
the kernels) and runs the shared ``support_threshold`` on each chunk. Its
collectives run per chunk, so every rank walks the chunks of
``fused_chunks.shared_chunk_rows`` (the group's widest live shard), as torch_native_fused
does: the same number of collectives on every rank, a rank without live columns
included. Memory: one fp32 ``[shared_chunk_rows, live]`` buffer (at most
``fused_chunks.CHUNK_ELEMENTS`` elements) and the threshold's temporaries of that size,
never ``[N, live]``. Cost: one more pass of the LM-head matmul over the rank's
columns, and the threshold's collectives per chunk.
"""

from __future__ import annotations

import torch

from tp_logprob.comm import GroupHandle
from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.fused_chunks import row_chunks, shared_chunk_rows
from tp_logprob.kernels.partials import scaled_logits
from tp_logprob.kernels.support_threshold import support_threshold
from tp_logprob.kernels.triton.fused_logits import fused_logits
from tp_logprob.kernels.triton.inputs import RankInputs
from tp_logprob.kernels.triton.support_inputs import SupportPlan, plan_support

__all__ = ["fused_support", "fused_threshold"]


def fused_support(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    inputs: RankInputs,
    contract: LogprobContract,
    group: GroupHandle | None,
) -> SupportPlan | None:
    """The support of a fused op's contract (None without one)."""
    return plan_support(
        contract,
        hidden.device,
        lambda: fused_threshold(hidden, weight, bias, inputs, contract, group),
    )


def fused_threshold(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    inputs: RankInputs,
    contract: LogprobContract,
    group: GroupHandle | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tau, |S|)`` of every row, from the logits of chunks of ``shared_chunk_rows`` rows."""
    rows, width = inputs.num_rows, inputs.live_width
    step = shared_chunk_rows(contract)
    buffer = torch.empty((step, width), dtype=torch.float32, device=hidden.device)
    taus, sizes = [], []
    with torch.no_grad():
        for begin, end in row_chunks(rows, contract, step=step):
            fused_logits(hidden[begin:end], weight, bias, width, buffer)
            z = scaled_logits(buffer[: end - begin], contract, begin)
            tau, size = support_threshold(z, contract, group)
            taus.append(tau)
            sizes.append(size)
    if not taus:  # no rows: no chunk, and no collective
        empty = torch.empty(0, dtype=torch.float32, device=hidden.device)
        return empty, torch.empty(0, dtype=torch.int64, device=hidden.device)
    return torch.cat(taus), torch.cat(sizes)
