"""Assemble gpu_check.sh's one JSON and one markdown report from its step log and outputs.

Reads ``DIR/steps.tsv`` (name, exit status or ``planned``, seconds, command),
``DIR/compile.json`` (``python -m tools.gpu_readiness --json``) and
``DIR/bench.json`` (``benchmarks/bench_kernels.py --json``), ``DIR/bench-fused.json``
(``benchmarks/bench_fused.py --json``) and ``DIR/bench-processed.json``
(``benchmarks/bench_processed.py --json``) when they exist, and
writes ``DIR/gpu-check.json`` and ``DIR/gpu-check.md``. Exits 1 when a step failed.

Run: python benchmarks/gpu_check_report.py --out build/gpu-check --platform cuda [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
from typing import Any


def load_steps(out: Path) -> list[dict[str, Any]]:
    steps = []
    for line in (out / "steps.tsv").read_text().splitlines():
        name, status, seconds, command = line.split("\t", 3)
        steps.append(
            {
                "name": name,
                "status": "planned" if status == "planned" else int(status),
                "seconds": int(seconds),
                "command": command,
                "passed": status == "planned" or status == "0",
            }
        )
    return steps


def load_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def device_name() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return str(torch.cuda.get_device_name())
    except ImportError:
        pass
    return f"no GPU ({platform.machine()} CPU)"


def markdown(report: dict[str, Any]) -> str:
    title = "gpu_check dry run" if report["dry_run"] else "gpu_check"
    lines = [
        f"# {title}: {report['device']} ({report['platform']})",
        "",
        f"**{'PASSED' if report['passed'] else 'FAILED'}**"
        + (
            " (dry run: the plan only, plus the tiny interpreted shape)"
            if report["dry_run"]
            else ""
        ),
        "",
        "| step | status | seconds | command |",
        "|---|---|---:|---|",
    ]
    for step in report["steps"]:
        status = (
            step["status"]
            if step["status"] == "planned"
            else ("ok" if step["passed"] else f"**FAILED (exit {step['status']})**")
        )
        lines.append(f"| {step['name']} | {status} | {step['seconds']} | `{step['command']}` |")
    compiled = report.get("compile")
    if compiled:
        lines += ["", "## Compile gates", ""]
        lines.append("All gates pass." if compiled["gates_passed"] else "Gate failures:")
        lines += [f"- {failure}" for failure in compiled["failures"]]
    bench = report.get("bench")
    if bench and bench.get("measured"):
        lines += ["", f"## Kernel benchmark (roofline: {bench['roofline']})", ""]
        lines += [
            "| N | V | candidate | ms | GB/s | of copy | vs torch | measured / predicted |",
            "|---:|---:|---|---:|---:|---:|---:|---:|",
        ]
        for shape in bench["shapes"]:
            for name, item in shape["candidates"].items():
                ratio = item["measured_over_predicted"]
                lines.append(
                    f"| {shape['rows']} | {shape['vocab']} | {name} | {item['ms']:.3f} | "
                    f"{item['gbps']:.0f} | {item['of_copy']:.1%} | "
                    f"{item['speedup_vs_torch_baseline']:.2f}x | "
                    f"{'' if ratio is None else f'{ratio:.2f}'} |"
                )
        for name, goal in (bench.get("goals") or {}).items():
            met = "met" if goal["met"] else "**not met**"
            lines.append(f"- {name}: {goal['value']:.3f} (goal {goal['goal']}): {met}")
    elif bench:
        lines += ["", "Bench: the tiny interpreted shape ran; it measures nothing."]
    fused = report.get("bench_fused")
    if fused:
        lines += ["", *fused_markdown(fused)]
    processed = report.get("bench_processed")
    if processed:
        lines += ["", *processed_markdown(processed)]
    return "\n".join(lines) + "\n"


def processed_markdown(processed: dict[str, Any]) -> list[str]:
    """``bench_processed.py``'s tables: each support's median ms and its ratio to the raw op."""
    lines = [
        f"## Processed over raw logprobs ({processed['device']}, TP=1)",
        "",
        "| backend | role | N | H | V | dtype | support | ms | of raw |",
        "|---|---|---:|---:|---:|---|---|---:|---:|",
    ]
    for table in processed["tables"]:
        hidden = "" if table["hidden"] is None else str(table["hidden"])
        lead = (
            f"| {table['backend']} | {table['role']} | {table['rows']} | {hidden} | "
            f"{table['vocab']} | {table['dtype']} |"
        )
        for name, item in table["candidates"].items():
            lines.append(f"{lead} {name} | {item['ms']:.2f} | {item['of_raw']:.2f}x |")
    return lines


def fused_markdown(fused: dict[str, Any]) -> list[str]:
    """``bench_fused.py``'s shapes: peak bytes (tracker, and CUDA's when measured), ms, targets."""
    lines = [
        f"## Fused LM head vs logits path ({fused['device']}, {fused['dtype']}, TP=1, "
        f"median of {fused['reps']})",
        "",
        "| N | H | V | role | candidate | peak MiB | CUDA peak MiB | largest tensor | ms |",
        "|---:|---:|---:|---|---|---:|---:|---|---:|",
    ]
    goals = []
    for shape in fused["shapes"]:
        lead = f"| {shape['rows']} | {shape['hidden']} | {shape['vocab']} | {shape['role']} |"
        if "skipped" in shape:
            lines.append(f"{lead} {shape['skipped']} | | | | |")
            continue
        for name, item in shape["candidates"].items():
            cuda = item["cuda_peak_bytes"]
            big = item["largest"]
            cuda_mib = "" if cuda is None else f"{cuda / 2**20:.1f}"
            largest = "" if big is None else f"{big['dtype']} {big['shape']}"
            lines.append(
                f"{lead} {name} | {item['peak_bytes'] / 2**20:.1f} | {cuda_mib} | {largest} | "
                f"{item['ms']:.2f} |"
            )
        for name, goal in shape.get("targets", {}).items():
            peak = "met" if goal["peak_met"] else "**not met**"
            fast = "met" if goal["time_met"] else "**not met**"
            goals.append(
                f"- N={shape['rows']} {shape['role']} {name}: peak {goal['peak_ratio']:.3f} of the "
                f"logits path (goal <= 0.125): {peak}; {goal['ms']:.2f} ms (goal <= logits path "
                f"+ matmul, {goal['allowed_ms']:.2f} ms): {fast}"
            )
        goals += [f"- N={shape['rows']} {shape['role']}: {note}" for note in shape.get("notes", [])]
    return lines + goals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--platform", required=True)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    steps = load_steps(out)
    compiled = load_json(out / "compile.json")
    report = {
        "dry_run": args.dry_run,
        "platform": args.platform,
        "device": device_name(),
        "passed": all(step["passed"] for step in steps),
        "steps": steps,
        "compile": None
        if compiled is None
        else {
            "gates_passed": compiled["gates_passed"],
            "failures": compiled["failures"],
            "summary": compiled["summary"],
        },
        "bench": load_json(out / "bench.json"),
        "bench_fused": load_json(out / "bench-fused.json"),
        "bench_processed": load_json(out / "bench-processed.json"),
    }
    (out / "gpu-check.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "gpu-check.md").write_text(markdown(report))
    print(markdown(report))
    print(f"reports: {out / 'gpu-check.json'} and {out / 'gpu-check.md'}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
