"""The contract's dtypes as torch dtypes: the one map every torch user of the contract reads.

Kernels, peers, the GPU-readiness tools, tests and benchmarks all turn a
:class:`~tp_logprob.contract.LogprobDType` (or its value, ``"bf16"``...) into a
torch dtype; a second copy of the map could drift from this one.
"""

from __future__ import annotations

import torch

from tp_logprob.contract import LogprobDType

__all__ = ["TORCH_DTYPES"]

TORCH_DTYPES: dict[LogprobDType, torch.dtype] = {
    LogprobDType.BF16: torch.bfloat16,
    LogprobDType.FP16: torch.float16,
    LogprobDType.FP32: torch.float32,
}
"""``LogprobDType -> torch.dtype``; ``LogprobDType`` is a ``str`` enum, so
``TORCH_DTYPES["bf16"]`` works too."""
