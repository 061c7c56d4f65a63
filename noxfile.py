"""Developer sessions: tests, the property suite, lint, typecheck, the standalone oracle."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import nox

nox.options.default_venv_backend = "virtualenv"  # pip sees the local CPU torch wheel; uv does not
nox.options.reuse_venv = "yes"
nox.options.sessions = ["lint", "typecheck", "tests", "properties"]

ROOT = Path(__file__).parent
CPU_CONSTRAINTS = ROOT / "ci" / "constraints-cpu.txt"
VLLM_SAMPLER_IMPORTS = [
    "aiohttp>=3.14.4", "apache-tvm-ffi==0.1.11", "cachetools", "cbor2", "cloudpickle",
    "fastapi>=0.133,<0.137", "llguidance>=1.7,<1.8", "msgspec", "openai>=2.25",
    "oss-harmony>=0.0.11", "partial-json-parser", "pillow>=13", "prometheus-client>=0.18",
    "psutil", "py-cpuinfo", "pybase64", "pydantic>=2.12", "pyzmq>=25", "regex",
    "requests>=2.33", "transformers>=5.16.1,<5.21", "uvloop", "xgrammar==0.2.8",
]  # fmt: skip
"""What importing vLLM's v1 sampler needs, at the bounds vLLM 0.33 declares."""

VERL_IMPORTS = ["ray>=2.41", "tensordict>=0.8,!=0.9.0,<=0.10.0", "omegaconf"]
"""What importing ``verl.utils.torch_functional`` needs beyond the peers extra: verl's
package import pulls in ``ray`` (``verl.protocol``) and ``tensordict``, at verl 0.9's bounds."""

SGLANG_IMPORTS = [
    "aiohttp", "apache-tvm-ffi==0.1.11", "ipython", "msgspec", "orjson", "psutil", "pybase64",
    "pydantic", "pyzmq>=25.1.2", "requests", "starlette", "tqdm", "transformers",
]  # fmt: skip
"""What importing SGLang's sampling params, sampler softmax and ``sampling_mask`` needs
(``tp_logprob.peers.sglang_sampler``); its sampler module itself needs a GPU build."""

_VERL_REQUIRES = (*VERL_IMPORTS, "transformers>=4.51,<5", "setuptools<81", "pandas")
"""verl's imports, transformers as verl 0.4 to 0.9 ask (<5), and pkg_resources and pandas,
which the package imports of 0.4.1 and 0.5.0 need."""


