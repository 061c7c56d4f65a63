"""A pytest plugin for tests/peers/test_real_group_peers.py: counts torch.distributed.all_reduce.

Loaded with ``-p count_all_reduce``; every call made through the module attribute
(as Megatron-Core calls it) is counted, and each rank writes its count to
``$ALL_REDUCE_COUNT_DIR/rank<r>`` when the session ends.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch.distributed as dist

_CALLS = [0]
_ORIGINAL = dist.all_reduce


def _counting(*args: Any, **kwargs: Any) -> Any:
    _CALLS[0] += 1
    return _ORIGINAL(*args, **kwargs)


dist.all_reduce = _counting


def pytest_unconfigure(config: Any) -> None:
    folder = Path(os.environ["ALL_REDUCE_COUNT_DIR"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank{os.environ.get('RANK', '0')}").write_text(str(_CALLS[0]))
