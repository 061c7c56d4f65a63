"""Command line: ``python -m tp_logprob <command>`` (also installed as ``tp-logprob``).

Each command is a subparser of :func:`build_parser` whose ``handler`` default
takes the parsed arguments and returns the exit status; a new command adds one.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from tp_logprob.capability import LogprobBackendCapability
from tp_logprob.cli import add_commands
from tp_logprob.hardware import add_command as add_hardware_command
from tp_logprob.kernel_template import add_command as add_template_command
from tp_logprob.registry import PLATFORMS, detect_platform

__all__ = ["build_parser", "main"]

_COLUMNS = (
    "backend",
    "kind",
    "roles",
    "dtypes",
    "tp",
    "padding",
    "mask modes",
    "lse",
    "temperature",
    "entropy",
    "shards",
    "input",
    "supports",
    "determinism",
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status.

    Only a real command line (``argv`` None) may re-execute itself, e.g. to switch
    the Triton interpreter on before triton is imported.
    """
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.may_exec = argv is None
    status: int = args.handler(args)
    return status


def build_parser() -> argparse.ArgumentParser:
    """The ``tp-logprob`` parser, one subcommand per task."""
    parser = argparse.ArgumentParser(
        prog="tp-logprob",
        description="Vocab-parallel token log-probabilities: backends, contracts and proofs.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    backends = commands.add_parser(
        "backends",
        help="list the registered backends and their capabilities",
        description="List the registered backends and what each declares it can serve.",
    )
    backends.add_argument(
        "--platform",
        choices=PLATFORMS,
        default=None,
        help="platform to list (default: the detected one)",
    )
    backends.add_argument("--json", action="store_true", help="print JSON instead of a table")
    backends.add_argument(
        "--load",
        action="store_true",
        help="import every backend now and report those that fail to load (exit status 1)",
    )
    backends.set_defaults(handler=_backends)
    add_commands(commands)
    add_hardware_command(commands)
    add_template_command(commands)
    return parser


def _backends(args: argparse.Namespace) -> int:
    from tp_logprob.registry import registry

    platform = args.platform or detect_platform()
    if args.load:
        registry.load_backends(platform)
    capabilities = registry.backends(platform)
    failures = registry.failures(platform)
    if args.json:
        document = {
            "platform": platform,
            "backends": [capability.to_dict() for capability in capabilities],
            "failures": failures,
        }
        print(json.dumps(document, indent=2, sort_keys=True))
    else:
        print(f"platform: {platform}")
        print(format_table([_row(capability) for capability in capabilities]))
        for backend_id, failure in sorted(failures.items()):
            print(f"FAILED {backend_id}: {failure}")
    return 1 if failures else 0


def _row(capability: LogprobBackendCapability) -> tuple[str, ...]:
    info: dict[str, Any] = capability.to_dict()
    tp = info["tp_world_sizes"]
    return (
        info["backend_id"],
        info["implementation_kind"],
        ",".join(info["roles"]),
        ",".join(info["dtypes"]),
        "any" if tp is None else ",".join(str(size) for size in tp),
        "yes" if info["supports_vocab_padding"] else "no",
        ",".join(info["mask_modes"]) or "-",
        "yes" if info["exports_vocab_lse"] else "no",
        "yes" if info["supports_temperature"] else "no",
        "yes" if info["exports_entropy"] else "no",
        "even" if info["even_shards_only"] else "any",
        ",".join(info["input_kinds"]),
        ",".join(info["support_modes"]),
        ",".join(info["determinism_scopes"]),
    )


def format_table(rows: Sequence[tuple[str, ...]]) -> str:
    """Left-aligned columns under the ``_COLUMNS`` header."""
    table = [_COLUMNS, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(_COLUMNS))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in table
    ]
    if not rows:
        lines.append("(no backends registered)")
    return "\n".join(line.rstrip() for line in lines)


if __name__ == "__main__":
    sys.exit(main())
