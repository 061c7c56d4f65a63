"""The second forward pass: the engine's logits are the trainer's plus a perturbation.

The engine never runs the trainer's forward pass: other kernels, another batch,
another TP degree, often bf16 logits. Its logits are modelled as ``x + d`` with
``|d|_inf <= eps`` on the row, a perturbation the check cannot see.

**The bound.** At temperature ``T`` the sampled token ``y``'s logprob over a set
``S`` (the mask, or the whole vocabulary) is ``lp = z_y - LSE_S(z)``, ``z = x / T``.
Its log-odds are ``lp - log(1 - exp(lp)) = z_y - LSE_{S - y}(z)``: the sampled
token's value against the log-sum-exp of the others. A perturbation of ``eps``
moves ``z_y`` by at most ``eps / T`` and the log-sum-exp of the others by at most
``eps / T`` (it is monotone and shifts with a constant), so

    |log-odds(engine) - log-odds(trainer)| <= 2 eps / T,

and ``d = +eps`` on ``y``, ``-eps`` elsewhere reaches it: the bound is exact. In
logprobs it is tighter than ``|d lp| <= 2 eps / T`` everywhere: a token of
probability ``p`` moves by about ``2 (1 - p) eps / T``, so a nearly certain token
barely moves while a rare one moves by the full ``2 eps / T``.
:func:`noise_interval` maps the log-odds interval back to logprobs.

**The per-token model.** bf16 rounding and the differences between two forward
passes are relative to each logit, so a token whose kept logits are small sees a
smaller perturbation than one whose are large. Each token's size is

    eps_t = a + b m_t,    m_t = max |x_v| over the token's returned mask,

the largest logit its logprob reads (:func:`token_magnitude`): ``a`` is the part
no magnitude explains, ``b`` the relative part. ``--logit-noise`` gives a constant
``eps`` (``a = eps``, ``b = 0``); ``logit_noise_model=(a, b)`` gives both.

**The estimate.** Each token needs at least ``s_t = T |d log-odds| / 2``. On a clean
token ``s_t`` is modelled as ``sigma_t |g|``, ``sigma_t = alpha + beta m_t`` and ``g``
a standard normal, so the conditional median of ``s_t`` is ``0.6745 sigma_t``: a
least-absolute-deviations line of ``s_t`` on ``m_t`` with both coefficients ``>= 0``
(:func:`median_line`; robust to the tokens a cause moves that no hypothesis
caught), each token weighed by its chance of being clean against the causes
(:func:`estimate_noise`), over 0.6745 gives ``alpha`` and ``beta``, and
``(a, b) = 6 (alpha, beta)``: a Gaussian token beyond its own
``eps_t`` is a six-sigma event; the margin is for the heavier tails of bf16
rounding. A perturbation larger than :data:`CEILING_UNITS` bf16 roundings of the
largest kept logit is not two forward passes of one policy: every ``eps_t`` is
capped there and the report says so. With fewer than :data:`MIN_TOKENS` tokens to
estimate from, ``eps`` is constant, the smallest size that explains them all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "CEILING_UNITS",
    "HALF_NORMAL_MEDIAN",
    "MIN_TOKENS",
    "NoiseEstimate",
    "SIGMAS",
    "estimate_noise",
    "given_noise",
    "log_odds",
    "median_line",
    "noise_interval",
    "token_magnitude",
    "token_shift",
]

Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]

SIGMAS = 6.0
"""The noise is this many robust scales of the per-token shift."""
HALF_NORMAL_MEDIAN = 0.6744897501960817
MIN_TOKENS = 16
CEILING_UNITS = 8.0
"""The largest believable perturbation, in bf16 unit roundoffs of the largest logit."""
BF16_UNIT = 2.0**-8
IRLS_STEPS = 50
MIXTURE_STEPS = 12
"""EM rounds of the clean-or-cause mixture the noise estimate weighs the tokens by."""


@dataclass(frozen=True)
class NoiseEstimate:
    """The per-token logit perturbation ``eps_t = a + b m_t`` (sup norm, logit units) the
    tokens are judged against, capped at ``ceiling``.

    ``source`` is ``"given"`` (``--logit-noise``: ``b = 0``), ``"given_model"`` (``a`` and
    ``b`` given), ``"estimated"``, ``"smallest"`` (too few tokens: the smallest constant
    explaining every one) or ``"capped"`` (the fit exceeded the ceiling of two forward
    passes on some token); ``tokens`` how many tokens it was estimated from, ``scale`` the
    robust scale ``sigma_t`` at the median magnitude, ``magnitude`` each token's ``m_t``
    (``tokens``, when estimated: the tokens' total chance of being clean).
    """

    a: float
    b: float
    source: str
    tokens: int
    scale: float
    ceiling: float
    magnitude: Floats

    @property
    def per_token(self) -> Floats:
        """Each token's ``eps_t``."""
        m = np.nan_to_num(np.asarray(self.magnitude, dtype=np.float64), nan=0.0)
        return np.asarray(np.minimum(self.a + self.b * m, self.ceiling), dtype=np.float64)

    @property
    def eps(self) -> float:
        """The median token's ``eps_t``: one number for summaries."""
        values = self.per_token
        return float(np.median(values)) if values.size else float(min(self.a, self.ceiling))

    def describe(self, temperature: float) -> str:
        values = self.per_token
        low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
        what = {
            "given": "given (--logit-noise), the same on every token",
            "given_model": "given (a and b)",
            "estimated": f"fitted to the equivalent of {self.tokens} clean tokens ({SIGMAS:g} x "
            f"their robust scale, {self.scale:.3g} at the median magnitude)",
            "smallest": f"the smallest constant explaining all {self.tokens} tokens (fewer than "
            f"{MIN_TOKENS} to estimate from; pass --logit-noise)",
            "capped": f"capped at {CEILING_UNITS:g} bf16 roundings of the largest logit "
            f"({self.ceiling:.3g}): the fit is more than two forward passes of one policy give",
        }[self.source]
        return (
            f"logit noise eps_t = a + b m_t with a = {self.a:.3g}, b = {self.b:.3g} (m_t: the "
            f"largest |logit| over the token's mask; {what}); eps_t from {low:.3g} to "
            f"{high:.3g}, median {self.eps:.3g}; it moves a token's log-odds by at most "
            f"2 eps_t / T = {2.0 * self.eps / temperature:.3g} at the median"
        )


def token_magnitude(kept: Floats) -> Floats:
    """Each row's ``m_t``: the largest ``|x|`` over its kept values (``-inf`` padded; 0 for a
    row with none finite)."""
    values = np.asarray(kept, dtype=np.float64)
    finite = np.isfinite(values)
    return np.asarray(np.max(np.where(finite, np.abs(values), 0.0), axis=1, initial=0.0))


def log_odds(logprob: Floats) -> Floats:
    """``lp - log(1 - exp(lp))``; ``+inf`` at ``lp = 0``, NaN where ``lp`` is NaN or > 0."""
    lp = np.asarray(logprob, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(lp - np.log(-np.expm1(lp)), dtype=np.float64)


def _log_sigmoid(odds: Floats) -> Floats:
    """The logprob of log-odds ``odds`` (the inverse of :func:`log_odds`)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(-np.logaddexp(0.0, -odds), dtype=np.float64)


def noise_interval(
    reference: Floats, eps: Floats | float, temperature: float
) -> tuple[Floats, Floats]:
    """The logprobs a perturbation of ``eps`` (per token, or one size) can give a token whose
    logprob is ``reference`` (``lo <= lp <= hi``): its log-odds within ``2 eps / T``. A token
    of logprob 0 (its set holds it alone) stays at 0; a non-finite reference gives itself."""
    odds = log_odds(reference)
    shift = 2.0 * eps / temperature
    low, high = _log_sigmoid(odds - shift), _log_sigmoid(odds + shift)
    special = ~np.isfinite(odds)
    low = np.where(special, reference, low)
    high = np.where(special, reference, high)
    return np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)


def token_shift(value: Floats, reference: Floats, temperature: float) -> Floats:
    """The smallest ``eps`` that moves ``reference`` to ``value``: ``T |d log-odds| / 2``
    (0 where both are equal; inf where only one is 0; NaN where either is missing)."""
    a, b = log_odds(value), log_odds(reference)
    with np.errstate(invalid="ignore"):
        shift = temperature * np.abs(a - b) / 2.0
    same = np.asarray(value) == np.asarray(reference)
    return np.asarray(np.where(same, 0.0, shift), dtype=np.float64)


def median_line(
    shift: Floats, magnitude: Floats, weight: Floats | None = None
) -> tuple[float, float]:
    """``(alpha, beta) >= 0`` minimising ``sum w |shift - alpha - beta magnitude|``.

    A (weighted) least-absolute-deviations line, by iteratively reweighted least squares
    from the ordinary fit; where it leaves the quadrant ``alpha, beta >= 0`` (or the
    magnitudes are all equal) the better of the two edges is taken (``beta = 0``: the
    median; ``alpha = 0``: the median of ``shift / magnitude`` weighted by ``magnitude``)."""
    s = np.asarray(shift, dtype=np.float64)
    m = np.asarray(magnitude, dtype=np.float64)
    w = np.ones_like(s) if weight is None else np.asarray(weight, dtype=np.float64)

    def cost(alpha: float, beta: float) -> float:
        return float((w * np.abs(s - alpha - beta * m)).sum())

    edges = [(_weighted_median(s, w), 0.0)]
    if (m > 0).any():
        edges.append((0.0, _weighted_median(s[m > 0] / m[m > 0], (w * m)[m > 0])))
    design = np.stack([np.ones_like(m), m], axis=1)
    floor = max(float(np.median(s)), 1e-300) * 1e-6
    if m.size and float(np.ptp(m)) > 0.0:
        root = np.sqrt(w)
        coef = np.linalg.lstsq(design * root[:, None], s * root, rcond=None)[0]
        for _ in range(IRLS_STEPS):
            root = np.sqrt(w / np.maximum(np.abs(s - design @ coef), floor))
            coef = np.linalg.lstsq(design * root[:, None], s * root, rcond=None)[0]
        if coef[0] >= 0.0 and coef[1] >= 0.0:
            edges.append((float(coef[0]), float(coef[1])))
    return min(edges, key=lambda line: cost(*line))


def _weighted_median(values: Floats, weights: Floats) -> float:
    order = np.argsort(values)
    total = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(total, total[-1] / 2.0)])


def estimate_noise(
    shift: Floats, misfit: Floats, magnitude: Floats, largest_logit: float
) -> NoiseEstimate:
    """The noise model from each informative token's ``shift`` (:func:`token_shift`; NaN
    where a token says nothing), each cause's ``misfit`` on it (``[causes, tokens]``, the
    shift from the cause's prediction; NaN where it predicts nothing) and each token's
    ``magnitude`` (:func:`token_magnitude`).

    A token a cause moved must not widen the noise, but leaving out every token some
    cause fits better than the clean value biases the scale low: with several causes
    tried, a large clean shift sits nearer one of their predictions more often than a
    small one does (on a clean rollout that leaves out 40% of the tokens, the large ones
    most, and one clean token in 2,000 lands beyond the noise). So each token is weighed
    by its chance of being clean under a mixture: clean, with ``shift ~ sigma_t |g|``, or
    moved by cause ``C``, with ``misfit_C ~ sigma_t |g|``, at shares fitted by EM with the
    line (:data:`MIXTURE_STEPS` rounds, from the unweighted line, which is too wide where
    causes abound: the side that lets the causes' tokens show). A clean shift near a
    cause's prediction by chance keeps most of its weight; a token far from the clean
    value and on a cause's prediction loses it."""
    ceiling = CEILING_UNITS * BF16_UNIT * largest_logit
    used = np.isfinite(shift)
    misfit = np.asarray(misfit, dtype=np.float64).reshape(-1, shift.size)
    if int(used.sum()) < MIN_TOKENS:
        # Too few for a mixture: the smallest size that explains every token no cause fits.
        with np.errstate(invalid="ignore"):
            unfitted = used & ~(misfit < shift).any(axis=0)
        eps = float(shift[unfitted].max(initial=0.0))
        count = int(unfitted.sum())
        return NoiseEstimate(eps, 0.0, "smallest", count, math.nan, ceiling, magnitude)
    s, m = shift[used], magnitude[used]
    fits = misfit[:, used]
    alpha, beta = median_line(s, m)
    share = np.full(fits.shape[0], 0.5 / max(fits.shape[0], 1))
    clean = np.ones_like(s)
    for _ in range(MIXTURE_STEPS):
        sigma = np.maximum((alpha + beta * m) / HALF_NORMAL_MEDIAN, 1e-300)
        with np.errstate(invalid="ignore", over="ignore"):
            terms = np.concatenate([[-0.5 * (s / sigma) ** 2], -0.5 * (fits / sigma) ** 2])
        terms = np.nan_to_num(terms, nan=-np.inf)
        top = terms.max(axis=0)
        weights = np.concatenate([[1.0 - share.sum()], share])[:, None] * np.exp(terms - top)
        posterior = weights / weights.sum(axis=0)
        clean, share = posterior[0], posterior[1:].mean(axis=1)
        alpha, beta = median_line(s, m, clean)
    a, b = SIGMAS * alpha / HALF_NORMAL_MEDIAN, SIGMAS * beta / HALF_NORMAL_MEDIAN
    scale = (alpha + beta * _weighted_median(m, clean)) / HALF_NORMAL_MEDIAN
    source = "capped" if a + b * float(magnitude.max(initial=0.0)) > ceiling else "estimated"
    return NoiseEstimate(a, b, source, round(float(clean.sum())), scale, ceiling, magnitude)


def given_noise(
    eps: float | tuple[float, float], magnitude: Floats, largest_logit: float
) -> NoiseEstimate:
    """The noise the caller gave: a constant ``eps`` (``--logit-noise``) or ``(a, b)``."""
    ceiling = CEILING_UNITS * BF16_UNIT * largest_logit
    if isinstance(eps, tuple):
        a, b = eps
        return NoiseEstimate(a, b, "given_model", 0, math.nan, math.inf, magnitude)
    return NoiseEstimate(eps, 0.0, "given", 0, math.nan, max(ceiling, eps), magnitude)
