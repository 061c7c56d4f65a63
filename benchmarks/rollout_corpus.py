"""A corpus of rollouts from two forward passes, with every common cause planted.

The trainer's logits are ``4 * randn`` (float32). The engine's are the trainer's
plus a perturbation the size of two bf16 forward passes (``sqrt(2) u |x| randn``,
``u = 2^-8`` the bf16 unit roundoff), then rounded to bf16: each a different
forward pass of the same policy. The engine samples at temperature 0.7 from
top-k 50 then top-p 0.95 (vLLM's order, ties kept) on its own logits, returns its
mask, and gives the fp32 logprob over it. Causes are planted on responses or on
subsets of tokens (:data:`PLAN`); one response is half one cause, half another.

A planted token *affects* the check when the planted logprob lies beyond what the
two forward passes could give it: more than :data:`DETECTABLE` standard deviations of
the token's own noise from the trainer's value (the shift ``T |d log-odds| / 2``
that :func:`tp_logprob.rollout.noise.token_shift` measures, its standard deviation
linearised from the perturbation's law on each logit the logprob reads), and beyond
the fp32 op's own error bound (what a correct op's rounding can give). A change the
noise makes on one clean token in a million cannot be told from the noise, token by
token. The corpus also keeps each token's realised perturbation (its sup norm over
the returned mask) and whether the planted value lies beyond what that realised
perturbation allows (:func:`tp_logprob.rollout.noise.noise_interval`): a stricter
count, which takes in changes the noise makes on one clean token in twenty.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from tp_logprob.engine_formats import EngineRollout, prime_rl_rollout
from tp_logprob.oracle import tolerance
from tp_logprob.rollout.noise import noise_interval, token_shift

TEMPERATURE = 0.7
TOP_K = 50
TOP_P = 0.95
BF16_UNIT = 2.0**-8

PLAN: tuple[tuple[str, str], ...] = (
    ("clean", "all"),
    ("clean", "all"),
    ("temperature_missing", "half"),
    ("temperature_twice", "all"),
    ("temperature_other", "all"),
    ("unrenormalised", "half"),
    ("raw", "all"),
    ("recomputed_mask", "half"),
    ("support", "quarter"),
    ("stale_policy", "all"),
    ("temperature_missing+unrenormalised", "halves"),
    ("clean", "all"),
)
"""Per response: the cause, and on which tokens (all, half at random, a quarter at random,
or the first half one cause and the second half the other)."""

OTHER_TEMPERATURE = 0.9
STALE_SIZE = 1.0
DETECTABLE = 5.0
"""Standard deviations of a token's own noise beyond which a planted change affects the check."""


@dataclass(frozen=True)
class Corpus:
    """The trainer's logits (all responses' tokens in order), the engine's responses, and
    per token the cause planted there (``""`` where none), whether it affects the check,
    the two forward passes' perturbation over its returned mask (sup norm), and whether the
    planted value lies beyond what that realised perturbation allows."""

    logits: torch.Tensor
    rollouts: list[EngineRollout]
    planted: list[str]
    affects: np.ndarray
    eps: np.ndarray
    beyond_realised: np.ndarray


