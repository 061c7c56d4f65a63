"""What every adapter needs between a library's loss and the contract's outputs.

Libraries return a cross-entropy *loss*, ``lse - x[target]``, and most of them
no LSE. Three pieces of glue turn that into ``(selected_logp, lse)``:

- **Sign of zero.** ``-loss`` turns a loss of ``+0.0`` (an ignored row, or a row
  with one live column) into ``-0.0``; the contract's inactive rows are exactly
  ``+0.0``. :func:`selected_from_loss` computes ``0.0 - loss`` instead, which is
  ``+0.0`` there and ``-loss`` bit for bit everywhere else.
- **An LSE from a shifted sum.** Where the library exposes the row maximum ``M``
  and ``log S`` (``S = sum exp(x - M)``), ``lse = M + log S``, except on rows whose
  maximum is infinite: ``x - M`` is ``inf - inf = NaN`` there, while the contract
  wants ``lse = +inf`` (a ``+inf`` logit) and ``lse = -inf`` (no finite live logit).
  :func:`lse_from_max` patches exactly those rows; a NaN maximum stays NaN.
- **Input copies.** Liger stores gradients (and zeroes ignored rows) in its
  input, Megatron subtracts the maximum from fp32 logits in place: the adapters
  hand those libraries a copy (:func:`private_copy`), so the caller's logits are
  untouched, at the cost of one extra logits-sized buffer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from tp_logprob.capability import LogprobBackendCapability

__all__ = ["claiming", "lse_from_max", "private_copy", "selected_from_loss"]


def selected_from_loss(loss: torch.Tensor) -> torch.Tensor:
    """``-loss`` in fp32, with ``+0.0`` (not ``-0.0``) where the loss is zero."""
    return 0.0 - loss.float()


def lse_from_max(row_max: torch.Tensor, log_sum: torch.Tensor) -> torch.Tensor:
    """``row_max + log_sum`` in fp32; ``row_max`` itself where it is ``+-inf``."""
    row_max, log_sum = row_max.float(), log_sum.float()
    return torch.where(torch.isinf(row_max), row_max, row_max + log_sum)


def private_copy(local_logits: torch.Tensor) -> torch.Tensor:
    """A copy the library may write into; gradients still flow to ``local_logits``."""
    return local_logits.clone(memory_format=torch.contiguous_format)


def claiming(
    pair: tuple[Any, LogprobBackendCapability], suffix: str, **claims: Any
) -> tuple[Any, LogprobBackendCapability]:
    """The same op under a capability that also claims ``claims`` (a "users assume" variant).

    The backend id gains ``.suffix`` so reports tell the variants apart.
    """
    op, capability = pair
    backend_id = f"{capability.backend_id}.{suffix}"
    return op, dataclasses.replace(capability, backend_id=backend_id, **claims)
