"""A mutant that writes into the caller's logits, as some libraries' kernels do.

Its outputs are right: only a property that inspects the inputs after the op
can tell. A trainer that computes entropy or KL from the same logits afterwards
would silently read the overwritten values.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.mutants._compose import mutant
from tp_logprob.contract import LogprobContract
from tp_logprob.kernels.native import native_forward


def _forward_zeroing_ignored_rows(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    active: torch.Tensor,
    contract: LogprobContract,
    group: Any,
) -> tuple[torch.Tensor, ...]:
    outputs = native_forward(local_logits, targets, active, contract, group)
    local_logits.data[~active] = 0.0  # BUG: ignored rows zeroed in the caller's tensor
    return outputs


writes_input = mutant("writes_input", forward=_forward_zeroing_ignored_rows)
