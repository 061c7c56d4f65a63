"""The peer adapters on a real gloo group: each library communicating on its own.

Three properties per adapter on two ranks (torchrun): PyTorch's loss_parallel
through DTensor's collectives, Megatron-Core through its own
``torch.distributed.all_reduce`` calls (counted), Megatron's whole
``vocab_parallel_cross_entropy`` on its own tensor-parallel group, and Liger's
``LigerVocabParallelCrossEntropy`` with its own all-reduces (counted). Skipped where the
library is not installed (megatron-core comes with ``nox -s conformance``).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest

from tests.helpers.torchrun import torchrun

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

COUNTER = Path(__file__).resolve().parents[1] / "helpers" / "count_all_reduce.py"
PROPERTIES = "test_matches_exact_oracle or test_gradients_match_exact or test_outputs_replicated"


@pytest.mark.parametrize(
    ("spec", "library", "own_all_reduce"),
    [
        ("tp_logprob.peers.torch_loss_parallel:honest", "torch.distributed.tensor", False),
        ("tp_logprob.peers.megatron:honest", "megatron.core", True),
        ("tp_logprob.peers.megatron:library", "megatron.core", True),
        ("tp_logprob.peers.liger_vocab_parallel:library", "liger_kernel", True),
    ],
    ids=["loss_parallel", "megatron", "megatron_library", "liger_vocab_parallel"],
)
def test_the_adapter_passes_on_a_real_group_with_its_own_collectives(
    spec: str, library: str, own_all_reduce: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if importlib.util.find_spec(library.split(".")[0]) is None:
        pytest.skip(f"{library} is not installed")
    if "liger" in spec:
        monkeypatch.setenv("TRITON_INTERPRET", "1")  # Liger's Triton kernels on CPU tensors
    shutil.copy(COUNTER, tmp_path)
    counts = tmp_path / "all_reduce"
    monkeypatch.setenv("ALL_REDUCE_COUNT_DIR", str(counts))
    session = torchrun(
        2, tmp_path, f"--tp-logprob-backend={spec}", "-p", "count_all_reduce", "-k", PROPERTIES
    )
    assert session.returncode == 0, session.output[-4000:]
    assert re.search(r"^\S+\s+3 passed, 0 failed, 0 skipped", session.output, re.M), session.output[
        -4000:
    ]
    calls = [int((counts / f"rank{rank}").read_text()) for rank in range(2)]
    assert (min(calls) > 0) == own_all_reduce, calls
    assert session.examples(0) == session.examples(1)
