"""The common causes of an engine logprob that the noise cannot explain, each a hypothesis.

Every hypothesis predicts the engine's logprob from the trainer's logits; a token
beyond the noise takes the first cause whose prediction, under the same noise
(:func:`~tp_logprob.rollout.noise.noise_interval` at the hypothesis' temperature)
and the op's bound, holds the engine's value:

* ``temperature_missing``: over the mask at T = 1 (the temperature never applied);
* ``temperature_twice``: over the mask at T^2 (applied twice: 0.7 becomes 0.49);
* ``unrenormalised``: over the whole vocabulary at T: the mask applied to the
  probabilities but the kept mass never renormalised;
* ``raw``: over the whole vocabulary at T = 1 (vLLM's ``logprobs_mode=raw_logprobs``;
  at T = 1 it is the same number as ``unrenormalised`` and takes this name);
* ``recomputed_mask``: over the support the rules give on the trainer's logits
  (:func:`~tp_logprob.oracle.exact_support`), not the mask returned;
* ``temperature_other``: over the mask at a temperature solved per response (the one
  that fits most of its unexplained tokens; :func:`solve_temperature`);
* ``stale_policy``: most of a response's tokens beyond the noise, most of those with
  no cause, and no cause for the response: logits from other weights, said once per
  response (:func:`is_stale`); every token of it beyond the noise takes the name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.rollout.noise import noise_interval

__all__ = [
    "ENGINE_CAUSES",
    "Hypothesis",
    "explained",
    "fixed_hypotheses",
    "full_vocabulary_lse",
    "is_stale",
    "kept_logprob",
    "solve_temperature",
]

Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]

ENGINE_CAUSES = (
    "temperature_missing",
    "temperature_twice",
    "unrenormalised",
    "raw",
    "recomputed_mask",
    "temperature_other",
    "stale_policy",
)
STALE_SHARE = 0.5
"""A response is stale when at least this share of its judged tokens is beyond the noise
with no cause."""
MIN_STALE = 4
MIN_SOLVE = 3
SOLVE_GRID = np.geomspace(1.0 / 16.0, 16.0, 97)
"""The inverse temperatures tried, as multiples of the engine's."""


@dataclass(frozen=True)
class Hypothesis:
    """A cause: the logprob over ``support`` (``"mask"``, ``"full"``, ``"recomputed"``) at
    ``temperature``; ``what`` says it in the report."""

    name: str
    temperature: float
    support: str
    what: str


def fixed_hypotheses(temperature: float, has_params: bool) -> list[Hypothesis]:
    """The causes tried on every token beyond the noise, in the order they are preferred."""
    t = temperature
    found = []
    if t != 1.0:
        found += [
            Hypothesis("temperature_missing", 1.0, "mask", "the temperature never applied (T=1)"),
            Hypothesis(
                "temperature_twice", t * t, "mask", f"the temperature applied twice (T={t * t:.4g})"
            ),
            Hypothesis(
                "unrenormalised", t, "full",
                "the kept mass never renormalised (a logprob over the full vocabulary at T)",
            ),
            Hypothesis("raw", 1.0, "full", "a raw logprob (the full vocabulary at T=1)"),
        ]  # fmt: skip
    else:
        found.append(
            Hypothesis(
                "raw", 1.0, "full",
                "over the full vocabulary: a raw logprob, or the kept mass never renormalised",
            )
        )  # fmt: skip
    if has_params:
        found.append(
            Hypothesis(
                "recomputed_mask", t, "recomputed",
                "over the support the rules recompute, not the mask returned",
            )
        )  # fmt: skip
    return found


