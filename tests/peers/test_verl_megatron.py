"""verl's Megatron vocab-parallel helpers: what runs without torchrun.

The adapter needs a real process group (the conformance report's real-group column
runs it under torchrun); here, its reproducer runs the installed helpers on a gloo
group of one process, and the adapter refuses the emulated group. Skipped without
verl and megatron-core (``nox -s conformance`` installs both).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tp_logprob as tpl

pytest.importorskip("megatron.core", reason="megatron-core is installed by nox -s conformance")
pytest.importorskip("verl.utils.megatron.tensor_parallel")

from tp_logprob.peers import verl_megatron

REPRO = (
    Path(__file__).resolve().parents[2] / "docs" / "repro_verl_vocab_parallel_entropy_neg_inf.py"
)


def test_the_reproducer_shows_the_nan_entropy_beside_a_neg_inf_logit() -> None:
    run = subprocess.run([sys.executable, str(REPRO)], capture_output=True, text=True)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "vocab_parallel_entropy [nan, 1.09861" in run.stdout


def test_the_emulated_group_is_refused() -> None:
    sharding = tpl.ShardingSpec(0, 2, tpl.even_shard_bounds(8, 2), 8, 8)
    contract = tpl.LogprobContract(
        "infer", "fp32", tpl.MaskSpec(2), sharding, tpl.ReductionSpec("fixed_topology")
    )
    logits = torch.zeros(2, 8)
    with pytest.raises(tpl.LogprobContractError, match="real process group"):
        tpl.run_tp(verl_megatron.library[0], logits, torch.tensor([0, 5]), contract)
