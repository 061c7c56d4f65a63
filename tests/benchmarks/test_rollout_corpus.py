"""The rollout check on benchmarks/rollout_corpus.py at a small vocabulary: every planted cause
is named on the tokens it moves beyond the noise, and the clean responses get no engine fault."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from tests.benchmarks import load_benchmark
from tp_logprob.rollout import check_rollout
from tp_logprob.rollout.report import ENGINE_FAULTS


@pytest.fixture(scope="module")
def checked() -> tuple[object, object]:
    corpus_module = load_benchmark("rollout_corpus")
    corpus = corpus_module.build_corpus(4096, 480, seed=1)
    check = check_rollout(
        corpus.logits, corpus.rollouts, engine_temperature=corpus_module.TEMPERATURE,
        top_k=corpus_module.TOP_K, top_p=corpus_module.TOP_P,
    )  # fmt: skip
    return corpus, check


def test_every_planted_cause_is_named_where_it_shows(checked: tuple[object, object]) -> None:
    """Named where the cause moves the logprob beyond what the two forward passes could
    (five standard deviations of the token's noise: the corpus's *affects*), and the
    noise the check states is near the true one."""
    corpus, check = checked
    planted, affects, verdict = corpus.planted, corpus.affects, check.verdict  # type: ignore[attr-defined]
    true = corpus.eps  # type: ignore[attr-defined]
    assert np.median(true) <= check.noise.eps <= 2.5 * np.median(true)  # type: ignore[attr-defined]
    shares = {}
    for cause in sorted(set(planted) - {""}):
        hit = [t for t, p in enumerate(planted) if p == cause and affects[t]]
        shares[cause] = (sum(verdict[t] == cause for t in hit), len(hit))
    named = sum(n for n, _ in shares.values())
    total = sum(count for _, count in shares.values())
    assert named >= 0.95 * total, shares
    for cause, (n, count) in shares.items():
        assert count == 0 or n >= 0.75 * count, (cause, shares)  # a few tokens each here
    assert {"temperature_other", "stale_policy", "support"} <= {
        cause for cause, (n, _) in shares.items() if n
    }, shares


def test_the_clean_responses_get_no_engine_fault(checked: tuple[object, object]) -> None:
    corpus, check = checked
    owner = check.response  # type: ignore[attr-defined]
    clean = [
        t for t in range(owner.size)
        if not any(corpus.planted[u] for u in np.flatnonzero(owner == owner[t]))  # type: ignore[attr-defined]
    ]  # fmt: skip
    verdicts = Counter(check.verdict[t] for t in clean)  # type: ignore[attr-defined]
    assert clean and not set(verdicts) & set(ENGINE_FAULTS), verdicts
    assert set(verdicts) <= {"agree", "noise", "borderline"}