def kept_logprob(kept: Floats, local: npt.NDArray[np.int64], temperature: float) -> Floats:
    """Each row's sampled logprob over its kept values (``-inf`` padded) at ``temperature``,
    the logits divided in fp32 as the oracle does; float64 otherwise."""
    z = _divided(kept, temperature)
    top = np.max(z, axis=1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        lse = np.log(np.sum(np.exp(z - top), axis=1)) + top[:, 0]
        picked = np.take_along_axis(z, local[:, None], axis=1)[:, 0]
        return np.asarray(picked - lse, dtype=np.float64)


def _divided(values: Floats, temperature: float) -> Floats:
    with np.errstate(over="ignore", invalid="ignore"):
        x32 = values.astype(np.float32)
        return np.asarray((x32 / np.float32(temperature)).astype(np.float64), dtype=np.float64)


def full_vocabulary_lse(
    columns: list[Any], rv: int, temperatures: Sequence[float], block: int
) -> dict[float, Floats]:
    """The log-sum-exp over the live vocabulary of every row at each of ``temperatures``,
    shard by shard and block by block, combined in float64.

    Each block's is a float32 one in numpy (max-shifted, pairwise sums: a relative error
    of a few float32 units; numpy's vectorised ``exp`` is several times faster than
    torch's on CPU): the hypotheses it serves are judged against the noise and the op's
    bound, which are larger."""
    import torch

    rows = int(columns[0].shape[0])
    found = {t: np.full(rows, -math.inf) for t in temperatures}
    start_column = 0
    for part in columns:
        width = min(int(part.shape[1]), max(rv - start_column, 0))
        start_column += int(part.shape[1])
        if not width:
            continue
        for start in range(0, rows, block):
            x = part[start : start + block, :width].to(torch.float32).numpy()
            for t in temperatures:
                lse = _lse32(x if t == 1.0 else x / np.float32(t))
                done = found[t][start : start + block]
                found[t][start : start + block] = np.logaddexp(done, lse)
    return found


def _lse32(z: npt.NDArray[np.float32]) -> Floats:
    with np.errstate(invalid="ignore", over="ignore"):
        top = z.max(axis=1, keepdims=True)
        top = np.where(np.isfinite(top), top, np.float32(0.0))
        shifted = z - top
        np.exp(shifted, out=shifted)
        total = np.log(shifted.sum(axis=1).astype(np.float64))
        return np.asarray(top[:, 0].astype(np.float64) + total, dtype=np.float64)


def explained(
    engine: Floats, predicted: Floats, bound: Floats, eps: Floats | float, temperature: float
) -> Bools:
    """Where ``predicted`` under the noise (``eps``: per token, or one size) and the op's
    ``bound`` holds the engine's value."""
    low, high = noise_interval(predicted, eps, temperature)
    with np.errstate(invalid="ignore"):
        inside = (engine >= low - bound) & (engine <= high + bound)
    return np.asarray(inside | (engine == predicted), dtype=np.bool_)


def solve_temperature(
    engine: Floats,
    kept: Floats,
    local: npt.NDArray[np.int64],
    temperature: float,
) -> float | None:
    """The temperature that best fits ``engine`` over the kept values (the median distance
    in log-odds, on :data:`SOLVE_GRID` around the engine's, then refined); None with fewer
    than :data:`MIN_SOLVE` tokens."""
    from tp_logprob.rollout.noise import log_odds

    if engine.size < MIN_SOLVE:
        return None
    target = log_odds(engine)

    def misfit(scale: float) -> float:
        values = log_odds(kept_logprob(kept, local, temperature / scale))
        with np.errstate(invalid="ignore"):
            return float(np.nanmedian(np.abs(values - target)))

    scores = [misfit(s) for s in SOLVE_GRID]
    best = int(np.nanargmin(scores))
    low = SOLVE_GRID[max(best - 1, 0)]
    high = SOLVE_GRID[min(best + 1, SOLVE_GRID.size - 1)]
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(24):  # golden section on the bracketing cells
        a, b = high - ratio * (high - low), low + ratio * (high - low)
        if misfit(a) <= misfit(b):
            high = b
        else:
            low = a
    return float(temperature / ((low + high) / 2.0))


def is_stale(beyond: Bools, unexplained: Bools, judged: Bools) -> bool:
    """Most of a response's judged tokens beyond the noise, and most of those with no cause
    of their own (the causes a token matches by chance, when its logits are far off)."""
    far = int((beyond & judged).sum())
    return (
        far >= MIN_STALE
        and far >= STALE_SHARE * int(judged.sum())
        and int((unexplained & judged).sum()) >= STALE_SHARE * far
    )
