"""The README's ``tp_logprob.testing`` example runs as written, on a plain selective log-softmax
(and fails on one that is off)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

README = Path(__file__).resolve().parents[2] / "README.md"


def _example() -> str:
    text = README.read_text()
    section = text[text.index("### In your own tests: `tp_logprob.testing`") :]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found, "the section has no python example"
    return found.group(1)


def _run(selective_log_softmax: Any) -> None:
    namespace: dict[str, Any] = {"my_selective_log_softmax": selective_log_softmax}
    exec(compile(_example(), str(README), "exec"), namespace)
    torch.manual_seed(0)
    namespace["test_my_logprobs_are_exact"]()


@pytest.mark.slow
def test_the_example_passes_on_log_softmax_gather() -> None:
    _run(lambda x, t: torch.log_softmax(x.float(), -1).gather(1, t[:, None])[:, 0])


def test_the_example_fails_on_a_temperature_slip() -> None:
    with pytest.raises(AssertionError, match="outside the tolerance table"):
        _run(lambda x, t: torch.log_softmax(x.float() / 1.001, -1).gather(1, t[:, None])[:, 0])
