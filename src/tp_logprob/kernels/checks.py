"""Deprecated: input validation moved to :mod:`tp_logprob.kernels.validation`.

``docs/verify-your-kernel.md`` once taught ``tp_logprob.kernels.checks.check_op_inputs``,
so its names still resolve here, each with a :class:`DeprecationWarning` naming the new
home: ``check_op_inputs`` and ``active_mask_tensor`` in ``kernels.validation``,
``owner_ranks`` in ``kernels.shards``, ``TORCH_DTYPES`` in ``kernels.dtypes``.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_MOVED = {
    "TORCH_DTYPES": "tp_logprob.kernels.dtypes",
    "active_mask_tensor": "tp_logprob.kernels.validation",
    "check_op_inputs": "tp_logprob.kernels.validation",
    "owner_ranks": "tp_logprob.kernels.shards",
}


def __getattr__(name: str) -> Any:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"tp_logprob.kernels.checks.{name} is deprecated: import it from {module}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(module), name)