def build_corpus(
    vocab: int,
    tokens: int,
    seed: int = 0,
    plan: tuple[tuple[str, str], ...] = PLAN,
    spread: float = 1.0,
) -> Corpus:
    """``len(plan)`` responses of ``tokens // len(plan)`` tokens each at vocabulary ``vocab``.

    With ``spread > 1`` each row's logits are scaled by a factor drawn log-uniformly in
    ``[1 / spread, spread]`` (a real policy's positions differ in how peaked they are, and
    each forward pass's perturbation grows with its logits); 1 keeps every row alike."""
    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    per = max(1, tokens // len(plan))
    x = 4.0 * torch.randn(per * len(plan), vocab, generator=generator)
    if spread > 1.0:
        scale = np.exp(rng.uniform(-math.log(spread), math.log(spread), x.shape[0]))
        x *= torch.from_numpy(scale.astype(np.float32))[:, None]
    rollouts, planted, affects, realised, sizes = [], [], [], [], []
    for index, (cause, where) in enumerate(plan):
        rows = x[index * per : (index + 1) * per]
        size = math.sqrt(2.0) * BF16_UNIT * rows.abs()
        clean = (rows + size * torch.randn(rows.shape, generator=generator)).bfloat16().float()
        engine = clean
        if cause == "stale_policy":
            engine = rows + STALE_SIZE * torch.randn(rows.shape, generator=generator)
            engine = engine.bfloat16().float()
        causes = _where(cause, where, per, rng)
        rollout, hit, eps, beyond = _response(rows, engine, clean, causes, generator)
        rollouts.append(rollout)
        planted += causes
        affects += hit
        realised += beyond
        sizes.append(eps)
    return Corpus(
        x, rollouts, planted, np.array(affects, dtype=np.bool_), np.concatenate(sizes),
        np.array(realised, dtype=np.bool_),
    )  # fmt: skip


def _where(cause: str, where: str, count: int, rng: np.random.Generator) -> list[str]:
    if cause == "clean":
        return [""] * count
    if where == "halves":
        first, second = cause.split("+")
        return [first if t < count // 2 else second for t in range(count)]
    share = {"all": 1.0, "half": 0.5, "quarter": 0.25}[where]
    chosen = rng.random(count) < share
    return [cause if c else "" for c in chosen]


def _support(z: torch.Tensor) -> torch.Tensor:
    """The engine's mask: top-k then top-p on its tempered logits, ties at a boundary kept.

    Top-p reads the top-k survivors only, so it runs on the ``TOP_K`` largest values (in
    descending order); a tie at either boundary keeps every tied column."""
    top = torch.topk(z, TOP_K, dim=1).values
    p = torch.softmax(top.double(), dim=1)
    above = torch.cumsum(p, dim=1) - p
    threshold = torch.where(above < TOP_P, top, math.inf).min(dim=1, keepdim=True).values
    return z >= torch.maximum(threshold, top[:, -1:])


def _logprob(z: torch.Tensor, mask: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """The fp32 logprob of ``token`` over ``mask`` (all True: the full vocabulary)."""
    return torch.log_softmax(torch.where(mask, z, -math.inf), dim=1).gather(1, token[:, None])[:, 0]


def _response(
    trainer: torch.Tensor,
    engine: torch.Tensor,
    clean: torch.Tensor,
    causes: list[str],
    generator: torch.Generator,
) -> tuple[EngineRollout, list[bool], np.ndarray, list[bool]]:
    t = TEMPERATURE
    z = engine / t
    mask = _support(z)
    probs = torch.softmax(torch.where(mask, z, -math.inf), dim=1)
    token = torch.multinomial(probs, 1, generator=generator)[:, 0]
    full = torch.ones_like(mask)
    planted = {
        "temperature_missing": lambda: _logprob(engine, mask, token),
        "temperature_twice": lambda: _logprob(z / t, mask, token),
        "temperature_other": lambda: _logprob(engine / OTHER_TEMPERATURE, mask, token),
        "unrenormalised": lambda: _logprob(z, full, token),
        "raw": lambda: _logprob(engine, full, token),
    }
    values = {cause: planted[cause]() for cause in set(causes) & set(planted)}
    returned = mask.clone()
    kept_beyond_noise = [False] * len(causes)
    logprobs = _logprob(z, mask, token)
    for row, cause in enumerate(causes):
        if cause == "recomputed_mask":
            # The returned mask is top-k's alone; the logprob is over top-k and top-p.
            returned[row] = z[row] >= torch.topk(z[row], TOP_K).values[-1]
        elif cause == "support":
            # The returned mask drops the most likely token the engine did not sample.
            drop = torch.argsort(torch.where(mask[row], z[row], -math.inf), descending=True)
            victim = int(drop[0]) if int(drop[0]) != int(token[row]) else int(drop[1])
            if mask[row].sum() < 2:
                causes[row] = ""  # a mask of one token has nothing to drop
                continue
            returned[row, victim] = False
            kept_beyond_noise[row] = _kept_beyond_noise(trainer[row], victim)
            one = slice(row, row + 1)
            logprobs[row] = _logprob(z[one], returned[one], token[one])[0]
        if cause in values:
            logprobs[row] = values[cause][row]
    rollout = _rollout(returned, token, logprobs)
    eps = torch.where(returned, (clean - trainer).abs(), 0.0).max(dim=1).values.double().numpy()
    affects = _affects(trainer, returned, token, logprobs, causes, kept_beyond_noise)
    beyond = _beyond_realised(trainer, eps, returned, token, logprobs, causes)
    return rollout, affects, eps, beyond


def _rollout(mask: torch.Tensor, token: torch.Tensor, logprobs: torch.Tensor) -> EngineRollout:
    counts = mask.sum(dim=1).numpy()
    ids = torch.nonzero(mask)[:, 1].numpy()
    return prime_rl_rollout(
        ids, counts, token.numpy(), logprobs=logprobs.double().tolist(), vocab_size=mask.shape[1]
    )


def _affects(
    trainer: torch.Tensor,
    returned: torch.Tensor,
    token: torch.Tensor,
    logprobs: torch.Tensor,
    causes: list[str],
    kept_beyond_noise: list[bool],
) -> list[bool]:
    """Per token: a cause is planted there and moves the logprob more than :data:`DETECTABLE`
    standard deviations of the token's noise from the trainer's value over the returned mask
    (a lone kept token, logprob 0 under any noise, is affected by any other value), and
    beyond the op's own rounding (:func:`_beyond_rounding`); a support fault affects it
    when the rules keep the dropped token beyond the noise."""
    z = trainer.double() / TEMPERATURE
    reference = _logprob(z, returned, token).numpy()
    shift = token_shift(logprobs.double().numpy(), reference, TEMPERATURE)
    sigma = _noise_deviation(trainer.double(), returned, token)
    rounding = _beyond_rounding(z, returned, reference, logprobs)
    found = []
    for row, cause in enumerate(causes):
        moved = rounding[row] and (
            bool(shift[row] > DETECTABLE * sigma[row]) or reference[row] == 0.0
        )
        wrong_mask = cause == "support" and kept_beyond_noise[row]
        found.append(bool(cause) and (wrong_mask or (cause != "support" and moved)))
    return found


def _kept_beyond_noise(x: torch.Tensor, victim: int) -> bool:
    """Whether top-k then top-p keep column ``victim`` of the trainer's logits ``x`` beyond
    :data:`DETECTABLE` standard deviations of the two passes' noise.

    Top-p keeps it while ``f = log(sum_A e^z) - log(sum_K e^z) < log top_p``, ``A`` the
    top-k survivors above it and ``K`` all of them (``z = x / T``); to first order a
    perturbation ``d`` moves ``f`` by ``sum_u (a_u [u in A] - b_u) d_u / T``, ``a`` and ``b``
    the softmax over ``A`` and over ``K``. The victim is the most likely token the engine did
    not sample: always within the top k."""
    z = x.double() / TEMPERATURE
    top = torch.topk(z, TOP_K)
    ids, values = top.indices, top.values
    above = values > z[victim]
    if not bool(above.any()):
        return True
    a = torch.where(above, torch.softmax(torch.where(above, values, -math.inf), 0), 0.0)
    b = torch.softmax(values, 0)
    f = float(torch.logsumexp(values[above], 0) - torch.logsumexp(values, 0))
    variance = _perturbation_variance(x.double()[ids])
    sigma = float(((a - b) ** 2 * variance).sum().sqrt()) / TEMPERATURE
    return math.log(TOP_P) - f > DETECTABLE * sigma


def _noise_deviation(x: torch.Tensor, mask: torch.Tensor, token: torch.Tensor) -> np.ndarray:
    """Each token's standard deviation of ``T |d log-odds| / 2`` under the two forward passes.

    The log-odds are ``(x_y - LSE_{S - y}(x)) / T``; to first order a perturbation ``d``
    moves them by ``(d_y - sum_i w_i d_i) / T`` with ``w`` the softmax of ``x / T`` over the
    mask without ``y``. Each ``d_i`` is the Gaussian part (variance ``2 u^2 x_i^2``) plus
    bf16 rounding (uniform over half a unit in the last place of ``x_i``: variance
    ``(ulp_i / 2)^2 / 3``), independent across logits."""
    variance = _perturbation_variance(x)
    rows = torch.arange(x.shape[0])
    others = mask.clone()
    others[rows, token] = False
    w = torch.softmax(torch.where(others, x / TEMPERATURE, -math.inf), dim=1).nan_to_num(0.0)
    total = variance[rows, token] + (w * w * variance).sum(dim=1)
    return (0.5 * total.sqrt()).numpy()


def _perturbation_variance(x: torch.Tensor) -> torch.Tensor:
    """Each logit's variance under the two passes: the Gaussian part ``2 u^2 x^2`` plus bf16
    rounding, uniform over half a unit in the last place of ``x`` (``(ulp / 2)^2 / 3``)."""
    rounding = torch.exp2(torch.floor(torch.log2(x.abs().clamp_min(1e-30))) - 8.0) ** 2 / 3.0
    return 2.0 * BF16_UNIT**2 * x * x + rounding


def _beyond_realised(
    trainer: torch.Tensor,
    eps: np.ndarray,
    returned: torch.Tensor,
    token: torch.Tensor,
    logprobs: torch.Tensor,
    causes: list[str],
) -> list[bool]:
    """Per token: a cause is planted there and moves the logprob beyond what the realised
    perturbation allows around the trainer's value over the returned mask (a support fault
    always counts: the mask itself is wrong)."""
    z = trainer.double() / TEMPERATURE
    reference = _logprob(z, returned, token).numpy()
    rounding = _beyond_rounding(z, returned, reference, logprobs)
    found = []
    for row, cause in enumerate(causes):
        low, high = noise_interval(reference[row : row + 1], float(eps[row]), TEMPERATURE)
        value = float(logprobs[row])
        moved = rounding[row] and not low[0] <= value <= high[0]
        found.append(bool(cause) and (cause == "support" or moved))
    return found


def _beyond_rounding(
    z: torch.Tensor, returned: torch.Tensor, reference: np.ndarray, logprobs: torch.Tensor
) -> np.ndarray:
    """Per token: the planted logprob lies beyond the fp32 op's own error bound around the
    exact value over the returned mask (``docs/tolerances.md``; the mask's kept columns as
    the shard, one shard): a change a correct op's rounding can make is no cause's mark
    (a one-token mask's logprob 0 against an exact ``-4e-9`` is what fp32 gives)."""
    lse = torch.logsumexp(torch.where(returned, z, -math.inf), dim=1).numpy()
    kept = int(returned.sum(dim=1).max())
    bound = tolerance("fp32", z.shape[1], max_shard_size=kept).selected_bound(reference, lse)
    return np.asarray(np.abs(logprobs.double().numpy() - reference) > bound)