def _tool(relative: str) -> Any:
    """A module of ``tools/`` that imports nothing of the package, read from its file."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(f"_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _history_corpus() -> Any:
    """The historical corpus module, read from its file (it imports nothing of the package)."""
    return _tool("tools/history/corpus.py")


PEER_TESTS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    # adapter: (distribution, what the adapter imports beside it, its tests); the releases
    # are tools/conformance/releases.py's.
    "liger": (
        "liger-kernel",
        (),
        ("tests/peers/test_adapters.py", "-k", "liger and not vocab_parallel"),
    ),
    "liger_fused": ("liger-kernel", (), ("tests/peers/test_fused_adapters.py", "-k", "liger")),
    "liger_ppo": ("liger-kernel", (), ("tests/peers/test_liger_ppo.py",)),
    "liger_selective": ("liger-kernel", (), ("tests/peers/test_liger_selective.py",)),
    "liger_vocab_parallel": (
        "liger-kernel",
        ("transformers>=4.56,<5",),  # liger_kernel.transformers imports transformers
        ("tests/peers/test_liger_vocab_parallel.py", "tests/peers/test_adapters.py", "-k", "vocab"),
    ),
    # The newest release's dependencies, then each release alone; below 1.0, those of its
    # time (RELEASE_REQUIRES).
    "trl": (
        "trl",
        ("trl==1.16.0", "transformers>=5"),
        ("tests/peers/test_trl.py", "tests/peers/test_adapters.py", "-k", "trl"),
    ),
    "trl_grpo": ("trl", (), ("tests/peers/test_trl_grpo.py",)),
    "trl_chunked": ("trl", ("trl==1.16.0",), ("tests/peers/test_trl_chunked.py",)),
    "trl_kernel": ("trl", ("trl==1.16.0",), ("tests/peers/test_trl_kernel.py",)),
    "verl": ("verl", _VERL_REQUIRES, ("tests/peers/test_adapters.py", "-k", "verl and not naive")),
    "verl_fused": ("verl", _VERL_REQUIRES, ("tests/peers/test_verl_fused.py",)),
    "verl_naive": ("verl", _VERL_REQUIRES, ("tests/peers/test_adapters.py", "-k", "verl_naive")),
    # 0.5.20 has the API too, but its srt/utils/common.py imports torchvision at the top, and
    # PyPI's torchvision for Linux x86-64 does not load beside the CPU torch.
    "sglang_sampler": ("sglang", tuple(SGLANG_IMPORTS), ("tests/peers/test_sglang_sampler.py",)),
    # 0.11.0's vllm.utils also imports setproctitle and blake3, which 0.33's does not.
    "vllm_sampler": (
        "vllm",
        (*VLLM_SAMPLER_IMPORTS, "setproctitle", "blake3"),
        ("tests/peers/test_processed_adapters.py",),
    ),
    # The CPU model runner's sampler, from 0.34: the same imports as 0.33's v1 sampler.
    "vllm_sampler_034": (
        "vllm",
        tuple(VLLM_SAMPLER_IMPORTS),
        ("tests/peers/test_processed_adapters.py",),
    ),
    "vllm_sampler_010": (
        "vllm",
        _history_corpus().requirements("vllm==0.10.0"),
        ("tests/peers/test_history.py", "-k", "vllm_010"),
    ),
    "openrlhf": ("openrlhf", (), ("tests/peers/test_openrlhf.py",)),
    "openrlhf_actor": ("openrlhf", (), ("tests/peers/test_openrlhf_actor.py",)),
    "torch_loss_parallel": (
        "torch",
        (),
        (
            "tests/peers/test_adapters.py",
            "tests/peers/test_real_group_peers.py",
            "-k",
            "loss_parallel",
        ),
    ),
    # 0.8's package imports pkg_resources; the real-group tests run Megatron's own all-reduces.
    "megatron": (
        "megatron-core",
        ("setuptools<81",),
        ("tests/peers/test_adapters.py", "tests/peers/test_real_group_peers.py", "-k", "megatron"),
    ),
    "cce": ("cut-cross-entropy", (), ("tests/peers/test_cce.py",)),
}
"""Each adapter's library, what the adapter imports beside it, and its tests, for
``nox -s peer_releases`` (the releases: ``tools/conformance/releases.py``)."""

RELEASE_INSTALL = {
    "megatron": ("--no-deps", "--force-reinstall", "--ignore-requires-python"),
    "torch_loss_parallel": (),
}
"""Options installing an adapter's releases, where not ``--no-deps --force-reinstall``:
megatron-core asks for Python >= 3.12 from 0.17 but imports on 3.11 (pip takes the source
distribution: the wheels are cp312); a CUDA build of torch needs its CUDA libraries
(2.14.1's lie on the CPU machines' disk), and 2.13.0 is the local CPU build."""


def _constraints() -> list[str]:
    """Pin the CPU torch build unless TP_LOGPROB_CONSTRAINTS names another file (or is empty)."""
    path = os.environ.get("TP_LOGPROB_CONSTRAINTS", str(CPU_CONSTRAINTS))
    return ["-c", path] if path else []


def _install(session: nox.Session, extras: str) -> None:
    session.install(*_constraints(), "-e", f".[{extras}]")


def _cpu_interpreter_env(session: nox.Session) -> None:
    """Run the Triton backends through the interpreter when no GPU is visible."""
    has_gpu = session.run(
        "python", "-c", "import torch; print(int(torch.cuda.is_available()))", silent=True
    )
    if str(has_gpu).strip() != "1":
        session.env["TRITON_INTERPRET"] = "1"


@nox.session
def tests(session: nox.Session) -> None:
    """Run the unit tests in parallel (pytest -n auto); posargs pass through to pytest."""
    _install(session, "torch,triton,test")
    _cpu_interpreter_env(session)
    session.run("pytest", *(session.posargs or ["-n", "auto"]))


@nox.session
def properties(session: nox.Session) -> None:
    """Verify every backend available here against the oracle and each other (the main job)."""
    _install(session, "torch,triton,test")
    _cpu_interpreter_env(session)
    session.run(
        "pytest",
        "--pyargs",
        "tp_logprob.properties",
        "-p",
        "no:cacheprovider",
        *(session.posargs or ["-n", "auto", "--tp-logprob-profile=ci"]),
    )


TRITON_BOUNDS = ["3.7.0", "3.9.0"]
"""The oldest and the newest Triton pyproject's bounds allow (``triton>=3.7,<3.10``)."""


