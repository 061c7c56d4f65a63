"""``python -m tp_logprob template [FILE]``: write the example backend to start from.

The template (``tp_logprob/templates/my_kernel.py``, shipped in the wheel) is a
complete third-party backend: an op, its capability and the ``register`` function
the suite calls, in plain torch. The command copies it out, never over a file that
exists, so that a user with nothing but the installed package has a file to run
the suite on and to edit into their own kernel.
"""

from __future__ import annotations

import argparse
import sys
from importlib.resources import files
from pathlib import Path
from typing import Any

__all__ = ["TEMPLATE", "add_command", "template_text"]

TEMPLATE = "my_kernel.py"
"""The template's file name, in the package's ``templates`` folder."""

EXIT_BAD = 2


def add_command(commands: Any) -> None:
    """Add ``template`` to the CLI's subparsers."""
    parser = commands.add_parser(
        "template",
        help="write an example backend to start your own from",
        description="Write the example backend (an op, its capability and register(registry), "
        "in torch) to FILE, which must not exist, and print the command that runs the "
        "property suite on it.",
    )
    parser.add_argument(
        "file", nargs="?", default=TEMPLATE, metavar="FILE", help=f"where to write ({TEMPLATE})"
    )
    parser.set_defaults(handler=_template)


def template_text() -> str:
    """The template's source, as shipped."""
    return (files("tp_logprob") / "templates" / TEMPLATE).read_text(encoding="utf-8")


def _template(args: argparse.Namespace) -> int:
    target = Path(args.file)
    try:
        with target.open("x", encoding="utf-8") as out:
            out.write(template_text())
    except FileExistsError:
        print(
            f"tp-logprob: {target} exists; not overwritten (name another FILE, or move it away)",
            file=sys.stderr,
        )
        return EXIT_BAD
    except OSError as error:
        print(f"tp-logprob: cannot write {target}: {error}", file=sys.stderr)
        return EXIT_BAD
    print(f"wrote {target}; run the property suite on it with:")
    print(f"  pytest --pyargs tp_logprob.properties --tp-logprob-backend={target}:register")
    return 0
