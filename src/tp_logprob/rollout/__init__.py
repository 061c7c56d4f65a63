"""The rollout check: a trainer's logits against an engine's responses, token by token.

``python -m tp_logprob rollout-check RESPONSE --logits TRAINER.pt`` reads a saved
SGLang, vLLM or prime-rl response and the trainer's logits, models the engine's
logits as the trainer's plus a perturbation it cannot see (the logit noise,
estimated or given), and gives each token a verdict: clean, or the cause of the
mismatch, in RL units beside the op's own bound. It is not a replay of
artifacts, and it needs neither pytest nor the suite: numpy, torch and the oracle.

>>> from tp_logprob.rollout import check_rollout
>>> check = check_rollout(logits, rollout, engine_temperature=0.7)  # doctest: +SKIP
"""

from __future__ import annotations

from tp_logprob.rollout.check import check_rollout
from tp_logprob.rollout.inputs import RolloutInputError
from tp_logprob.rollout.plot import plot_rollout
from tp_logprob.rollout.report import VERDICTS, ResponseFinding, RolloutCheck

__all__ = [
    "VERDICTS",
    "ResponseFinding",
    "RolloutCheck",
    "RolloutInputError",
    "check_rollout",
    "plot_rollout",
]
