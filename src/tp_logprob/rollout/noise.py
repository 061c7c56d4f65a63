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

**The estimate.** Each token needs at least ``eps_t = T |d log-odds| / 2``. Over
the tokens that no cause fits better than the noise does, ``sigma`` is the robust
scale of ``eps_t`` (its median over 0.6745, a half-normal's), and ``eps = 6 sigma``:
a Gaussian token beyond it is a six-sigma event; the margin is for the heavier tails
of bf16 rounding, which grows with each logit. A perturbation
larger than :data:`CEILING_UNITS` bf16 roundings of the largest kept logit is not two
forward passes of one policy: the estimate is capped there and the report says so.
With fewer than :data:`MIN_TOKENS` tokens to estimate from, ``eps`` is the smallest
size that explains them all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "CEILING_UNITS",
    "MIN_TOKENS",
    "NoiseEstimate",
    "estimate_noise",
    "given_noise",
    "log_odds",
    "noise_interval",
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


@dataclass(frozen=True)
class NoiseEstimate:
    """The logit perturbation ``eps`` (sup norm, logit units) the tokens are judged against.

    ``source`` is ``"given"``, ``"estimated"``, ``"smallest"`` (too few tokens: the
    smallest size explaining every one) or ``"capped"`` (the estimate exceeded the
    ceiling of two forward passes); ``tokens`` how many tokens it was estimated from,
    ``scale`` their robust scale, ``ceiling`` the largest believable size.
    """

    eps: float
    source: str
    tokens: int
    scale: float
    ceiling: float

    def describe(self, temperature: float) -> str:
        bound = 2.0 * self.eps / temperature
        what = {
            "given": "given (--logit-noise)",
            "estimated": f"estimated from {self.tokens} tokens ({SIGMAS:g} x their robust "
            f"scale {self.scale:.3g})",
            "smallest": f"the smallest size explaining all {self.tokens} tokens (fewer than "
            f"{MIN_TOKENS} to estimate from; pass --logit-noise)",
            "capped": f"capped at {CEILING_UNITS:g} bf16 roundings of the largest logit: the "
            f"tokens' scale {self.scale:.3g} is more than two forward passes of one policy give",
        }[self.source]
        return (
            f"logit noise eps = {self.eps:.3g} ({what}); it moves a token's log-odds by at most "
            f"2 eps / T = {bound:.3g}"
        )


def log_odds(logprob: Floats) -> Floats:
    """``lp - log(1 - exp(lp))``; ``+inf`` at ``lp = 0``, NaN where ``lp`` is NaN or > 0."""
    lp = np.asarray(logprob, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(lp - np.log(-np.expm1(lp)), dtype=np.float64)


def _log_sigmoid(odds: Floats) -> Floats:
    """The logprob of log-odds ``odds`` (the inverse of :func:`log_odds`)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(-np.logaddexp(0.0, -odds), dtype=np.float64)


def noise_interval(reference: Floats, eps: float, temperature: float) -> tuple[Floats, Floats]:
    """The logprobs a perturbation of ``eps`` can give a token whose logprob is ``reference``
    (``lo <= lp <= hi``): its log-odds within ``2 eps / T``. A token of logprob 0 (its set
    holds it alone) stays at 0; a non-finite reference gives itself."""
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


def estimate_noise(shift: Floats, fitted: Bools, largest_logit: float) -> NoiseEstimate:
    """The noise from each informative token's ``shift`` (:func:`token_shift`; NaN where a
    token says nothing) over the tokens no cause ``fitted``."""
    ceiling = CEILING_UNITS * BF16_UNIT * largest_logit
    used = shift[np.isfinite(shift) & ~fitted]
    if used.size < MIN_TOKENS:
        eps = float(used.max(initial=0.0))
        return NoiseEstimate(eps, "smallest", int(used.size), math.nan, ceiling)
    scale = float(np.median(used)) / HALF_NORMAL_MEDIAN
    eps = SIGMAS * scale
    if eps > ceiling:
        return NoiseEstimate(ceiling, "capped", int(used.size), scale, ceiling)
    return NoiseEstimate(eps, "estimated", int(used.size), scale, ceiling)


def given_noise(eps: float, largest_logit: float) -> NoiseEstimate:
    """The noise the caller gave (``--logit-noise``)."""
    return NoiseEstimate(eps, "given", 0, math.nan, CEILING_UNITS * BF16_UNIT * largest_logit)
