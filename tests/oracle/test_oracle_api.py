"""The oracle's public surface: what it exports and what it refuses to import."""

from __future__ import annotations

import subprocess
import sys
import types

import tp_logprob.oracle as oracle


def test_import_does_not_pull_torch_or_triton() -> None:
    code = (
        "import sys, tp_logprob.oracle; "
        "bad = sorted(m for m in ('torch', 'triton') if m in sys.modules); "
        "assert not bad, bad"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_all_matches_public_names() -> None:
    public = {
        name
        for name, value in vars(oracle).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    public.discard("annotations")  # from __future__
    assert sorted(oracle.__all__) == sorted(public)
    for name in oracle.__all__:
        assert getattr(oracle, name).__doc__, name
