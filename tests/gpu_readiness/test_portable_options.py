"""The compile matrix records triton_portable's kernels as they run: without fp fusion."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.triton_cases import BACKENDS  # noqa: F401  (the interpreter on CPU, or a skip)

recorder = pytest.importorskip("tools.gpu_readiness.recorder")
portable_math = pytest.importorskip("tp_logprob.kernels.triton.portable_math")

pytestmark = pytest.mark.triton


def test_portable_launches_are_recorded_without_fp_fusion() -> None:
    """The recorder hands ``enable_fp_fusion=False`` to the JIT's binder, which makes it
    the compile option (``aot._specialize``); only triton_portable's launches carry it."""
    launches = recorder.record(["cuda"], ["aligned"], (torch.int64,), recorder.Coverage.SINGLES)
    portable = [item for item in launches if item.backend == "triton_portable"]
    assert {item.name for item in portable} == set(portable_math.PORTABLE_KERNELS)
    for item in launches:
        fusion = dict(item.constexprs).get("enable_fp_fusion", True)
        assert fusion is (item.backend != "triton_portable"), (item.backend, item.name)
