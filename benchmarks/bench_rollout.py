"""The rollout check on a corpus from two forward passes: what it names, and its time.

The corpus (``benchmarks/rollout_corpus.py``): ``--tokens`` tokens in 12 responses
at vocabulary ``--vocab`` (4,096 and 152,064 by default, Qwen2's vocabulary), the
trainer's fp32 logits in ``--tp`` shards, the engine's logits the trainer's plus a
perturbation the size of two bf16 forward passes, rounded to bf16, every common
cause planted on a response or a subset of tokens; ``--spread S`` scales each row's
logits by a factor log-uniform in ``[1/S, S]``, so that the tokens' magnitudes (and
their perturbations) differ as a real policy's do. It prints, per planted cause,
the share of the tokens it affects that the check names (and of those beyond the
realised perturbation, and beyond the check's stated noise), the verdicts on the clean
responses, the tokens named after a cause where none was planted (the clean responses
and the clean tokens of the others), the noise it estimated, and the median wall and
CPU time of ``--repeat`` runs (the check only; building the corpus is not timed).
Several ``--vocab``, ``--seed`` and ``--spread`` values build one corpus for each
combination, and the counts are pooled over them at the end.

    python benchmarks/bench_rollout.py --repeat 3
    python benchmarks/bench_rollout.py --repeat 1 --all-clean --vocab 32000 --seed 1
    python benchmarks/bench_rollout.py --repeat 1 --vocab 32000 152064 --seed 0 1 --spread 1 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rollout_corpus import DETECTABLE, PLAN, TEMPERATURE, TOP_K, TOP_P, Corpus, build_corpus

from tp_logprob.rollout import check_rollout
from tp_logprob.rollout.causes import ENGINE_CAUSES
from tp_logprob.rollout.report import ENGINE_FAULTS


def named_counts(
    planted: list[str], columns: list[np.ndarray], verdict: list[str]
) -> dict[str, list[tuple[int, int]]]:
    """Per planted cause: ``(named, tokens)`` among the tokens each of ``columns`` selects."""
    found = {}
    for cause in sorted(set(planted) - {""}):
        tokens = [t for t, p in enumerate(planted) if p == cause]
        cells = []
        for column in columns:
            chosen = [t for t in tokens if column[t]]
            cells.append((sum(verdict[t] == cause for t in chosen), len(chosen)))
        found[cause] = cells
    return found


def _cells(cells: list[tuple[int, int]]) -> str:
    return "; ".join(
        f"{named}/{total} ({named / total:.1%})" if total else f"{named}/{total} (-)"
        for named, total in cells
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--vocab", type=int, nargs="+", default=[152_064])
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, nargs="+", default=[0])
    parser.add_argument(
        "--spread", type=float, nargs="+", default=[1.0],
        help="scale each row's logits by a factor log-uniform in [1/SPREAD, SPREAD] (1: none)",
    )  # fmt: skip
    parser.add_argument(
        "--all-clean", action="store_true",
        help="plant no cause: every response clean (a clean rollout must get no engine fault)",
    )  # fmt: skip
    args = parser.parse_args()
    pooled: dict[str, list[tuple[int, int]]] = {}
    faults: Counter[str] = Counter()
    corpora = [(v, s, x) for v in args.vocab for s in args.seed for x in args.spread]
    for vocab, seed, spread in corpora:
        found, fault = _one_corpus(args, vocab, seed, spread)
        faults += fault
        for cause, cells in found.items():
            before = pooled.get(cause, [(0, 0)] * len(cells))
            pooled[cause] = [(a + c, b + d) for (a, b), (c, d) in zip(before, cells, strict=True)]
    if len(corpora) > 1:
        print(f"pooled over {len(corpora)} corpora (vocabulary, seed, spread): {corpora}")
        for cause, cells in pooled.items():
            print(f"    {cause:20s}: {_cells(cells)}")
        print(f"  engine faults on clean responses, and causes named where none was planted, "
              f"all corpora: {dict(faults)}")  # fmt: skip


def _one_corpus(
    args: argparse.Namespace, vocab: int, seed: int, spread: float
) -> tuple[dict[str, list[tuple[int, int]]], Counter[str]]:
    """Build one corpus, check it ``--repeat`` times, print what the check named and its time;
    the counts per planted cause, and the engine faults on its clean responses."""
    plan = (("clean", "all"),) * len(PLAN) if args.all_clean else PLAN
    corpus = build_corpus(vocab, args.tokens, seed, plan=plan, spread=spread)
    shards = list(torch.tensor_split(corpus.logits, args.tp, dim=1))
    print(
        f"rollout check: {corpus.logits.shape[0]} tokens in {len(corpus.rollouts)} responses, "
        f"V={vocab}, seed {seed}, TP={args.tp}, top-k {TOP_K} then top-p {TOP_P}, "
        f"T={TEMPERATURE}, row logit scales in [1/{spread:g}, {spread:g}], "
        f"torch threads {torch.get_num_threads()}"
    )
    times, cpu = [], []
    for _ in range(args.repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        check = check_rollout(
            shards, corpus.rollouts, engine_temperature=TEMPERATURE, top_k=TOP_K, top_p=TOP_P
        )
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    print(f"  {check.noise.describe(TEMPERATURE)}")
    print(
        f"  the true perturbation over each returned mask: median {np.median(corpus.eps):.3g}, "
        f"99th percentile {np.quantile(corpus.eps, 0.99):.3g}, max {corpus.eps.max():.3g}"
    )
    beyond = ~(
        (check.engine_logprob >= check.noise_low - check.bound)
        & (check.engine_logprob <= check.noise_high + check.bound)
    )
    print("  per planted cause, named on: the tokens it affects (moved beyond "
          f"{DETECTABLE:g} standard deviations of their noise); beyond the realised "
          "perturbation; beyond the check's stated noise; all it was planted on")  # fmt: skip
    every = np.ones(len(corpus.planted), dtype=np.bool_)
    columns = [corpus.affects, corpus.beyond_realised, beyond, every]
    found = named_counts(corpus.planted, columns, check.verdict)
    for cause, cells in found.items():
        print(f"    {cause:20s}: {_cells(cells)}")
    clean = [t for t in range(len(corpus.planted)) if _clean_response(corpus, check.response, t)]
    faults = Counter(check.verdict[t] for t in clean if check.verdict[t] in ENGINE_FAULTS)
    print(
        f"  clean responses: {len(clean)} tokens, verdicts "
        f"{dict(Counter(check.verdict[t] for t in clean))}, engine faults {dict(faults)}"
    )
    unplanted = [t for t, p in enumerate(corpus.planted) if not p]
    misnamed = Counter(check.verdict[t] for t in unplanted if check.verdict[t] in ENGINE_CAUSES)
    evidence = sum(len(e.tokens) for r in check.responses for e in r.evidence)
    print(
        f"  causes named where none was planted: {sum(misnamed.values())} of {len(unplanted)} "
        f"tokens {dict(misnamed)}; named by a response's evidence: {evidence} tokens"
    )
    print(
        f"  time: median {statistics.median(times):.2f} s wall of {args.repeat} (min "
        f"{min(times):.2f}, max {max(times):.2f}); CPU time, all threads, median "
        f"{statistics.median(cpu):.2f} s"
    )
    return found, faults + Counter({f"named where none was planted: {k}": v
                                    for k, v in misnamed.items()})  # fmt: skip


def _clean_response(corpus: Corpus, response: np.ndarray, t: int) -> bool:
    return not any(corpus.planted[u] for u in np.flatnonzero(response == response[t]))


if __name__ == "__main__":
    main()
