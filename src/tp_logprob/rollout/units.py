"""The mismatch in the units RL training reads: |d logp|, KL, importance ratios, clip shares.

The tokens were sampled by the engine, so with ``log r = log p_trainer - log p_engine``
(the log importance ratio of PPO / GRPO, the engine the behaviour policy):

* mean and max ``|log r|`` over the tokens;
* ``k3 = (r - 1) - log r``, averaged: the unbiased, non-negative estimator of
  ``KL(engine || trainer)`` (Schulman's k3; verl's ``mismatch_kl``);
* the share of tokens with ``r`` outside ``[0.9, 1.1]``, and outside the clip
  ``[1 - clip, 1 + clip]`` (the share PPO's clipped objective ignores);
* the sequence log-ratio ``sum log r`` (a sequence-level importance weight's log):
  for a response its value, for a batch its mean and the one farthest from 0.

:func:`decompose` splits ``sum k3`` and ``sum |log r|`` by verdict: the share of
the mismatch each cause accounts for.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["BAND", "RLUnits", "decompose", "k3", "rl_units"]

Floats = npt.NDArray[np.float64]

BAND = 0.1
"""The importance-ratio band ``[1 - BAND, 1 + BAND]`` reported beside the clip."""


@dataclass(frozen=True)
class RLUnits:
    """The RL units of a set of tokens (see the module docstring); ``tokens`` counted."""

    tokens: int
    mean_abs: float
    max_abs: float
    k3: float
    outside_band: float
    outside_clip: float
    sequence_mean: float
    sequence_worst: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def k3(log_ratio: Floats) -> Floats:
    """Per token ``(r - 1) - log r`` (>= 0; 0 where ``r = 1``)."""
    return np.asarray(np.expm1(log_ratio) - log_ratio, dtype=np.float64)


def rl_units(log_ratio: Floats, response: npt.NDArray[np.int64], clip: float) -> RLUnits:
    """The units of the finite ``log_ratio`` values; ``response`` names each token's response
    (the sequence log-ratio sums within one)."""
    finite = np.isfinite(log_ratio)
    values, owners = log_ratio[finite], response[finite]
    if not values.size:
        nan = float("nan")
        return RLUnits(0, nan, nan, nan, nan, nan, nan, nan)
    size = np.abs(values)
    sequences = np.bincount(owners, weights=values)[np.unique(owners)]
    return RLUnits(
        tokens=int(values.size),
        mean_abs=float(size.mean()),
        max_abs=float(size.max()),
        k3=float(k3(values).mean()),
        outside_band=float(np.mean(np.abs(np.expm1(values)) > BAND)),
        outside_clip=float(np.mean(np.abs(np.expm1(values)) > clip)),
        sequence_mean=float(sequences.mean()),
        sequence_worst=float(sequences[np.argmax(np.abs(sequences))]),
    )


def decompose(log_ratio: Floats, verdicts: list[str]) -> dict[str, dict[str, float]]:
    """Per verdict with a mismatch: its share of ``sum k3`` and of ``sum |log r|``."""
    finite = np.isfinite(log_ratio)
    kl, size = k3(np.where(finite, log_ratio, 0.0)), np.abs(np.where(finite, log_ratio, 0.0))
    total_kl, total_abs = float(kl.sum()), float(size.sum())
    found: dict[str, dict[str, float]] = {}
    labels = np.array(verdicts, dtype=object)
    for verdict in dict.fromkeys(verdicts):
        inside = labels == verdict
        part_kl, part_abs = float(kl[inside].sum()), float(size[inside].sum())
        if part_abs > 0.0:
            found[verdict] = {
                "kl": part_kl / total_kl if total_kl > 0 else 0.0,
                "abs_logp": part_abs / total_abs,
            }
    return found
