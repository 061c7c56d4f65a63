"""A cause on part of a response, hidden by the noise on most of its tokens, is named from the
response's evidence; a clean response never is.

The responses come from two forward passes: the engine's logits are the trainer's plus
a Gaussian perturbation, its mask the top-k of its own logits at temperature T, and the
planted tokens' logprobs are over that mask at T = 1 (the temperature never applied).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tp_logprob.engine_formats import prime_rl_rollout
from tp_logprob.rollout import check_rollout
from tp_logprob.rollout.evidence import (
    POSTERIOR,
    THRESHOLD,
    attribute,
    log_ratios,
    mixture,
    typical_scale,
)
from tp_logprob.rollout.noise import token_shift

N, V, K, T = 400, 64, 12, 0.7
SIZE = 0.008
"""The perturbation of each engine logit, relative to the logit (two bf16 passes or so)."""


def _response(seed: int, planted: float) -> tuple[torch.Tensor, Any, np.ndarray, np.ndarray]:
    """Trainer logits, the engine's response, which tokens hold temperature_missing (a
    random ``planted`` share of them), and that cause's value from the trainer's logits."""
    generator = torch.Generator().manual_seed(seed)
    x = 3.0 * torch.randn(N, V, generator=generator, dtype=torch.float64)
    engine = x + SIZE * x.abs() * torch.randn(N, V, generator=generator, dtype=torch.float64)
    kept = torch.topk(engine / T, K, dim=1).indices
    mask = torch.zeros(N, V, dtype=torch.bool).scatter_(1, kept, True)
    z = torch.where(mask, engine / T, -torch.inf)
    token = torch.multinomial(torch.softmax(z, dim=1), 1, generator=generator)[:, 0]
    honest = torch.log_softmax(z, dim=1).gather(1, token[:, None])[:, 0]
    raw = torch.where(mask, engine, -torch.inf)
    missing = torch.log_softmax(raw, dim=1).gather(1, token[:, None])[:, 0]
    hit = np.random.default_rng(seed).random(N) < planted
    logprobs = torch.where(torch.from_numpy(hit), missing, honest)
    rollout = prime_rl_rollout(
        torch.nonzero(mask)[:, 1].numpy(),
        mask.sum(dim=1).numpy(),
        token.numpy(),
        logprobs=logprobs.tolist(),
        vocab_size=V,
    )
    at_one = torch.log_softmax(torch.where(mask, x, -torch.inf), dim=1)
    return x.float(), rollout, hit, at_one.gather(1, token[:, None])[:, 0].numpy()


def test_a_cause_on_half_a_response_is_named_on_the_tokens_within_the_noise_that_fit() -> None:
    x, rollout, hit, at_one = _response(seed=4, planted=0.5)
    check = check_rollout(x, rollout, engine_temperature=T)
    [finding] = check.responses
    assert finding.cause is None  # half the response: no whole-response fit
    [found] = finding.evidence
    assert found.cause == "temperature_missing" and found.gain >= THRESHOLD
    verdict = np.array(check.verdict)
    by_evidence = np.zeros(N, dtype=np.bool_)
    by_evidence[list(found.tokens)] = True
    # Within the noise a name is a posterior of 0.9, not a certainty: most, not all, are right.
    assert by_evidence.sum() >= 5 and hit[by_evidence].mean() >= 0.8
    assert all(
        check.details[t].startswith("named by the response's evidence") for t in found.tokens
    )
    # Every planted token within the noise that sits on the cause, far from the clean value,
    # is among them.
    within = np.isin(verdict, ("noise", "agree")) | by_evidence
    shift = token_shift(check.engine_logprob, check.oracle, T)
    sigma = typical_scale(shift, check.noise.per_token, within)
    clean = shift / sigma
    cause = token_shift(check.engine_logprob, at_one, 1.0) / sigma
    fits = hit & within & (cause <= 0.5) & (clean >= 3.2)
    assert fits.sum() >= 3 and by_evidence[fits].all()
    document = check.to_json()
    assert document["responses"][0]["evidence"][0]["named_within_noise"] == list(found.tokens)


@pytest.mark.parametrize("seed", range(8))
def test_a_clean_response_is_never_named_from_its_evidence(seed: int) -> None:
    x, rollout, _, _ = _response(seed=100 + seed, planted=0.0)
    check = check_rollout(x, rollout, engine_temperature=T)
    assert check.responses[0].evidence == ()
    assert not check.engine_at_fault()


def test_the_statistic_stays_below_its_threshold_on_gaussian_noise() -> None:
    """Clean tokens: the observation is the clean value plus Gaussian noise, the cause a
    random distance away; ``Lambda`` never reaches the threshold over 2,000 responses."""
    rng = np.random.default_rng(0)
    largest = 0.0
    for _ in range(2000):
        g = rng.standard_normal(300)
        apart = rng.uniform(0.0, 8.0, 300) * rng.choice([-1.0, 1.0], 300)
        sigma = np.full(300, 0.05)
        statistic, _ = mixture(
            log_ratios(np.abs(g) * sigma, np.abs(g - apart) * sigma, sigma)[None]
        )
        largest = max(largest, statistic)
    assert largest < THRESHOLD / 2
    # The cause sits 4 scales from the clean value on every token; half the tokens hold it.
    g = rng.standard_normal(300)
    observed = g + np.where(rng.random(300) < 0.5, 4.0, 0.0)
    sigma = np.full(300, 0.05)
    statistic, share = mixture(
        log_ratios(np.abs(observed) * sigma, np.abs(observed - 4.0) * sigma, sigma)[None]
    )
    assert statistic >= THRESHOLD and 0.3 <= share[0] <= 0.7


SCALE = 1.0


def _halves(seed: int) -> tuple[torch.Tensor, Any, np.ndarray]:
    """Trainer logits and a response whose first half holds temperature_missing and whose
    second half holds unrenormalised (the kept mass at T never renormalised), with the
    cause planted on each token."""
    generator = torch.Generator().manual_seed(seed)
    x = SCALE * torch.randn(N, V, generator=generator, dtype=torch.float64)
    engine = x + SIZE * x.abs() * torch.randn(N, V, generator=generator, dtype=torch.float64)
    kept = torch.topk(engine / T, K, dim=1).indices
    mask = torch.zeros(N, V, dtype=torch.bool).scatter_(1, kept, True)
    z = torch.where(mask, engine / T, -torch.inf)
    token = torch.multinomial(torch.softmax(z, dim=1), 1, generator=generator)[:, 0]
    missing = torch.log_softmax(torch.where(mask, engine, -torch.inf), dim=1)
    unrenormalised = torch.log_softmax(engine / T, dim=1)
    first = torch.arange(N) < N // 2
    logprobs = torch.where(first[:, None], missing, unrenormalised).gather(1, token[:, None])
    rollout = prime_rl_rollout(
        torch.nonzero(mask)[:, 1].numpy(),
        mask.sum(dim=1).numpy(),
        token.numpy(),
        logprobs=logprobs[:, 0].tolist(),
        vocab_size=V,
    )
    planted = np.where(first.numpy(), "temperature_missing", "unrenormalised")
    return x.float(), rollout, planted


@pytest.mark.parametrize("seed", range(3))
def test_two_causes_in_runs_are_told_apart_by_the_tokens_around_each(seed: int) -> None:
    """Both causes raise a likely token's logprob, so many tokens sit near both predictions;
    the halves of the response say which each holds."""
    x, rollout, planted = _halves(seed)
    check = check_rollout(x, rollout, engine_temperature=T)
    [finding] = check.responses
    assert {found.cause for found in finding.evidence} == set(planted)
    verdict = np.array(check.verdict)
    named = np.isin(verdict, planted)
    assert named.sum() >= N // 3
    assert (verdict[named] == planted[named]).all()


def test_the_chain_places_ambiguous_tokens_with_their_run_and_invents_no_runs() -> None:
    """Tokens that favour neither cause (equal log ratios) take their run's cause where the
    causes come in runs, and stay split where they come at random."""
    rng = np.random.default_rng(0)
    holds = np.repeat([0, 1], 150)
    ambiguous = rng.random(300) < 0.4
    clear = np.where(np.arange(2)[:, None] == holds, 6.0, -6.0)
    ratios = np.where(ambiguous, 5.0, clear)
    split = attribute(ratios)
    assert np.allclose(split.sum(axis=0), 1.0)
    inner = ambiguous & (np.abs(np.arange(300) - 150) > 10)
    assert (split[holds[inner], np.flatnonzero(inner)] >= POSTERIOR).all()
    shuffled = rng.permutation(300)
    split = attribute(ratios[:, shuffled])
    assert (split[:, ambiguous[shuffled]] < POSTERIOR).all()
    assert np.array_equal(attribute(ratios[:1]), np.ones((1, 300)))
