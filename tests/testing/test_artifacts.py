"""A failing ``assert_logprob_close`` with ``artifact_dir=`` writes a suite artifact: it loads,
holds the call's case, and ``python -m tp_logprob replay`` reruns it on the named backend."""

from __future__ import annotations

import io
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.testing.helpers import batch, nudged
from tp_logprob.__main__ import main
from tp_logprob.replay.artifacts import load_artifact
from tp_logprob.replay.catalogue import suite_properties
from tp_logprob.replay.runner import replay_paths
from tp_logprob.testing import assert_logprob_close
from tp_logprob.testing._close import REPLAYED_PROPERTIES

SUITE = suite_properties()
SRC = Path(__file__).resolve().parents[2] / "src"
MASK = np.array([True, True, False, True])


def _fail(tmp_path: Path, **outputs: object) -> tuple[str, Path]:
    b = batch(rows=4, width=24, dtype="bf16", temperature=0.8, active_mask=MASK)
    given: dict[str, object] = {"lse": b.lse}
    given.update(outputs)
    selected = given.pop("selected_logp", b.selected)
    with pytest.raises(AssertionError) as failure:
        assert_logprob_close(
            selected,
            b.logits,
            b.targets,
            backend="torch_native",
            artifact_dir=tmp_path,
            **b.options,
            **given,
        )
    text = str(failure.value)
    found = re.search(r"artifact  (\S+\.json) \(property '(\w+)'\)", text)
    assert found, text
    return text, Path(found.group(1))


def test_the_artifact_holds_the_call_and_replays_on_the_backend(tmp_path: Path) -> None:
    b = batch(rows=4, width=24, dtype="bf16", temperature=0.8, active_mask=MASK)
    text, path = _fail(tmp_path, selected_logp=nudged(b.selected, 0, 900))
    assert path.parent == tmp_path and path.with_suffix(".npz").exists()
    command = re.search(r"replay    (.+)", text)
    assert command and shlex.split(command.group(1)) == [
        "python", "-m", "tp_logprob", "replay", str(path)
    ]  # fmt: skip
    artifact = load_artifact(path, SUITE)
    assert (artifact.prop, artifact.backend_id) == ("oracle", "torch_native")
    assert np.array_equal(artifact.case.logits, b.logits)
    assert np.array_equal(artifact.case.active, MASK)
    assert artifact.case.contract.temperature == 0.8
    assert artifact.case.contract.dtype.value == "bf16"
    assert "selected_logp, row 0" in artifact.document["failure"]["summary"]
    out = io.StringIO()
    # torch_native is right on this case: the replay passes (the caller's kernel was wrong).
    assert replay_paths([str(tmp_path)], "cpu", ["torch_native"], properties=SUITE, out=out) == 0
    assert f"PASS  {artifact.name[:12]}  oracle on torch_native" in out.getvalue()
    assert main(["replay", str(tmp_path), "--platform", "cpu", "--backend", "torch_native"]) == 0


def test_a_gradient_failure_is_recorded_under_the_gradient_property(tmp_path: Path) -> None:
    b = batch(rows=4, width=24, dtype="bf16", temperature=0.8, active_mask=MASK)
    _, path = _fail(tmp_path, grad=nudged(b.grad, (1, 3), 8 << 16))  # 8 bf16 ulps
    artifact = load_artifact(path, SUITE)
    assert artifact.prop == "gradients"
    assert artifact.case.contract.role.value == "train"


def test_every_property_a_failure_is_recorded_under_is_the_suites() -> None:
    assert set(REPLAYED_PROPERTIES) <= set(SUITE)


def test_a_failure_inside_a_hypothesis_test_is_recorded_too(tmp_path: Path) -> None:
    """The suite's property modules apply @given, which Hypothesis refuses inside a running
    test: writing the artifact must not import them (a fresh interpreter, where none is yet)."""
    script = textwrap.dedent(
        f"""
        import numpy as np
        from hypothesis import given, settings, strategies as st
        from tp_logprob.testing import assert_logprob_close

        @settings(max_examples=1, database=None)
        @given(st.integers(0, 3))
        def inside(target):
            assert_logprob_close(
                np.array([0.0], np.float32), np.array([[0.0, 1.0, 2.0, 3.0]], np.float32),
                [target], backend="torch_native", artifact_dir={str(tmp_path)!r})

        try:
            inside()
        except AssertionError as failure:
            print(str(failure).splitlines()[-2])
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
    assert re.match(r"  artifact  \S+\.json \(property 'oracle'\)", done.stdout), done.stdout
    assert list(tmp_path.glob("*.json"))  # one per failing example Hypothesis tried
