"""Per-response evidence for a cause that the noise hides on most of the tokens it moves.

A cause on part of a response moves some of its tokens beyond the noise, where each
is named on its own, and others by less than the worst-case noise, which must also
cover every clean token: token by token those cannot be told from the noise. Over a
response they can. Each judged token's distance from a prediction is measured in
the typical noise ``sigma_t``: ``eps_t / 6``, the robust scale the noise estimate
fits (:mod:`tp_logprob.rollout.noise`), widened until the median clean token sits at
a half-normal's median (:func:`typical_scale`). ``u_t`` is the distance from the clean
value (the oracle), ``v_t`` from a cause ``C``'s exact prediction, both
``T |d log-odds| / 2 / sigma_t`` and modelled half-normal.

**Presence.** A response's tokens within the noise, and those beyond it that a cause
explains (the fixed ones, and the temperature solved for the response), are modelled
as a mixture: each is clean, or holds cause ``C`` with
probability ``pi_C``. With ``r_t(C) = (u_t^2 - v_t^2) / 2`` (clipped to ``+-``
:data:`CLIP`: the noise's tails are heavier than a Gaussian's, and no token may
decide alone) the log-likelihood gain of the mixture over the clean response is

    L(pi) = sum_t log(1 - sum_C pi_C + sum_C pi_C exp(r_t(C))),

maximised over the shares by EM. Causes join one at a time, the one that gains most
first, each only when it explains at least :data:`MIN_CONFIDENT` of the response's
tokens beyond the noise and it raises ``Lambda = 2 L`` by :data:`THRESHOLD` over the causes
already in: a cause whose predictions sit near another's (T = 1 over the mask and
over the whole vocabulary, on a narrow vocabulary) adds nothing once the other is in.
On a clean response every ``pi_C = 0`` is the truth, on the boundary: one cause's
``Lambda`` is 0 half the time and ``chi^2_1`` otherwise, so ``Lambda >= 30`` has a
chance of ``1e-8`` per response and cause, before the tokens beyond the noise are
asked for at all.

**Naming.** Where causes are present, a token within the noise takes ``C`` only when
its value is much closer to ``C``'s prediction than to the clean value and to every
other cause present: within :data:`TIGHT` typical scales of ``C``, and its posterior
under the fitted shares at least :data:`POSTERIOR`, the clean share held at one half
or more (a response mostly at fault must not lower the bar for each token; the
fitted shares are loose where a cause's prediction is near the clean value). At a
share of one half a token on ``C``'s prediction needs the clean value 1.7 scales
away, one :data:`TIGHT` scales from it 3.0. On the corpus of
``benchmarks/rollout_corpus.py`` (V = 32,000, seeds 0 and 1) these thresholds name
96.7% of the tokens a missing temperature moves beyond five standard deviations of
their noise and blame 1 of 3,557 clean tokens; a posterior of 0.9 within 1.5 scales
names 92.8% and blames none.

**Attribution.** Where several causes are present, their predictions often sit near
each other (a missing temperature and a kept mass never renormalised both raise a
likely token), and a token near both cannot say which it holds, within the noise or
beyond it. The response can: an engine's causes come in runs (the settings or the
weights it serves change mid-response, as with weights updated in flight), so the
token's neighbours say which cause is there. A hidden Markov chain over the judged
tokens in order, its states clean and each cause present, each token's weight
``exp(r_t(C))`` against the clean one's 1 (the mixture's), its transitions fitted by
Baum-Welch from a chain that keeps its state nine times in ten, gives each token's
share of its fault per cause (:func:`attribute`). Tokens mixed at random fit a chain
whose rows are alike: the mixture, which reads no order, and its shares. A token
within the noise then takes ``C`` at the mixture's posterior of a fault times ``C``'s
share of it; one beyond the noise that several causes present explain takes the cause
whose share is :data:`POSTERIOR` or more. On the corpora of ``benchmarks/bench_rollout.py``
the response half a missing temperature, half a kept mass never renormalised, had
42 of 49, 87 of 92 and 15 of 17 of the tokens those causes affect named right without
the chain (V = 152,064 seed 0 and V = 32,000 seed 0 with ``--spread 4``; V = 32,000
seed 1), and every one with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tp_logprob.rollout.noise import HALF_NORMAL_MEDIAN, MIN_TOKENS, SIGMAS

__all__ = [
    "CLIP",
    "MIN_CONFIDENT",
    "POSTERIOR",
    "THRESHOLD",
    "TIGHT",
    "CauseEvidence",
    "attribute",
    "log_ratios",
    "mixture",
    "name_within_noise",
    "select_causes",
    "typical_scale",
]

Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]

MIN_CONFIDENT = 3
"""Tokens beyond the noise a cause must explain before its evidence is weighed."""
THRESHOLD = 30.0
"""The rise in the likelihood ratio statistic a cause must bring: ``1e-8`` on a clean response."""
CLIP = 8.0
"""The largest log ratio one token contributes, either way."""
TIGHT = 2.5
"""A token named by a response's evidence lies within this many typical scales of the cause."""
POSTERIOR = 0.8
EM_STEPS = 200
STAY = 0.9
"""The chance, per token, of keeping its state in the chain :func:`attribute` starts from."""
CONVERGED = 1e-4
"""Baum-Welch stops once a round raises the log-likelihood by less (nats): a share then
moves by about 1e-3 more, far from :data:`POSTERIOR`'s margin."""


