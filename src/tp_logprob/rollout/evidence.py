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
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class CauseEvidence:
    """A cause found present in a response: it explains ``beyond`` tokens beyond the noise;
    it raised ``Lambda`` by ``gain``, over ``within`` tokens within the noise, to
    ``statistic``, at the fitted ``share``; ``tokens`` are the ones within the noise it
    names (batch indices)."""

    cause: str
    beyond: int
    within: int
    gain: float
    statistic: float
    share: float
    tokens: tuple[int, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "cause": self.cause,
            "beyond_noise": self.beyond,
            "within_noise": self.within,
            "gain": self.gain,
            "statistic": self.statistic,
            "share": self.share,
            "named_within_noise": list(self.tokens),
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


def name_within_noise(ratios: Floats, distance: Floats, share: Floats) -> Floats:
    """Per token, the index of the cause (a row of ``ratios`` and ``distance``, ``v_t``) it is
    named after, or -1: within :data:`TIGHT` of it and a posterior of :data:`POSTERIOR`."""
    total = float(share.sum())
    scale = min(1.0, 0.5 / total) if total > 0.0 else 0.0
    weights = (share * scale)[:, None] * np.exp(ratios)
    posterior = weights / ((1.0 - total * scale) + weights.sum(axis=0))
    best = np.argmax(posterior, axis=0)
    picked = np.take_along_axis(posterior, best[None, :], axis=0)[0]
    close = np.take_along_axis(distance, best[None, :], axis=0)[0] <= TIGHT
    return np.asarray(np.where((picked >= POSTERIOR) & close, best, -1), dtype=np.int64)