@nox.session(default=False)
@nox.parametrize("triton", TRITON_BOUNDS)
def interpreter_bits(session: nox.Session, triton: str) -> None:
    """The interpreter shortcuts' internals, scope and bits on one Triton release."""
    _install(session, "torch,test")
    session.install("--no-deps", f"triton=={triton}")
    session.env["TRITON_INTERPRET"] = "1"
    session.run(
        "pytest", "-p", "no:cacheprovider", "-q",
        *(session.posargs or [
            "tests/test_private_internals.py",
            "tests/kernels/test_interpreted.py",
            "tests/kernels/test_interpreted_bits.py",
        ]),
    )  # fmt: skip


@nox.session(default=False)
def real_groups(session: nox.Session) -> None:
    """The property suite on real gloo process groups of 2 and 3 ranks (torchrun, in lockstep)."""
    _install(session, "torch,test")
    args = session.posargs or ["--tp-logprob-backend=torch_native", "--tp-logprob-profile=ci"]
    for ranks in (2, 3):  # 3 ranks: uneven shards
        session.run(
            "torchrun", "--standalone", f"--nproc-per-node={ranks}",
            "-m", "pytest", "--pyargs", "tp_logprob.properties", "-p", "no:cacheprovider", "-q",
            f"--tp-logprob-rank-logs=.tp_logprob/ranks/tp{ranks}", *args,
        )  # fmt: skip


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over the package and tools/: strict but for the command line (pyproject)."""
    _install(session, "torch,test")
    session.install("mypy>=1.10")
    session.run("mypy", "src/tp_logprob", "tools", *session.posargs)


@nox.session(default=False)
def no_pytest(session: nox.Session) -> None:
    """tp_logprob.testing, replay, report and rollout-check in a virtualenv without pytest."""
    _install(session, "torch")
    session.run("python", "ci/without_pytest.py")


@nox.session
def oracle_standalone(session: nox.Session) -> None:
    """Import and use tp_logprob.oracle with only numpy and mpmath installed."""
    session.install("--no-deps", ".")
    session.install("numpy", "mpmath>=1.3,<1.4")
    session.run(
        "python",
        "-c",
        "import sys, numpy as np; from tp_logprob.oracle import exact_selected_logprob; "
        "s, l = exact_selected_logprob(np.array([[0.0, 0.0]]), np.array([1])); "
        "assert abs(l[0] - np.log(2)) < 1e-15, l; "
        "assert not {'torch', 'triton', 'hypothesis'} & set(sys.modules), sorted(sys.modules); "
        "print('oracle ok without torch, triton or hypothesis')",
    )


@nox.session(default=False)
def compile(session: nox.Session) -> None:
    """Compile every Triton kernel for every GPU target on this CPU; write docs/gpu-readiness.md."""
    _install(session, "torch,triton")
    session.env["TRITON_INTERPRET"] = "0"  # the compiler, not the interpreter
    cache = os.environ.get("TRITON_CACHE_DIR", str(ROOT / ".nox" / "triton-cache"))
    session.env["TRITON_CACHE_DIR"] = cache
    args = session.posargs or ["--matrix", "full", "--markdown", "docs/gpu-readiness.md"]
    session.run("python", "-m", "tools.gpu_readiness", *args)


@nox.session(default=False)
def replay(session: nox.Session) -> None:
    """Replay recorded failures and pinned regressions on every backend available here."""
    _install(session, "torch,triton,test")
    _cpu_interpreter_env(session)
    found = [path for path in (".tp_logprob/failures", "tests/regressions") if Path(path).exists()]
    paths = session.posargs or found
    if paths:
        session.run("python", "-m", "tp_logprob", "replay", *paths, "--all-backends")
    else:
        session.log("nothing to replay: no .tp_logprob/failures or tests/regressions")


@nox.session(default=False)
def mutants(session: nox.Session) -> None:
    """Suite power: every planted-bug backend must fail the property suite, the controls pass."""
    _install(session, "torch,test")
    session.run("python", "benchmarks/suite_power.py", *session.posargs)


@nox.session(default=False)
def conformance(session: nox.Session) -> None:
    """Run the property suite against every peer adapter, variant and sampler; write the report."""
    peers = ["-c", str(ROOT / "ci" / "constraints-peers.txt")]
    session.install(*_constraints(), *peers, "-e", ".[torch,triton,test,peers]")
    # megatron-core's metadata asks for Python >= 3.12 although it imports on 3.11, and its
    # wheel is tagged cp312: below 3.12 install the sdist, without that check or any deps
    # (it imports only torch, numpy and packaging, which are already here).
    old_python = session.run(
        "python", "-c", "import sys; print(int(sys.version_info < (3, 12)))", silent=True
    )
    if str(old_python).strip() == "1":
        session.install(
            *peers, "--no-deps", "--ignore-requires-python", "--no-binary", "megatron-core",
            "megatron-core",
        )  # fmt: skip
    # vLLM's wheel pins a CUDA build of torch: install it without dependencies, then only
    # what its sampler modules import (tp_logprob.peers.vllm_sampler), at vLLM's own bounds.
    # The pinned 0.33 is not vllm_sampler_034's: the report keeps that adapter's subsection,
    # written where vLLM 0.34 is installed (python -m tools.conformance --peer vllm_sampler_034).
    session.install(*peers, "--no-deps", "vllm")
    session.install(*_constraints(), *peers, *VLLM_SAMPLER_IMPORTS)
    # verl (tp_logprob.peers.verl) asks for transformers < 5.11 (below vLLM's bound) and for
    # trainer packages its logprob helpers never import: install it without dependencies,
    # then only what they import.
    session.install(*peers, "--no-deps", "verl")
    session.install(*_constraints(), *peers, *VERL_IMPORTS)
    # SGLang's wheel pins a CUDA build of torch and its GPU kernels: without dependencies,
    # then only what the modules tp_logprob.peers.sglang_sampler imports need.
    session.install(*peers, "--no-deps", "sglang")
    session.install(*_constraints(), *peers, *SGLANG_IMPORTS)
    # OpenRLHF (tp_logprob.peers.openrlhf) pins DeepSpeed, flash-attn and ray; the adapter
    # compiles its logprob helper from the installed file, which needs only torch.
    session.install(*peers, "--no-deps", "openrlhf")
    _cpu_interpreter_env(session)  # Liger's Triton kernel on CPU tensors
    session.run("pytest", "tests/peers", "-q", "-p", "no:cacheprovider", "-n", "0")
    session.run("python", "-m", "tools.conformance", *session.posargs)


@nox.session(default=False)
@nox.parametrize("adapter", sorted(PEER_TESTS))
def peer_releases(session: nox.Session, adapter: str) -> None:
    """An adapter's tests on each release of its library (posargs: some releases only)."""
    _install(session, "torch,triton,test")
    distribution, requires, tests = PEER_TESTS[adapter]
    listed = _tool("tools/conformance/releases.py")
    releases = listed.TESTED_RELEASES[adapter]
    _cpu_interpreter_env(session)  # Triton kernels on CPU tensors
    failed = []
    for release in session.posargs or releases:
        beside = listed.RELEASE_REQUIRES.get(adapter, {}).get(release, requires)
        if beside:
            session.install(*_constraints(), *beside)
        # Each release alone, over the last: its pins would pull other torch builds.
        options = RELEASE_INSTALL.get(adapter, ("--no-deps", "--force-reinstall"))
        session.install(*options, f"{distribution}=={release}")
        try:
            output = session.run(
                "pytest", *tests, "-q", "-p", "no:cacheprovider", "-n", "0", "-rs", silent=True
            )
        except nox.command.CommandFailed:
            failed.append(release)
            continue
        print(output)
        if " skipped" in str(output).strip().splitlines()[-1]:  # an import that failed
            failed.append(release)
    passed = [release for release in session.posargs or releases if release not in failed]
    session.log(f"{adapter} ({distribution}): passed on {passed}; failed on {failed}")
    if failed:
        session.error(f"{adapter}: the adapter's tests failed on {failed}")


@nox.session(default=False)
@nox.parametrize("release", _history_corpus().releases())
def history(session: nox.Session, release: str) -> None:
    """One release of the historical benchmark, in a virtualenv of its own; then the report."""
    _install(session, "torch,triton,test")
    # Old peer releases pin other torch builds than the CPU one: the release alone, then
    # what its adapter imports, at versions of the release's time.
    session.install("--no-deps", release)
    requires = _history_corpus().requirements(release)
    if requires:
        session.install(*_constraints(), *requires)
    _cpu_interpreter_env(session)  # Liger's Triton kernels on CPU tensors
    session.run("python", "-m", "tools.history", "run", "--release", release)
    session.notify("history_report")


@nox.session(default=False)
def history_report(session: nox.Session) -> None:
    """Judge each historical entry from the releases' results; write docs/history.md."""
    session.install(*_constraints(), "numpy")
    session.install("--no-deps", "-e", ".")
    args = session.posargs or ["report"]  # e.g. -- --out DIR report --markdown FILE
    session.run("python", "-m", "tools.history", *args)
