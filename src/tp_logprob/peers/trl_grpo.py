"""TRL's GRPO trainer's own per-token logprob method as a backend (TP=1).

``GRPOTrainer._get_per_token_logps(self, model, input_ids, attention_mask,
logits_to_keep)`` runs the policy, drops the last position's logits, keeps the
last ``logits_to_keep`` positions, (from 0.16.0) divides them by
``self.temperature``, and returns ``selective_log_softmax(logits, input_ids)``;
from 0.20.0 ``_get_per_token_logps_and_entropies``, with the same four first
arguments, does the same and returns the logprobs first in a tuple.
The adapter calls that method, the trainer's code, on a harness: a model whose
forward returns the given logits (one sequence of ``N + 1`` positions, the last a
dummy the method drops), the targets as the last ``N`` input ids, and a trainer
stand-in that holds only what the method reads: ``temperature``,
``model_kwarg_keys`` (empty: the harness takes no ``logits_to_keep``), and for the
profiling decorator 0.16.0 wraps it in ``args.report_to = []`` (and, in later releases,
``state.global_step`` and ``accelerator.is_main_process``). No weights are loaded.

Releases (:data:`SERVED`, read from each release's ``grpo_trainer.py``): the
method has these four arguments from trl 0.15.0; 0.17.0 added ``batch_size=None``
(the rows per forward pass; all rows when left out), which the adapter leaves out;
0.20.0 renamed it ``_get_per_token_logps_and_entropies`` (``(logps, entropies)``;
from 1.8 a third item, the MoE aux loss); 1.14.0 made it dispatch on
``use_liger_kernel`` to ``_full_logits_logps`` (the same steps, the temperature and a
row mask passed to ``selective_log_softmax``) or ``_chunked_logps`` (the LM head fused
in, hidden states in): the stand-in says ``use_liger_kernel = False`` and holds the
trainer's own ``_full_logits_logps``. From 1.15.0 the method has the model score the
tokens (``fused_lm_head=True``: TRL's chunked LM head, hidden states in, the adapter
``tp_logprob.peers.trl_chunked``), so those releases are refused by version, not
guessed at. Verified, with this adapter's tests under ``nox -s peer_releases``, on the
releases ``tools/conformance/releases.py`` lists.

Capability: TP=1, fp32, no padding, every token active (the method has no mask),
train and infer, ``fixed_topology``, temperature (what the trainer samples with),
no entropy. Glue: no call for ``N = 0`` (the method's ``input_ids[:, -0:]`` would
keep the whole sequence); the LSE from a second call with each row's argmax as the
target, ``lse = z_max - logprob`` (``lse = z_max`` where ``z_max`` is ``+-inf``).
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Any

import torch

from tp_logprob.capability import LogprobBackendCapability
from tp_logprob.contract import (
    DeterminismScope,
    LogprobContract,
    LogprobDType,
    LogprobRole,
    MaskMode,
)
from tp_logprob.kernels.validation import check_op_inputs
from tp_logprob.peers._glue import imported_once, lse_from_max
from tp_logprob.peers._releases import ServedReleases
from tp_logprob.result import LogprobResult

__all__ = ["CAPABILITY", "SERVED", "honest", "trl_grpo_logprob"]

SERVED = ServedReleases(
    "trl",
    (((0, 15), (1, 15)),),
    "0.14 has no GRPOTrainer._get_per_token_logps, and from 1.15 "
    "_get_per_token_logps_and_entropies has the model score the tokens from its hidden "
    "states (fused_lm_head=True; tp_logprob.peers.trl_chunked calls that path)",
)
"""The trl releases whose per-token logprob method the adapter calls (0.15 to 1.14)."""

_RENAMED = (0, 20, 0)
"""The first release whose method is ``_get_per_token_logps_and_entropies``."""
_DISPATCHED = (1, 14, 0)
"""The first release whose method dispatches to ``_full_logits_logps`` or ``_chunked_logps``."""

CAPABILITY = LogprobBackendCapability(
    backend_id="trl_grpo_per_token_logps",
    roles=frozenset({LogprobRole.TRAIN, LogprobRole.INFER}),
    dtypes=frozenset({LogprobDType.FP32}),
    tp_world_sizes=frozenset({1}),
    cp_world_sizes=frozenset({1}),
    supports_vocab_padding=False,
    mask_modes=frozenset({MaskMode.ALL_ACTIVE}),
    exports_vocab_lse=True,
    determinism_scopes=frozenset({DeterminismScope.FIXED_TOPOLOGY}),
    supports_temperature=True,
)


@imported_once
def _method() -> Any:
    """The installed release's method, as a call that returns the logprobs alone."""
    release = SERVED.installed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' import-time notices
        from trl.trainer.grpo_trainer import GRPOTrainer
    if release < _RENAMED:
        return GRPOTrainer._get_per_token_logps
    method = GRPOTrainer._get_per_token_logps_and_entropies
    if release < _DISPATCHED:
        return lambda *arguments: method(*arguments)[0]
    full = GRPOTrainer._full_logits_logps

    def dispatched(trainer: SimpleNamespace, *arguments: Any) -> Any:
        # The full-logits path: the one the method takes without Liger's kernel.
        trainer.use_liger_kernel = False
        trainer._full_logits_logps = lambda *given, **options: full(trainer, *given, **options)
        return method(trainer, *arguments)[0]

    return dispatched


class _Harness:
    """A policy whose forward returns the given logits for a ``[1, N + 1]`` sequence."""

    def __init__(self, logits: torch.Tensor) -> None:
        dummy = logits.new_zeros((1, logits.shape[1]))  # the last position: dropped
        self.logits = torch.cat([logits, dummy]).unsqueeze(0)

    def __call__(self, **inputs: Any) -> SimpleNamespace:
        return SimpleNamespace(logits=self.logits)


def _logps(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """The trainer's method on one sequence whose completion is ``targets``."""
    ids = torch.cat([targets.new_zeros(1), targets]).unsqueeze(0)
    trainer = SimpleNamespace(
        temperature=temperature,
        model_kwarg_keys=(),
        args=SimpleNamespace(report_to=[]),
        state=SimpleNamespace(global_step=0),
        accelerator=SimpleNamespace(is_main_process=True),
    )
    rows = len(targets)
    logps: torch.Tensor = _method()(trainer, _Harness(logits), ids, torch.ones_like(ids), rows)
    return logps[0]


def trl_grpo_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
) -> LogprobResult:
    """``(selected_logp, lse)`` from ``GRPOTrainer._get_per_token_logps``."""
    check_op_inputs(local_logits, targets, contract, group)
    rows = local_logits.shape[0]
    if rows == 0:
        empty = local_logits.new_empty(0, dtype=torch.float32)
        return LogprobResult(empty, empty.clone() if contract.export_lse else None)
    temperature = contract.batch_temperature
    selected = _logps(local_logits, targets.long(), temperature)
    lse = None
    if contract.export_lse:
        with torch.no_grad():
            logits = local_logits.detach()
            z_max = (logits / temperature if temperature != 1.0 else logits).amax(dim=1)
            top = _logps(logits, logits.argmax(dim=1), temperature)
            lse = lse_from_max(z_max, -top.float())
    return LogprobResult(selected.float(), lse)


honest = (trl_grpo_logprob, CAPABILITY)
"""The honest backend: ``--tp-logprob-backend=tp_logprob.peers.trl_grpo:honest``."""
