"""The launch layer's recording seam: launches go to the sink, nothing runs, state is restored."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

pytest.importorskip("triton", reason="the launch layer needs triton")
from tp_logprob.kernels.triton import launch as launch_layer

pytestmark = pytest.mark.triton


def test_recording_hands_launches_to_the_sink_as_on_the_gpu() -> None:
    seen: list[launch_layer.RecordedLaunch] = []
    config = launch_layer.launch_config("cuda", launch_layer.KernelKind.ROW, torch.bfloat16)
    tensor = torch.zeros(3)
    with launch_layer.recording_launches("rocm", seen.append):
        assert launch_layer.platform_of(tensor) == "rocm"
        launch_layer.launch("not a kernel", (0, 2), config, tensor, 1, 2, ENTROPY=True)
    assert launch_layer.platform_of(tensor) == "cpu"
    (only,) = seen
    assert (only.kernel, only.grid, only.args) == ("not a kernel", (0, 2), (1, 2))
    assert only.config == config
    assert only.constexprs == {"ENTROPY": True}


def test_recordings_do_not_nest_and_name_their_platform() -> None:
    with (
        pytest.raises(ValueError, match="platform='cpu'"),
        launch_layer.recording_launches("cpu", print),
    ):
        pass
    with (
        launch_layer.recording_launches("cuda", print),
        pytest.raises(RuntimeError, match="already active"),
        launch_layer.recording_launches("cuda", print),
    ):
        pass
    with launch_layer.recording_launches("cuda", print):  # released after each use
        assert launch_layer.platform_of(torch.zeros(1)) == "cuda"


def test_without_tl_dot_every_fused_pass_takes_one_chunk_depth() -> None:
    """Without ``tl.dot`` a logit's bits depend on the K chunk depth: the forward, the
    backward's recomputation and the fixed-point pass must share it."""
    for platform, dot in launch_layer.FUSED_DOT.items():
        if not dot:
            depth = launch_layer.FUSED_TILES[platform][1]
            assert launch_layer.FUSED_SUM_DEPTH[platform] == (depth, depth), platform
    assert not launch_layer.FUSED_DOT["cpu"]  # numpy's matmul is not row-position independent
