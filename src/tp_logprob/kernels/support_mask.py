"""One rank's part of a row's support ``S`` as a bool mask over its live columns.

A processed op (``docs/semantics.md``, "Processed logprobs") treats every column
outside ``S`` as padding. ``S`` comes from a threshold (sampling parameters,
``kernels/support_threshold.py``): :func:`threshold_keep`; or from the replayed
kept ids, CSR with global ids: :class:`ReplayedSupport`, which moves the rank's
ids to the device once and scatters them into a mask for any block of rows, so
a chunked backend's memory stays bounded by its chunk, or packs every row into
bits (:meth:`ReplayedSupport.packed`, for the Triton kernels).
"""

from __future__ import annotations

import numpy as np
import torch

from tp_logprob.contract import LogprobContract
from tp_logprob.errors import LogprobContractError
from tp_logprob.support import SupportMode

__all__ = ["PACKED_BITS", "ReplayedSupport", "threshold_keep"]

PACKED_BITS = 32
"""Columns per word of :meth:`ReplayedSupport.packed`."""


def threshold_keep(z: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """bool ``[N, w]``: ``z >= tau`` per row; every live column where ``tau`` is NaN.

    A row without support (``tau`` NaN: a NaN or ``+inf`` live value, or no finite
    one) keeps its columns, so its NaN reaches ``selected_logp``, ``entropy`` and the
    gradient as the special values require.
    """
    return (z < tau.unsqueeze(1)).logical_not_()  # z >= tau, and True for a NaN tau


class ReplayedSupport:
    """This rank's kept ids of a replayed mask, on ``device``, and every row's ``|S|``.

    Example, in a backend's forward::

        replayed = ReplayedSupport(contract, local_logits.device)
        keep = replayed.keep()                       # every row
        keep = replayed.keep(begin, end, rows=step)  # a chunk, padded with empty rows
        words = replayed.packed()                    # every row, one bit per column
    """

    def __init__(self, contract: LogprobContract, device: torch.device) -> None:
        support = contract.support
        if support is None or support.mode is not SupportMode.REPLAYED_MASK:
            raise LogprobContractError(
                f"support_mode={contract.support_mode.value!r}: expected a replayed mask"
            )
        start, live_end = contract.sharding.live_bounds()
        offsets, ids = support.local_kept(start, live_end)
        self.width = live_end - start
        self._offsets = offsets
        rows = np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))
        self._rows = torch.from_numpy(rows).to(device)
        self._ids = torch.from_numpy(ids).to(device)
        self.sizes = torch.from_numpy(support.kept_counts().copy()).to(device)
        """int64 ``[N]``: ``|S|`` of every row (its kept ids on every rank)."""

    def entries(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This rank's kept entries of every row: their rows, local ids and places among
        their row's kept ids (each row's in ascending order: ``kept_ids`` are sorted)."""
        places = torch.arange(self._ids.numel(), device=self._ids.device)
        starts = torch.from_numpy(self._offsets[:-1]).to(self._ids.device)
        return self._rows, self._ids, places - starts[self._rows]

    def keep(
        self, begin: int = 0, end: int | None = None, *, rows: int | None = None
    ) -> torch.Tensor:
        """bool ``[rows, width]``: rows ``begin:end`` of this rank's mask, then empty rows
        up to ``rows`` (default ``end - begin``)."""
        end = len(self._offsets) - 1 if end is None else end
        rows = end - begin if rows is None else rows
        low, high = int(self._offsets[begin]), int(self._offsets[end])
        mask = torch.zeros((rows, self.width), dtype=torch.bool, device=self._ids.device)
        mask[self._rows[low:high] - begin, self._ids[low:high]] = True
        return mask

    def packed(self) -> torch.Tensor:
        """int32 ``[N, max(1, ceil(width / 32))]``: local column ``c`` of row ``t`` is kept
        iff bit ``c % 32`` of ``words[t, c // 32]`` is set (one bit per column).

        Built on the device from the kept ids: a row's ids are unique, so adding their
        distinct powers of two into a word sets exactly their bits (integer sums, exact
        in any order).
        """
        rows = len(self._offsets) - 1
        per_row = max(1, -(-self.width // PACKED_BITS))
        words = torch.zeros(rows * per_row, dtype=torch.int64, device=self._ids.device)
        bits = torch.ones_like(self._ids) << (self._ids % PACKED_BITS)
        words.index_add_(0, self._rows * per_row + self._ids // PACKED_BITS, bits)
        words = torch.where(words >= 1 << 31, words - (1 << 32), words)  # the int32 bits
        return words.to(torch.int32).view(rows, per_row)
