"""The plot a person reads, and the check run where pytest cannot be imported."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tp_logprob.engine_formats import prime_rl_rollout
from tp_logprob.rollout import RolloutCheck, check_rollout
from tp_logprob.rollout.plot import _decade, _symlog

N, V, K, T = 40, 64, 6, 0.7


def _rollout(
    x: torch.Tensor, noise: float = 0.0
) -> tuple[list[int], list[int], list[int], list[float]]:
    engine = x + noise * torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
    z = engine.double() / T
    kept = torch.topk(z, K, dim=1).indices.sort(dim=1).values
    tokens = kept[:, 1]
    values = z.gather(1, kept)
    logprobs = (z.gather(1, tokens[:, None])[:, 0] - torch.logsumexp(values, dim=1)).tolist()
    return kept.flatten().tolist(), [K] * N, tokens.tolist(), logprobs


def _check() -> RolloutCheck:
    x = torch.randn(N, V, generator=torch.Generator().manual_seed(4)) * 3
    ids, counts, tokens, logprobs = _rollout(x, noise=0.01)
    logprobs[3] = -math.inf
    logprobs[7] -= 1.0
    return check_rollout(
        x, prime_rl_rollout(ids, counts, tokens, logprobs=logprobs, vocab_size=V),
        engine_temperature=T,
    )  # fmt: skip


def test_the_plot_names_its_non_finite_tokens_and_keeps_its_labels_apart(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from tp_logprob.rollout import plot_rollout

    check = _check()
    assert check.verdict[3] == "nonfinite" and check.verdict[7] == "unexplained"
    path = tmp_path / "check.png"
    plot_rollout(check, str(path))
    assert path.read_bytes().startswith(b"\x89PNG")
    figure = Figure()
    FigureCanvasAgg(figure)
    axis = figure.subplots()
    _symlog(axis, "y", 1e-7, 3.0)
    ticks = axis.get_yticks()
    assert len(ticks) <= 2 * 4 + 1 and 0.0 in ticks
    assert [_decade(v, None) for v in (1e-3, -10.0, 0.0)] == ["1e-3", "-1e1", "0"]


def test_the_report_counts_and_names_the_non_finite_token() -> None:
    check = _check()
    document = check.to_json()
    assert document["verdicts"]["nonfinite"] == 1
    assert document["nonfinite"][0]["token"] == 3
    assert "engine -inf" in document["nonfinite"][0]["detail"]
    assert all(isinstance(v, int) for v in document["verdicts"].values())
    assert document["units"]["engine"]["tokens"] == N - 1  # the non-finite one left out
    assert "1 non-finite token(s)" in check.markdown()
    json.dumps(document, allow_nan=False)


def test_the_command_runs_without_pytest(tmp_path: Path) -> None:
    """A meta path finder refuses pytest (and hypothesis): the check and its plot still run."""
    x = torch.randn(N, V, generator=torch.Generator().manual_seed(4)) * 3
    ids, counts, tokens, logprobs = _rollout(x)
    (tmp_path / "r.json").write_text(
        json.dumps({"ids": ids, "counts": counts, "token_ids": tokens, "logprobs": logprobs})
    )
    torch.save(x, tmp_path / "x.pt")
    script = (
        "import sys\n"
        "class Refuse:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('pytest', '_pytest', 'hypothesis'):\n"
        "            raise ImportError(f'{name} is not installed here')\n"
        "sys.meta_path.insert(0, Refuse())\n"
        "from tp_logprob.__main__ import main\n"
        f"status = main(['rollout-check', {str(tmp_path / 'r.json')!r}, '--logits', "
        f"{str(tmp_path / 'x.pt')!r}, '--engine-temperature', '0.7', '--json', "
        f"{str(tmp_path / 'c.json')!r}])\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('pytest', 'hypothesis')]\n"
        "sys.exit(status)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "c.json").read_text())["engine_at_fault"] == 0
    assert np.isfinite(json.loads((tmp_path / "c.json").read_text())["noise"]["eps"])


def test_the_trainer_is_judged_by_its_own_values() -> None:
    """A trainer's backend that gives NaN on one token and drifts by 1e-3 on another: the
    first is ``nonfinite`` (the trainer named), the second ``trainer_numerics``; the
    engine's judgement runs beside the backend and leaves the rest clean."""
    import dataclasses

    from tp_logprob.kernels.builtin import TORCH_NATIVE
    from tp_logprob.kernels.native import torch_native_logprob
    from tp_logprob.registry import registry

    def drifting(logits: Any, targets: Any, contract: Any, group: Any = None) -> Any:
        result = torch_native_logprob(logits, targets, contract, group)
        values = result.selected_logp.clone()
        if contract.num_tokens == N:  # one block: the rows are the tokens
            values[2], values[5] = math.nan, values[5] + 1e-3
        return type(result)(values, *result[1:])

    capability = dataclasses.replace(TORCH_NATIVE, backend_id="drifting_trainer")
    registry.register_logprob_backend("cpu", lambda: drifting, capability, replace=True)
    x = torch.randn(N, V, generator=torch.Generator().manual_seed(4)) * 3
    ids, counts, tokens, logprobs = _rollout(x)
    rollout = prime_rl_rollout(ids, counts, tokens, logprobs=logprobs, vocab_size=V)
    check = check_rollout(
        list(torch.tensor_split(x, 2, dim=1)), rollout, engine_temperature=T,
        backend="drifting_trainer",
    )  # fmt: skip
    assert check.verdict[2] == "nonfinite" and "trainer nan" in check.details[2]
    assert check.verdict[5] == "trainer_numerics"
    others = [v for i, v in enumerate(check.verdict) if i not in (2, 5)]
    assert set(others) <= {"agree", "noise"}, others
