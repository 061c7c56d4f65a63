"""The nucleus search takes candidates in any layout without a warning.

torch warns (once per process) when ``searchsorted`` reads a non-contiguous tensor,
and the suite's warning filter makes that an error; a sort of an input-form view
keeps the view's strides. A fresh process sees the warning's first and only showing.
"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import torch
from tp_logprob.kernels.support_threshold import _nucleus
candidates = torch.randn(6, 8, dtype=torch.float32).t()  # column-major, as a view arrives
row_max = candidates.amax(dim=1)
limit = torch.full((8,), 0.5, dtype=torch.float64)
tau, count, reached = _nucleus(candidates, row_max, limit, 40)
assert tau.shape == (8,) and bool((count >= 1).all())
"""


def test_the_nucleus_search_takes_a_column_major_view_without_a_warning() -> None:
    found = subprocess.run(
        [sys.executable, "-W", "error", "-c", SCRIPT], capture_output=True, text=True
    )
    assert found.returncode == 0, found.stderr