@dataclass(frozen=True)
class CauseEvidence:
    """A cause found present in a response: it explains ``beyond`` tokens beyond the noise;
    it raised ``Lambda`` by ``gain``, over ``within`` tokens within the noise, to
    ``statistic``, at the fitted ``share``; ``tokens`` are the ones within the noise it
    names, ``placed`` the ones beyond it that other causes present explain too and the
    response's runs give to this one (batch indices)."""

    cause: str
    beyond: int
    within: int
    gain: float
    statistic: float
    share: float
    tokens: tuple[int, ...]
    placed: tuple[int, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "cause": self.cause,
            "beyond_noise": self.beyond,
            "within_noise": self.within,
            "gain": self.gain,
            "statistic": self.statistic,
            "share": self.share,
            "named_within_noise": list(self.tokens),
            "placed_beyond_noise": list(self.placed),
        }


def typical_scale(shift: Floats, eps: Floats, clean: Bools) -> Floats:
    """Each token's ``sigma_t``: ``eps_t / 6``, widened so that the median of ``u_t`` over the
    ``clean`` tokens (within the noise, no cause named) is a half-normal's, 0.6745.

    The noise estimate leaves out every token a cause fits better than the noise, and a
    clean token whose shift happens to be large is often one: its scale is a lower bound.
    Tokens a cause moves within the noise only widen this one, the safe side."""
    sigma = np.where(eps > 0.0, eps / SIGMAS, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        u = shift / sigma
    used = clean & np.isfinite(u)
    widen = float(np.median(u[used])) / HALF_NORMAL_MEDIAN if int(used.sum()) >= MIN_TOKENS else 1.0
    return np.asarray(sigma * max(widen, 1.0), dtype=np.float64)


def log_ratios(clean: Floats, cause: Floats, sigma: Floats) -> Floats:
    """Each token's clipped ``r_t`` from its distances to the clean value and to the cause
    (0 where the cause gives no value: it is taken to say what the clean value says)."""
    u, v = clean / sigma, cause / sigma
    with np.errstate(invalid="ignore"):
        r = np.clip((u * u - v * v) / 2.0, -CLIP, CLIP)
    return np.asarray(np.nan_to_num(r, nan=0.0), dtype=np.float64)


def mixture(ratios: Floats) -> tuple[float, Floats]:
    """``(Lambda, shares)`` of the mixture of the clean response with the causes whose log
    ratios are ``ratios``'s rows (``[causes, tokens]``), by EM from equal shares."""
    causes, tokens = ratios.shape
    if not tokens or not causes:
        return 0.0, np.zeros(causes)
    weight = np.exp(ratios)
    share = np.full(causes, 0.5 / causes)
    for _ in range(EM_STEPS):
        total = (1.0 - share.sum()) + share @ weight
        share = share * (weight / total).mean(axis=1)
    gain = float(np.log((1.0 - share.sum()) + share @ weight).sum())
    return max(2.0 * gain, 0.0), share


def select_causes(ratios: dict[str, Floats], beyond: dict[str, int]) -> list[tuple[str, float]]:
    """The causes present, in the order they joined, each with its rise in ``Lambda``."""
    chosen: list[str] = []
    gains: list[tuple[str, float]] = []
    current = 0.0
    while True:
        left = [c for c in ratios if c not in chosen and beyond[c] >= MIN_CONFIDENT]
        scores = {c: mixture(np.stack([ratios[k] for k in (*chosen, c)]))[0] for c in left}
        best = max(scores, key=scores.__getitem__, default=None)
        if best is None or scores[best] - current < THRESHOLD:
            return gains
        chosen.append(best)
        gains.append((best, scores[best] - current))
        current = scores[best]


def attribute(ratios: Floats) -> Floats:
    """Per token, each cause's share of its fault (``[causes, tokens]``, summing to one over
    the causes) under the hidden Markov chain fitted to the response's tokens in order,
    ``ratios`` their log ratios (rows: causes)."""
    causes, tokens = ratios.shape
    if causes < 2 or not tokens:
        return np.ones_like(ratios)
    states = causes + 1
    weight = np.vstack([np.ones(tokens), np.exp(ratios)]).T  # [tokens, states]
    move = np.full((states, states), (1.0 - STAY) / causes)
    np.fill_diagonal(move, STAY)
    start = np.full(states, 1.0 / states)
    before = -math.inf
    for _ in range(EM_STEPS):
        forward, scale = np.empty((tokens, states)), np.empty(tokens)
        step = start * weight[0]
        for t in range(tokens):
            if t:
                step = (forward[t - 1] @ move) * weight[t]
            scale[t] = step.sum()
            forward[t] = step / scale[t]
        backward = np.ones((tokens, states))
        for t in range(tokens - 2, -1, -1):
            backward[t] = move @ (weight[t + 1] * backward[t + 1]) / scale[t + 1]
        seen = forward * backward
        pairs = forward[:-1, :, None] * move * (weight[1:] * backward[1:])[:, None, :]
        move = (pairs / scale[1:, None, None]).sum(axis=0) + 1e-300
        move /= move.sum(axis=1, keepdims=True)
        start = seen[0]
        likelihood = float(np.log(scale).sum())
        if likelihood - before < CONVERGED:
            break
        before = likelihood
    fault = seen[:, 1:]
    total = fault.sum(axis=1, keepdims=True)
    share = np.divide(fault, total, out=np.full_like(fault, 1.0 / causes), where=total > 0.0)
    return np.asarray(share.T, dtype=np.float64)


def name_within_noise(
    ratios: Floats, distance: Floats, share: Floats, split: Floats | None = None
) -> Floats:
    """Per token, the index of the cause (a row of ``ratios`` and ``distance``, ``v_t``) it is
    named after, or -1: within :data:`TIGHT` of it and a posterior of :data:`POSTERIOR`;
    ``split`` (:func:`attribute`), where given, lays each token's posterior of a fault on
    the causes by their shares of it."""
    total = float(share.sum())
    scale = min(1.0, 0.5 / total) if total > 0.0 else 0.0
    weights = (share * scale)[:, None] * np.exp(ratios)
    posterior = weights / ((1.0 - total * scale) + weights.sum(axis=0))
    if split is not None:
        posterior = posterior.sum(axis=0) * split
    best = np.argmax(posterior, axis=0)
    picked = np.take_along_axis(posterior, best[None, :], axis=0)[0]
    close = np.take_along_axis(distance, best[None, :], axis=0)[0] <= TIGHT
    return np.asarray(np.where((picked >= POSTERIOR) & close, best, -1), dtype=np.int64)
