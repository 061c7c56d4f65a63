"""The rollout check's result: per token, per response and per batch; markdown and JSON.

Verdicts fall in four groups: clean (``agree``: within the op's bound; ``noise``:
within the logit noise; ``borderline``: a mask decision that flips within the
noise), not judged (``no_mask``, ``no_logprob``), engine faults (each cause of
:mod:`tp_logprob.rollout.causes`, ``unexplained``, ``support``: a mask the rules
refuse even under the noise) and trainer faults (``trainer_temperature``,
``trainer_numerics``); a ``nonfinite`` token (an infinite logprob on any side) is a
fault of its own, named in the report.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.judging.bounds import fp32_ulp
from tp_logprob.rollout.causes import ENGINE_CAUSES
from tp_logprob.rollout.evidence import CauseEvidence
from tp_logprob.rollout.noise import NoiseEstimate
from tp_logprob.rollout.units import RLUnits, decompose, rl_units

__all__ = ["CLEAN", "ENGINE_FAULTS", "VERDICTS", "ResponseFinding", "RolloutCheck"]

Floats = npt.NDArray[np.float64]

CLEAN = ("agree", "noise", "borderline")
NOT_JUDGED = ("no_mask", "no_logprob")
ENGINE_FAULTS = (*ENGINE_CAUSES, "unexplained", "support")
TRAINER_FAULTS = ("trainer_temperature", "trainer_numerics")
VERDICTS = (*CLEAN, *NOT_JUDGED, *ENGINE_FAULTS, *TRAINER_FAULTS, "nonfinite")
"""Every per-token verdict, in the order the report lists them."""


@dataclass(frozen=True)
class ResponseFinding:
    """What the check found about one response as a whole: its tokens ``begin:end``, the
    temperature solved for it (None if none fits), whether it looks like a stale policy,
    the cause the whole response fits (None if none), and the causes its evidence finds
    present on part of it (:mod:`tp_logprob.rollout.evidence`)."""

    index: int
    begin: int
    end: int
    solved_temperature: float | None
    stale: bool
    cause: str | None
    evidence: tuple[CauseEvidence, ...] = ()


@dataclass(frozen=True)
class RolloutCheck:
    """Per token (all responses in order): the response it belongs to, the oracle's, the
    trainer's and the engine's logprobs, the op's bound, the interval the noise allows
    around the oracle, and the verdict with its reason; per response its findings."""

    engine: str
    settings: dict[str, Any]
    noise: NoiseEstimate
    response: npt.NDArray[np.int64]
    token_ids: npt.NDArray[np.int64]
    oracle: Floats
    trainer: Floats
    engine_logprob: Floats
    bound: Floats
    noise_low: Floats
    noise_high: Floats
    verdict: list[str]
    details: list[str]
    responses: list[ResponseFinding]

    def counts(self, begin: int = 0, end: int | None = None) -> dict[str, int]:
        found = Counter(self.verdict[begin:end])
        return {verdict: found[verdict] for verdict in VERDICTS if found[verdict]}

    def failed(self) -> bool:
        """Any token with a fault (engine, trainer or non-finite)."""
        return any(v not in CLEAN and v not in NOT_JUDGED for v in self.verdict)

    def engine_at_fault(self) -> list[int]:
        return [t for t, v in enumerate(self.verdict) if v in ENGINE_FAULTS]

    def nonfinite(self) -> list[int]:
        return [t for t, v in enumerate(self.verdict) if v == "nonfinite"]

    def log_ratio(self) -> Floats:
        """``log p_trainer - log p_engine`` per token (NaN where not judged)."""
        judged = np.array([v not in NOT_JUDGED for v in self.verdict], dtype=np.bool_)
        with np.errstate(invalid="ignore"):
            return np.asarray(
                np.where(judged, self.trainer - self.engine_logprob, math.nan), dtype=np.float64
            )

    def noise_log_ratio(self) -> Floats:
        """The log-ratio the noise alone would give: each engine logprob moved to the nearest
        value the noise and the op's bound allow."""
        low, high = self.noise_low - self.bound, self.noise_high + self.bound
        with np.errstate(invalid="ignore"):
            nearest = np.clip(self.engine_logprob, low, high)
            judged = np.isfinite(self.log_ratio())
            return np.asarray(np.where(judged, self.trainer - nearest, math.nan), dtype=np.float64)

    def units(self, begin: int = 0, end: int | None = None) -> tuple[RLUnits, RLUnits]:
        """The RL units of tokens ``begin:end``: the engine's, and the noise alone's."""
        clip = float(self.settings["clip"])
        part = slice(begin, end)
        owner = self.response[part]
        return (
            rl_units(self.log_ratio()[part], owner, clip),
            rl_units(self.noise_log_ratio()[part], owner, clip),
        )

    def decomposition(self) -> dict[str, dict[str, float]]:
        return decompose(self.log_ratio(), self.verdict)

    def worst(self, count: int = 10) -> list[dict[str, Any]]:
        """Faults first, then the tokens nearest the edge of the noise."""
        with np.errstate(invalid="ignore", divide="ignore"):
            width = np.fmax(self.noise_high - self.noise_low, 0.0) + self.bound
            used = np.abs(self.engine_logprob - self.oracle) / width
        used = np.where(np.isnan(used), -1.0, used)
        fault = np.array([v not in CLEAN and v not in NOT_JUDGED for v in self.verdict])
        order = np.lexsort((-used, ~fault))[:count]
        return [self.row(int(t)) for t in order if fault[t] or used[t] >= 0]

    def row(self, t: int) -> dict[str, Any]:
        scale = np.fmax(np.abs(self.oracle[t : t + 1]), 1e-30)
        return {
            "token": t,
            "response": int(self.response[t]),
            "token_id": int(self.token_ids[t]),
            "oracle": float(self.oracle[t]),
            "trainer": float(self.trainer[t]),
            "engine": float(self.engine_logprob[t]),
            "engine_ulp": float(abs(self.engine_logprob[t] - self.oracle[t]) / fp32_ulp(scale)[0]),
            "bound": float(self.bound[t]),
            "noise_low": float(self.noise_low[t]),
            "noise_high": float(self.noise_high[t]),
            "eps": float(self.noise.per_token[t]),
            "verdict": self.verdict[t],
            "detail": self.details[t],
        }

    def to_json(self) -> dict[str, Any]:
        engine, noise_only = self.units()
        document: dict[str, Any] = _strict(
            {
                "engine": self.engine,
                "tokens": int(self.token_ids.size),
                "settings": self.settings,
                "noise": {
                    "model": "eps_t = a + b m_t, m_t the largest |logit| over the token's mask",
                    "a": self.noise.a,
                    "b": self.noise.b,
                    "eps": self.noise.eps,
                    "eps_min": float(self.noise.per_token.min(initial=self.noise.eps)),
                    "eps_max": float(self.noise.per_token.max(initial=self.noise.eps)),
                    "source": self.noise.source,
                    "tokens": self.noise.tokens,
                    "scale": self.noise.scale,
                    "ceiling": self.noise.ceiling,
                    "log_odds_bound": 2.0 * self.noise.eps / self.settings["engine_temperature"],
                },
                "verdicts": self.counts(),
                "engine_at_fault": len(self.engine_at_fault()),
                "nonfinite": [self.row(t) for t in self.nonfinite()],
                "units": {"engine": engine.to_json(), "noise_alone": noise_only.to_json()},
                "decomposition": self.decomposition(),
                "responses": [self._response_json(f) for f in self.responses],
                "worst": self.worst(),
                "per_token": [self.row(t) for t in range(self.token_ids.size)],
            }
        )
        return document

    def _response_json(self, finding: ResponseFinding) -> dict[str, Any]:
        engine, noise_only = self.units(finding.begin, finding.end)
        return {
            "index": finding.index,
            "tokens": finding.end - finding.begin,
            "verdicts": self.counts(finding.begin, finding.end),
            "solved_temperature": finding.solved_temperature,
            "stale_policy": finding.stale,
            "cause": finding.cause,
            "evidence": [found.to_json() for found in finding.evidence],
            "units": {"engine": engine.to_json(), "noise_alone": noise_only.to_json()},
        }

    def markdown(self, shown: int = 10) -> str:
        t = self.settings["engine_temperature"]
        faults = self.engine_at_fault()
        settings = ", ".join(f"{k}={v!r}" for k, v in self.settings.items())
        lines = [
            f"Rollout check: {self.engine}, {len(self.responses)} response(s), "
            f"{self.token_ids.size} tokens ({settings})",
            "",
            self.noise.describe(t) + ".",
            "",
            f"Engine at fault on {len(faults)} token(s)"
            + (" (clean: every difference is within the noise)." if not faults else "."),
            "",
            "| verdict | tokens |",
            "|---|---|",
            *(f"| {verdict} | {count} |" for verdict, count in self.counts().items()),
        ]
        nonfinite = self.nonfinite()
        if nonfinite:
            named = ", ".join(f"{t_} ({self.details[t_]})" for t_ in nonfinite[:6])
            lines += ["", f"{len(nonfinite)} non-finite token(s), left out of the units: {named}"]
        lines += ["", *self._units_table(), "", *self._decomposition_lines()]
        lines += ["", "Per response:", ""]
        for finding in self.responses:
            lines.append(self._response_line(finding))
        lines += [
            "",
            f"Worst {shown} tokens (faults first, then nearest the edge of the noise):",
            "",
            "| token | resp | id | oracle | trainer | engine | noise allows | verdict | why |",
            "|" + "---|" * 9,
        ]
        for row in self.worst(shown):
            lines.append(
                f"| {row['token']} | {row['response']} | {row['token_id']} | {row['oracle']:.6g} "
                f"| {row['trainer']:.6g} | {row['engine']:.6g} | [{row['noise_low']:.6g}, "
                f"{row['noise_high']:.6g}] | {row['verdict']} | {row['detail']} |"
            )
        return "\n".join(lines)

    def _units_table(self) -> list[str]:
        engine, noise_only = self.units()
        clip = self.settings["clip"]
        rows = [
            ("tokens", "{:d}", "tokens"),
            ("mean abs log-ratio", "{:.3g}", "mean_abs"),
            ("max abs log-ratio", "{:.3g}", "max_abs"),
            ("KL (k3, engine to trainer)", "{:.3g}", "k3"),
            ("ratio outside [0.9, 1.1]", "{:.2%}", "outside_band"),
            (f"ratio outside the clip [{1 - clip:g}, {1 + clip:g}]", "{:.2%}", "outside_clip"),
            ("sequence log-ratio, mean", "{:.3g}", "sequence_mean"),
            ("sequence log-ratio, farthest from 0", "{:.3g}", "sequence_worst"),
        ]
        lines = [
            "RL units (log-ratio = log p_trainer - log p_engine, the engine sampled):",
            "",
            "| | engine | noise alone |",
            "|---|---|---|",
        ]
        for label, form, name in rows:
            lines.append(
                f"| {label} | {_form(form, getattr(engine, name))} "
                f"| {_form(form, getattr(noise_only, name))} |"
            )
        return lines

    def _decomposition_lines(self) -> list[str]:
        parts = self.decomposition()
        if not parts:
            return ["The mismatch is zero."]
        cells = ", ".join(
            f"{verdict} {share['kl']:.0%} of KL / {share['abs_logp']:.0%} of sum |log-ratio|"
            for verdict, share in sorted(parts.items(), key=lambda item: -item[1]["abs_logp"])
        )
        return [f"The mismatch by verdict: {cells}."]

    def _response_line(self, finding: ResponseFinding) -> str:
        engine, _ = self.units(finding.begin, finding.end)
        counts = ", ".join(f"{k} {v}" for k, v in self.counts(finding.begin, finding.end).items())
        said = []
        if finding.cause is not None:
            said.append(f"the whole response fits {finding.cause}")
        if finding.stale:
            said.append("a stale policy: most tokens far beyond the noise, no cause fits")
        if finding.solved_temperature is not None:
            said.append(f"its logprobs fit T={finding.solved_temperature:.4g}")
        extra = f"; {'; '.join(said)}" if said else ""
        return (
            f"- response {finding.index} ({finding.end - finding.begin} tokens): {counts}; "
            f"KL {engine.k3:.3g}, outside the clip {engine.outside_clip:.1%}, sequence "
            f"log-ratio {engine.sequence_mean:.3g}{extra}"
        )


def _form(form: str, value: Any) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "-"
    return form.format(value)


def _strict(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {key: _strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(item) for item in value]
    return value
