"""How often each input form reaches each property: the suite run once, every property
run tallied by the layout of its case.

Every case that ``draw_case`` or ``draw_fused_case`` draws carries an
:class:`~tp_logprob.strategies.input_forms.InputForm`; this script runs the suite
in-process (``pytest --pyargs tp_logprob.properties``, the chosen profile and seed) on
one backend and counts, per property, the runs whose values, targets and (fused)
weight came in each layout. Examples that Hypothesis shrinks count too, as do the
runs of a property that reads the case's form but passes its own tensors (the
gradient checks hand over a trainer's ``[B, T + 1, D]`` leaf instead).

Run: python benchmarks/input_forms_drawn.py [--backend torch_native] [--profile ci]
     [--seed 20261130] [-k EXPR] [--module tp_logprob.properties.test_oracle ...]
"""

from __future__ import annotations

import argparse
import collections
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tp_logprob.strategies import TARGET_FORMS, VALUE_FORMS
from tp_logprob.suite.profiles import CI_SEED
from tp_logprob.suite.property import SuiteProperty

Tally = collections.Counter[tuple[str, str, str]]


@contextmanager
def tallied() -> Iterator[Tally]:
    """Count ``(property, role, form)`` for every :meth:`SuiteProperty.run` in the block."""
    tally: Tally = collections.Counter()
    original = SuiteProperty.run

    def run(self: SuiteProperty, backend: Any, case: Any, *args: Any, **kwargs: Any) -> None:
        form = case.form
        tally[(self.name, "runs", "")] += 1
        tally[(self.name, "values", form.values)] += 1
        tally[(self.name, "targets", form.targets)] += 1
        tally[(self.name, "weight", form.weight)] += 1
        original(self, backend, case, *args, **kwargs)

    SuiteProperty.run = run  # type: ignore[method-assign]
    try:
        yield tally
    finally:
        SuiteProperty.run = original  # type: ignore[method-assign]


def table(tally: Tally, fused: bool) -> str:
    """A markdown table: per property, its runs and how many had each layout."""
    columns = [("values", name) for name in VALUE_FORMS] + [
        ("targets", name) for name in TARGET_FORMS[1:]
    ]
    if fused:
        columns += [("weight", name) for name in VALUE_FORMS[1:]]
    head = ["property", "runs", *(f"{role} {name}" for role, name in columns)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    names = sorted({prop for prop, role, _ in tally if role == "runs"})
    totals = collections.Counter[tuple[str, str]]()
    for prop in names:
        counts = [tally[(prop, role, name)] for role, name in columns]
        for key, count in zip(columns, counts, strict=True):
            totals[key] += count
        totals[("runs", "")] += tally[(prop, "runs", "")]
        lines.append(
            f"| {prop} | {tally[(prop, 'runs', '')]} | " + " | ".join(map(str, counts)) + " |"
        )
    lines.append(
        f"| all | {totals[('runs', '')]} | "
        + " | ".join(str(totals[key]) for key in columns)
        + " |"
    )
    return "\n".join(lines)


def main() -> int:
    import pytest

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="torch_native")
    parser.add_argument("--profile", default="ci")
    parser.add_argument("--seed", type=int, default=CI_SEED)
    parser.add_argument("-k", dest="keyword", default=None)
    parser.add_argument("--module", nargs="+", default=["tp_logprob.properties"])
    args = parser.parse_args()
    command = [
        "--pyargs",
        *args.module,
        f"--tp-logprob-backend={args.backend}",
        f"--tp-logprob-profile={args.profile}",
        f"--hypothesis-seed={args.seed}",
        "-p",
        "no:cacheprovider",
        "-q",
        *(["-k", args.keyword] if args.keyword else []),
    ]
    with tallied() as tally:
        status = pytest.main(command)
    fused = "fused" in args.backend
    print(f"\n{args.backend}, profile {args.profile}, seed {args.seed}: runs per input form\n")
    print(table(tally, fused))
    return int(status)


if __name__ == "__main__":
    raise SystemExit(main())
