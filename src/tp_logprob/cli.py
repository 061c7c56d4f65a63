"""The ``replay``, ``pin``, ``report`` and ``rollout-check`` commands (``python -m tp_logprob``).

The top of the layers: it hands the suite's properties
(:func:`~tp_logprob.replay.catalogue.suite_properties`) to the replay layer.
Handlers import the property suite lazily, so ``python -m tp_logprob backends``
stays light. The Triton backends run on CPU only through the interpreter, which
must be switched on before triton is imported: when a command needs them and
``TRITON_INTERPRET`` is unset, the command line re-executes itself with
``TRITON_INTERPRET=1`` (called in-process, it says how to run instead).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["add_commands"]

EXIT_BAD = 2


def add_commands(commands: Any) -> None:
    """Add ``replay``, ``pin``, ``report`` and ``rollout-check`` to the CLI's subparsers."""
    replay = commands.add_parser(
        "replay",
        help="rerun recorded failing examples (artifacts) on a backend",
        description="Rerun the property recorded in each artifact under PATH. Exit 0 if every "
        "run passes now, 1 if a property still fails (with a drift report), 2 on a bad artifact.",
    )
    replay.add_argument("paths", nargs="+", metavar="PATH", help="an artifact or a folder of them")
    _backend_options(replay, required=False)
    replay.add_argument(
        "--all-backends", action="store_true", help="replay on every backend registered here"
    )
    replay.set_defaults(handler=_replay)
    pin = commands.add_parser(
        "pin",
        help="copy validated artifacts into tests/regressions",
        description="Validate each artifact under PATH and copy it to the regression folder.",
    )
    pin.add_argument("paths", nargs="+", metavar="PATH")
    pin.add_argument("--to", default="tests/regressions", metavar="DIR")
    pin.set_defaults(handler=_pin)
    report = commands.add_parser(
        "report",
        help="measure a backend's drift from the exact oracle per dtype and TP degree",
        description="Run a backend on artifact cases or generated ones and compare with the "
        "exact oracle: a markdown table on stdout, optionally JSON and a PNG histogram.",
    )
    _backend_options(report, required=True)
    source = report.add_mutually_exclusive_group()
    source.add_argument("--cases", nargs="+", metavar="DIR", help="artifacts whose cases to run")
    source.add_argument("--generate", type=int, default=None, metavar="N", help="N cases (24)")
    report.add_argument("--seed", type=int, default=0, help="seed of the generated cases")
    report.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    report.add_argument("--plot", metavar="FILE.png", help="also draw a histogram (matplotlib)")
    report.set_defaults(handler=_report)
    rollout = commands.add_parser(
        "rollout-check",
        help="judge an engine's response against the trainer's logits, token by token",
        description="Read a saved SGLang, vLLM or prime-rl response (JSON; a batch is checked "
        "whole, its responses' tokens in order on the logits' rows) and the trainer's logits "
        "(torch.save of a [N, V] tensor, or one file per TP rank in rank order). The engine's "
        "logits are taken as the trainer's plus a perturbation (the logit noise a + b m_t per "
        "token, m_t its largest |logit| over the mask; estimated, --logit-noise-model or "
        "--logit-noise); each token is clean (agree, noise, borderline) or gets its cause "
        "(temperature missing / twice / another value, raw or unrenormalised logprobs, a "
        "recomputed mask, a mask the rules refuse, a stale policy, unexplained), with RL units "
        "(KL, importance ratios, clip shares). Exit 0 if no token has a fault, 1 if one does, "
        "2 on bad input (checked before any work).",
    )
    rollout.add_argument("response", metavar="RESPONSE", help="the engine's HTTP JSON, saved")
    rollout.add_argument("--logits", nargs="+", required=True, metavar="TRAINER.pt")
    rollout.add_argument("--engine", default="auto", choices=("auto", "sglang", "vllm", "prime_rl"))
    rollout.add_argument(
        "--index", type=int, default=None, help="check one response of a batch (default: all)"
    )
    rollout.add_argument("--engine-temperature", type=float, default=1.0, metavar="T")
    rollout.add_argument("--temperature", type=float, default=None, help="the trainer's T")
    rollout.add_argument("--top-k", type=int, default=None)
    rollout.add_argument("--top-p", type=float, default=None)
    rollout.add_argument("--min-p", type=float, default=None)
    rollout.add_argument("--vocab", type=int, default=None, help="real vocabulary size")
    rollout.add_argument(
        "--logit-noise", type=float, default=None, metavar="EPS",
        help="the perturbation between the engine's and the trainer's logits (sup norm, in "
        "logits), the same on every token; a per-token a + b m_t is estimated by default",
    )  # fmt: skip
    rollout.add_argument(
        "--logit-noise-model", type=float, nargs=2, default=None, metavar=("A", "B"),
        help="the per-token perturbation a + b m_t, m_t the largest |logit| over the token's "
        "mask (instead of estimating a and b)",
    )  # fmt: skip
    rollout.add_argument("--clip", type=float, default=0.2, help="PPO's clip range (0.2)")
    rollout.add_argument(
        "--engine-order", default=None, metavar="JSON",
        help="how the engine's logprob op sums a shard, if it declares it (the numerics bound), "
        'as AccumulationOrder.to_dict() writes it: \'{"kind": "tree", "fan_in": 2}\' (any order)',
    )  # fmt: skip
    rollout.add_argument("--backend", default="torch_native", help="the trainer's backend")
    rollout.add_argument("--json", metavar="FILE", help="also write the check as JSON")
    rollout.add_argument("--plot", metavar="FILE.png", help="also draw the check (matplotlib)")
    rollout.set_defaults(handler=_rollout_check)


