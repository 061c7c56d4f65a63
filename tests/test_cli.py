"""The command line: ``python -m tp_logprob backends``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import subprocess
import sys

import pytest

import tp_logprob as tpl
from tp_logprob.__main__ import main
from tp_logprob.kernels.builtin import TORCH_NATIVE

HEADER = ["backend", "kind", "roles", "dtypes", "tp", "padding", "mask", "modes", "lse"]
HEADER += ["temperature", "entropy", "shards", "input", "supports"]


def test_backends_prints_a_capability_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backends", "--platform", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "platform: cpu"
    assert lines[1].split()[: len(HEADER)] == HEADER and lines[1].split()[-1] == "determinism"
    row = next(line.split() for line in lines if line.startswith("torch_native"))
    assert row == [
        "torch_native",
        "production",
        "infer,train",
        "bf16,fp16,fp32",
        "any",
        "yes",
        "explicit_active_mask,ignore_index",
        "yes",
        "yes",
        "yes",
        "any",
        "logits",
        "full,replayed_mask,sampling_params",
        "fixed_topology",
    ]


def test_backends_json_lists_capabilities_and_failures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backends", "--platform", "cpu", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["platform"] == "cpu" and document["failures"] == {}
    by_id = {entry["backend_id"]: entry for entry in document["backends"]}
    assert by_id["torch_native"] == TORCH_NATIVE.to_dict()


def test_backends_load_reports_a_broken_backend(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = tpl.KernelRegistry()
    registry.register_logprob_backend("cpu", lambda: lambda *a: None, TORCH_NATIVE)

    def broken() -> None:
        raise ImportError("no module named fastkernel")

    capability = dataclasses.replace(TORCH_NATIVE, backend_id="fast")
    registry.register_logprob_backend("cpu", broken, capability)
    monkeypatch.setattr(sys.modules["tp_logprob.registry"], "registry", registry)
    assert main(["backends", "--platform", "cpu"]) == 0  # nothing loaded, nothing failed yet
    assert main(["backends", "--platform", "cpu", "--load"]) == 1
    out = capsys.readouterr().out
    assert "FAILED fast: factory failed: ImportError: no module named fastkernel" in out
    assert "FAILED torch_native" not in out


def test_a_command_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


def test_python_dash_m_runs_the_cli() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tp_logprob", "backends", "--platform", "cpu", "--load"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "torch_native" in done.stdout and "FAILED" not in done.stdout


def test_the_interpreter_rerun_passes_its_variable_to_the_new_process_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("triton", reason="the rerun is for the Triton backends")
    from tp_logprob.cli import _interpreter_problem

    class RerunError(Exception):
        """Stands for the process image that os.execve would replace this one with."""

    def execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        raise RerunError(path, argv, env)

    def execv(path: str, argv: list[str]) -> None:  # a rerun through os.environ fails here
        raise RerunError(path, argv, dict(os.environ))

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    monkeypatch.setattr("os.execve", execve)
    monkeypatch.setattr("os.execv", execv)
    args = argparse.Namespace(platform="cpu", all_backends=True, argv=["backends"], may_exec=True)
    with pytest.raises(RerunError) as rerun:
        _interpreter_problem(args, {"triton_tp"})
    path, argv, env = rerun.value.args
    assert (path, argv[1:]) == (sys.executable, ["-m", "tp_logprob", "backends"])
    assert env["TRITON_INTERPRET"] == "1"
    assert "TRITON_INTERPRET" not in os.environ


def test_the_interpreter_command_it_prints_runs_when_pasted(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In process (no rerun), the command printed is this Python's, quoted for a shell."""
    pytest.importorskip("triton", reason="the command is for the Triton backends")
    from tp_logprob.cli import _interpreter_problem

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    argv = ["replay", "my failures/", "--backend", "my_kernel.py:register"]
    args = argparse.Namespace(platform="cpu", all_backends=False, argv=argv, may_exec=False)
    assert _interpreter_problem(args, {"my_kernel"}) == 2
    printed = capsys.readouterr().err.rstrip("\n").split("; run: ", 1)[1]
    assert shlex.split(printed) == ["TRITON_INTERPRET=1", sys.executable, "-m", "tp_logprob", *argv]
