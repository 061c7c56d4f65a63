"""What a base install runs without pytest (``nox -s no_pytest``): the asserts of
``tp_logprob.testing``, and ``python -m tp_logprob replay``, ``report`` and ``rollout-check``.

Run in a virtualenv with the package and torch but not pytest. A failing
``assert_logprob_close`` writes an artifact (``artifact_dir=``) that ``replay`` then
reruns on the backend it names; ``rollout-check`` reads an honest SGLang response built
as ``tests/replay/test_rollout.py`` builds one, through the command line only.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def main() -> None:
    assert importlib.util.find_spec("pytest") is None, "pytest is installed here"
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        artifact = assert_and_record(work / "failures")
        run("replay", str(artifact), expect=0)
        run("report", "--backend", "torch_native", "--generate", "4", expect=0)
        rollout_check(work)
    print("testing, replay, report and rollout-check ran without pytest")


def assert_and_record(folder: Path) -> Path:
    """Call the assert right, then wrong by 0.1 with ``artifact_dir``: the artifact's path."""
    from tp_logprob.oracle import exact_selected_logprob
    from tp_logprob.testing import assert_logprob_close

    logits = np.array([[0.5, -1.0, 2.0, 0.0], [1.0, 1.0, -3.0, 0.25]], dtype=np.float32)
    targets = np.array([2, 0])
    selected, _ = exact_selected_logprob(logits, targets)
    exact = np.asarray(selected, dtype=np.float32)
    assert_logprob_close(exact, logits, targets)
    try:
        assert_logprob_close(
            exact + 0.1, logits, targets, backend="torch_native", artifact_dir=folder
        )
    except AssertionError as error:
        message = str(error)
    else:
        raise SystemExit("assert_logprob_close passed outputs 0.1 off the exact values")
    assert "pytest" not in sys.modules, "tp_logprob.testing imported pytest"
    found = re.search(r"replay +python -m tp_logprob replay (\S+\.json)", message)
    assert found is not None, message
    return Path(found.group(1))


def rollout_check(work: Path) -> None:
    """An honest top-k response at temperature 0.7 agrees with the trainer on every token."""
    import torch

    rows, vocab, top_k, temperature = 6, 32, 4, 0.7
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(7)) * 3
    z = logits.double() / temperature
    masks, tokens, logprobs = [], [], []
    for row in range(rows):
        kept = torch.argsort(z[row], descending=True)[:top_k].tolist()
        token = kept[row % top_k]
        masks.append(kept)
        tokens.append(token)
        logprobs.append(float(z[row, token] - torch.logsumexp(z[row, kept], 0)))
    meta = {"output_token_sampling_mask": masks, "output_token_sampling_logprobs": logprobs}
    response = work / "response.json"
    response.write_text(json.dumps([{"output_ids": tokens, "meta_info": meta}]))
    saved = work / "trainer.pt"
    torch.save(logits, saved)
    run(
        "rollout-check", str(response), "--logits", str(saved),
        "--engine-temperature", str(temperature), "--top-k", str(top_k), expect=0,
    )  # fmt: skip


def run(*args: str, expect: int) -> None:
    """``python -m tp_logprob ARGS``, which must exit with ``expect``."""
    done = subprocess.run(
        [sys.executable, "-m", "tp_logprob", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    shown = f"python -m tp_logprob {' '.join(args)} exited {done.returncode}, not {expect}"
    assert done.returncode == expect, f"{shown}\n{done.stdout}\n{done.stderr}"
    print(f"ok: python -m tp_logprob {args[0]}")


if __name__ == "__main__":
    main()
