"""Bad arguments raise ``LogprobContractError`` naming the argument and its value, before the
oracle runs; and ``tp_logprob.testing`` on numpy inputs never imports torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.testing.helpers import batch
from tp_logprob.errors import LogprobContractError
from tp_logprob.oracle import fast_path_stats
from tp_logprob.support import SupportSpec
from tp_logprob.testing import assert_logprob_close, assert_support_admissible

B = batch(rows=4, width=16)
SRC = Path(__file__).resolve().parents[2] / "src"


def _close(**changes: Any) -> Callable[[], None]:
    arguments: dict[str, Any] = {
        "selected_logp": B.selected,
        "logits": B.logits,
        "targets": B.targets,
        "lse": B.lse,
    }
    arguments.update(changes)
    return lambda: assert_logprob_close(**arguments)


BAD: list[tuple[str, Callable[[], None], str]] = [
    ("1-D logits", _close(logits=B.logits[0]), r"logits: shape \(16,\), expected 2-D"),
    ("int logits", _close(logits=B.logits.astype(np.int32)), r"logits: dtype int32"),
    (
        "float64 logits off fp32",
        _close(logits=B.logits.astype(np.float64) + 1e-12),
        r"logits\[0, 0\]=.*: not an fp32 value",
    ),
    ("selected length", _close(selected_logp=B.selected[:3]), r"selected_logp: shape \(3,\)"),
    ("lse length", _close(lse=B.lse[:2]), r"lse: shape \(2,\), expected \(4,\)"),
    ("int lse", _close(lse=np.zeros(4, np.int64)), r"lse: dtype int64, expected a float"),
    ("grad shape", _close(grad=B.grad[:, :8]), r"grad: shape \(4, 8\), expected \(4, 16\)"),
    ("targets length", _close(targets=B.targets[:3]), r"targets: shape \(3,\), expected \(4,\)"),
    ("float targets", _close(targets=B.targets * 1.0), r"targets: dtype float64"),
    (
        "target past the vocabulary",
        _close(targets=np.array([0, 16, 1, 2])),
        r"targets\[1\]=16: outside \[0, real_vocab_size=16\) for an active row",
    ),
    (
        "target past real_vocab_size",
        _close(targets=np.array([0, 1, 13, 2]), real_vocab_size=12),
        r"targets\[2\]=13: outside \[0, real_vocab_size=12\)",
    ),
    ("negative target", _close(targets=np.array([0, 1, 2, -1])), r"targets\[3\]=-1"),
    ("dtype name", _close(dtype="bf17"), r"dtype='bf17': expected one of 'bf16', 'fp16', 'fp32'"),
    (
        "fp32 values called bf16",
        _close(dtype="bf16", logits=B.logits + np.float32(1e-3)),
        r"logits\[0, 0\]=.*: not a bf16 value, but dtype='bf16'",
    ),
    ("temperature 0", _close(temperature=0.0), r"temperature=0.0: must be a finite float > 0"),
    ("negative temperature", _close(temperature=-1.0), r"temperature=-1.0"),
    ("NaN temperature", _close(temperature=float("nan")), r"temperature=nan"),
    ("real_vocab_size 0", _close(real_vocab_size=0), r"real_vocab_size=0: must be >= 1"),
    ("real_vocab_size wide", _close(real_vocab_size=17), r"padded_vocab_size=16: must be >="),
    ("mask length", _close(active_mask=[True, False]), r"active_mask"),
    (
        "logits and shards",
        _close(tp_shards=[B.logits[:, :8], B.logits[:, 8:]]),
        r"logits and tp_shards: both given",
    ),
    (
        "shard rows",
        _close(logits=None, tp_shards=[B.logits[:, :8], B.logits[:3, 8:]]),
        r"tp_shards\[1\]: 3 rows, tp_shards\[0\] has 4",
    ),
    (
        "empty shard",
        _close(logits=None, tp_shards=[B.logits, B.logits[:, :0]]),
        r"tp_shards\[1\]: shape \(4, 0\); a rank's shard has at least one column",
    ),
    ("shards not a list", _close(logits=None, tp_shards=B.logits), r"tp_shards=ndarray"),
    (
        "sampling parameters",
        _close(support=SupportSpec(top_k=4)),
        r"support=.*: sampling parameters .* assert_support_admissible",
    ),
    (
        "target outside the kept ids",
        _close(support=SupportSpec.from_kept_lists([[int(t)] for t in B.targets[:3]] + [[15]])),
        rf"targets\[3\]={int(B.targets[3])}: not among row 3's kept ids",
    ),
    ("artifact without backend", _close(artifact_dir="x"), r"artifact_dir='x' needs backend="),
    (
        "unknown backend",
        _close(artifact_dir="x", backend="no_such"),
        r"backend='no_such': not registered",
    ),
    (
        "kept mask shape",
        lambda: assert_support_admissible(np.ones((4, 3), bool), B.logits, top_k=2),
        r"kept: bool \(4, 3\), expected a bool \(4, 16\) mask",
    ),
    (
        "kept id past the logits",
        lambda: assert_support_admissible([[1], [2], [3], [16]], B.logits, top_k=2),
        r"kept: token id 16 is past the logits' 16 columns",
    ),
    (
        "top_p out of range",
        lambda: assert_support_admissible([[1]] * 4, B.logits, top_p=1.5),
        r"top_p=1.5",
    ),
]


@pytest.mark.parametrize(("call", "match"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_refused_before_the_oracle_runs(call: Callable[[], None], match: str) -> None:
    before = fast_path_stats()
    with pytest.raises(LogprobContractError, match=match):
        call()
    assert fast_path_stats() == before  # nothing was computed


def test_numpy_inputs_never_import_torch() -> None:
    """In a fresh interpreter: every assert that takes numpy, passing and failing."""
    script = textwrap.dedent(
        """
        import sys
        import numpy as np
        from tp_logprob.oracle import exact_selected_logprob
        from tp_logprob.testing import assert_logprob_close, assert_support_admissible

        logits = np.array([[0.0, 1.0, 2.0], [3.0, -1.0, 0.5]], np.float32)
        selected, lse = exact_selected_logprob(logits, [2, 0])
        assert_logprob_close(selected.astype(np.float32), logits, [2, 0], lse=lse)
        try:
            assert_logprob_close(selected.astype(np.float32) + 1, logits, [2, 0])
        except AssertionError:
            pass
        assert_support_admissible([[1, 2], [0, 2]], logits, top_k=2)
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "triton")))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