def _backend_options(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument(
        "--backend",
        action="append",
        default=[],
        required=required,
        metavar="ID|MODULE:ATTR",
        help="backend to run (repeatable): a registered id or module:attr",
    )
    parser.add_argument("--platform", choices=("cuda", "rocm", "cpu"), default=None)


def _recorded_backends(paths: Sequence[str]) -> set[str]:
    """Backend ids recorded in the artifacts (read as plain JSON; validation comes later)."""
    from tp_logprob.replay.artifacts import artifact_paths

    found = set()
    for file in (file for path in paths for file in artifact_paths(path)):
        try:
            backend = json.loads(file.read_text(encoding="utf-8"))["backend"]["id"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(backend, str):
            found.add(backend)
    return found


def _interpreter_problem(args: argparse.Namespace, wanted: set[str]) -> int | None:
    """Switch the Triton interpreter on (by re-executing) if this run may need it; else None.

    On CPU a Triton kernel runs only through the interpreter. Without it only the
    torch backends are registered there, so the run needs it unless every backend
    ``wanted`` is one of those: the built-in Triton backends, ``--all-backends`` and
    any third-party backend (whose use of Triton is unknown until it is imported) do.
    """
    from tp_logprob.registry import detect_platform, registry

    if os.environ.get("TRITON_INTERPRET") is not None or importlib.util.find_spec("triton") is None:
        return None
    if (args.platform or detect_platform()) != "cpu":
        return None
    torch_only = {capability.backend_id for capability in registry.backends("cpu")}
    if not getattr(args, "all_backends", False) and wanted <= torch_only:
        return None
    command = [sys.executable, "-m", "tp_logprob", *args.argv]
    if args.may_exec and "triton" not in sys.modules:
        print(
            "tp-logprob: the Triton backends need TRITON_INTERPRET=1 on CPU; re-running with it",
            file=sys.stderr,
        )
        sys.stdout.flush()
        os.execve(sys.executable, command, {**os.environ, "TRITON_INTERPRET": "1"})
    print(
        "tp-logprob: the Triton backends run on CPU only through the interpreter; run: "
        f"TRITON_INTERPRET=1 {shlex.join(command)}",
        file=sys.stderr,
    )
    return EXIT_BAD


def _replay(args: argparse.Namespace) -> int:
    wanted = set(args.backend) if args.backend else _recorded_backends(args.paths)
    problem = _interpreter_problem(args, wanted)
    if problem is not None:
        return problem
    from tp_logprob.registry import detect_platform
    from tp_logprob.replay.catalogue import suite_properties
    from tp_logprob.replay.runner import replay_paths

    return replay_paths(
        args.paths,
        args.platform or detect_platform(),
        args.backend,
        properties=suite_properties(),
        all_backends=args.all_backends,
        out=sys.stdout,
    )


def _pin(args: argparse.Namespace) -> int:
    from tp_logprob.replay.artifacts import ArtifactError
    from tp_logprob.replay.catalogue import suite_properties
    from tp_logprob.replay.pin import pin

    properties = suite_properties()
    try:
        pinned = [artifact for path in args.paths for artifact in pin(path, properties, args.to)]
    except ArtifactError as error:
        print(f"BAD   {error}", file=sys.stderr)
        return EXIT_BAD
    for artifact in pinned:
        print(f"pinned {artifact.json_path} ({artifact.prop} on {artifact.backend_id})")
    return 0


def _report(args: argparse.Namespace) -> int:
    problem = _interpreter_problem(args, set(args.backend))
    if problem is not None:
        return problem
    from tp_logprob.registry import detect_platform
    from tp_logprob.replay.artifacts import ArtifactError
    from tp_logprob.replay.catalogue import suite_properties
    from tp_logprob.replay.report import build_report, generate_cases, load_cases, plot_report
    from tp_logprob.suite.backends import BackendSpecError, resolve_backends

    platform = args.platform or detect_platform()
    try:
        backends = resolve_backends(args.backend, platform)
    except BackendSpecError as error:
        print(str(error).replace("--tp-logprob-backend", "--backend"), file=sys.stderr)
        return EXIT_BAD
    status = 0
    for backend in backends:
        failure = backend.load_failure()
        if failure is not None:
            print(f"backend {backend.backend_id!r} could not be loaded: {failure}", file=sys.stderr)
            return EXIT_BAD
        if args.cases:
            try:
                cases = load_cases(args.cases, suite_properties())
            except ArtifactError as error:
                print(f"BAD   {error}", file=sys.stderr)
                return EXIT_BAD
            source = f"{len(cases)} artifact cases from {', '.join(args.cases)}"
        else:
            count = 24 if args.generate is None else args.generate
            cases = generate_cases(backend.capability, count, args.seed)
            source = f"{len(cases)} generated cases, seed {args.seed}"
        report = build_report(backend, cases, source)
        print(report.markdown())
        if args.json:
            Path(args.json).write_text(
                json.dumps(report.to_json(), indent=2, allow_nan=False) + "\n"
            )
        if args.plot:
            try:
                plot_report(report, args.plot)
            except RuntimeError as error:
                print(str(error), file=sys.stderr)
                return EXIT_BAD
        if any(entry["out_of_tolerance"] for entry in report.summary()):
            status = 1
    return status


def _engine_order(text: str | None) -> Any:
    """``--engine-order``'s JSON as an :class:`~tp_logprob.accumulation.AccumulationOrder`."""
    from tp_logprob.accumulation import AccumulationOrder
    from tp_logprob.errors import LogprobContractError
    from tp_logprob.rollout import RolloutInputError
    from tp_logprob.rollout.inputs import OPTION

    if text is None:
        return None
    try:
        return AccumulationOrder.from_dict(json.loads(text))
    except (ValueError, LogprobContractError) as error:
        raise RolloutInputError(OPTION, None, f"--engine-order={text!r}: {error}") from None


def _rollout_check(args: argparse.Namespace) -> int:
    from tp_logprob.errors import LogprobContractError
    from tp_logprob.rollout import RolloutInputError, check_rollout, plot_rollout
    from tp_logprob.rollout.inputs import OPTION, check_outputs, load_logits, load_response

    try:
        check_outputs(args.json, args.plot)
        if args.plot and importlib.util.find_spec("matplotlib") is None:
            raise RolloutInputError(
                OPTION, None, "--plot needs matplotlib: pip install 'tp-logprob[plot]'"
            )
        rollouts = load_response(args.response, args.engine)
        if args.index is not None:
            if not 0 <= args.index < len(rollouts):
                raise RolloutInputError(
                    OPTION, None, f"--index={args.index}: the response holds {len(rollouts)}"
                )
            rollouts = [rollouts[args.index]]
        shards = load_logits(args.logits)
        check = check_rollout(
            shards if len(shards) > 1 else shards[0],
            rollouts,
            engine_temperature=args.engine_temperature,
            trainer_temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            min_p=args.min_p,
            real_vocab_size=args.vocab,
            logit_noise=args.logit_noise,
            logit_noise_model=(
                None if args.logit_noise_model is None else tuple(args.logit_noise_model)
            ),
            clip=args.clip,
            engine_order=_engine_order(args.engine_order),
            backend=args.backend,
            files=args.logits,
        )
    except LogprobContractError as error:
        print(f"BAD   {error}", file=sys.stderr)
        return EXIT_BAD
    print(check.markdown())
    if args.json:
        Path(args.json).write_text(json.dumps(check.to_json(), indent=1, allow_nan=False) + "\n")
    if args.plot:
        plot_rollout(check, args.plot)
    return 1 if check.failed() else 0
