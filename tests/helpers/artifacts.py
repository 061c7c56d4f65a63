"""Small artifacts for the replay tests: one padding case, written for a chosen backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tp_logprob.contract import LogprobContract, MaskSpec, ReductionSpec, ShardingSpec
from tp_logprob.replay.artifacts import write_artifact
from tp_logprob.replay.catalogue import suite_properties
from tp_logprob.strategies import LogprobCase
from tp_logprob.suite.backends import BackendUnderTest, resolve_backends

SUITE = suite_properties()

SUITE = suite_properties()

MUTANT = "tests.mutants.partial_bugs:padding_not_masked"


def padding_case() -> LogprobCase:
    contract = LogprobContract(
        role="infer",
        dtype="fp32",
        mask=MaskSpec(2, np.array([True, False])),
        sharding=ShardingSpec(0, 2, ((0, 3), (3, 5)), 4, 5),
        reduction=ReductionSpec("fixed_topology"),
    )
    logits = np.array([[0.5, -1.0, 2.0, 0.25, 3.0], [1.0, 2.0, 3.0, 4.0, 5.0]], np.float32)
    return LogprobCase(contract, logits, np.array([2, -100]))


def backend(spec: str) -> BackendUnderTest:
    return resolve_backends([spec], "cpu")[0]


def write_padding_artifact(directory: Path, spec: str = MUTANT, **extra: Any) -> Path:
    """A padding-independence failure: garbage 1e30 in the padding column."""
    return write_artifact(
        directory,
        SUITE,
        prop="padding_ignored",
        backend=backend(spec),
        case=padding_case(),
        params={"padding": np.array([[1e30], [np.nan]], np.float32)},
        failure="padding independence: values in padding columns changed the result",
        seed=1234,
        test="tests/replay/test_replay.py::example",
        **extra,
    )
