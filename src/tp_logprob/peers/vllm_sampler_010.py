"""vLLM 0.10's v1 sampler in ``processed_logprobs`` mode as a logprob backend (TP=1).

Runs the installed ``vllm.v1.sample.sampler.Sampler`` with
``logprobs_mode="processed_logprobs"`` on one request per row, each request's
``SamplingParams`` built from its row's temperature and rules (a heterogeneous batch
brings its own per row), and the ``SamplingMetadata`` as 0.10's input batch builds it
(``InputBatch.add_request`` and ``_make_sampling_metadata``; the rules of
:mod:`tp_logprob.peers.vllm_sampler`: ``SamplingParams`` raises a temperature
below ``0.01`` to ``0.01``; top-k off unless ``0 < top_k < V``; top-p off at
``1.0``; min-p through vLLM's ``MinPLogitsProcessor``). The sampler is asked
for ``V`` logprobs per row (``max_num_logprobs=V``), so the top-``V`` it gathers
is every column, scattered back into vocabulary order: the processed logprob
of every token, as vLLM returns it to a request.

vLLM documents processed logprobs as those "after applying all processors,
including temperature and top_k/top_p". Where the sampler computes them differs
by release, read from each wheel's ``vllm/v1/sample/sampler.py``:

- 0.10.0, 0.10.1 and 0.10.1.1: ``Sampler.forward`` computes
  ``compute_logprobs(logits)`` after the penalties and before ``self.sample``,
  which divides by the temperature and applies min-p, top-k and top-p: the
  "processed" logprobs are those of the undivided, unmasked logits;
- 0.10.2: ``TopKTopPSampler(logprobs_mode)`` returns ``log_softmax`` of the
  logits after temperature, min-p, top-k and top-p, and ``Sampler.forward``
  returns those.

A greedy request (temperature below ``1e-5``) in a batch beside sampled ones: 0.10's
input batch holds ``-1.0`` as its temperature ("avoid later division by zero"), and
the sampler divides every row by its temperature before top-k and top-p, so on 0.10.2
the processed logprobs of a greedy row are those of ``-x`` (0.11 divides a greedy row
by 1; ``docs/repro_vllm_010_greedy_row_negated.py``); before 0.10.2 they are taken
before the division, the raw logprobs the semantics ask of a greedy row. An all-greedy
batch is never divided.

The APIs the adapter calls differ by release too, and are chosen by the installed
version (:data:`SERVED`), not guessed at: in 0.10.0 the logits processors
live in ``vllm.v1.sample.logits_processor`` (one module: ``MinPLogitsProcessor(
max_num_reqs, pin_memory, device)``, ``LogitsProcessorManager``, three-field added
requests); from 0.10.1 in a package (``MinPLogitsProcessor(vllm_config, device,
is_pin_memory)``, ``LogitsProcessors``, four-field added requests); the logprobs
mode is a string before 0.10.2 and ``vllm.config.LogprobsMode`` from 0.10.2.

Capability, from vLLM's source: TP=1 (the sampler sees a whole row), no
vocabulary padding; fp32, bf16 and fp16 (the sampler converts the logits to fp32
first); infer only; every token active; temperature (vLLM's division by
``fp32(T)``, with the floor of ``0.01``); heterogeneous batches (one request per
row, greedy ones beside sampled ones); support modes ``full`` (no top-k, top-p or
min-p: the logprob over the whole vocabulary) and ``sampling_params``; no entropy;
``run_to_run``.

Glue: the sampler writes into its input, so it gets a private copy, and its
random draw runs under a forked RNG. ``lse`` is ``z_max - log_softmax(z)[argmax]``
with vLLM's ``apply_temperature`` and ``compute_logprobs``; with a support,
vLLM's processed logits are read back as ``z`` where its logprob is not ``-inf``
(``-inf`` where it dropped the column); ``support_size`` counts their finite
values, ``support_threshold`` is the smallest of them, and ``support_lse`` is
``z - logprob`` at their largest (the normaliser of the distribution vLLM
returns, read as one over ``z``). A row whose support is undefined (no finite
processed logit, or a NaN or ``+inf`` in ``z``; docs/semantics.md) gets NaN,
``0`` and NaN there.
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
from tp_logprob.peers._glue import imported_once, private_copy
from tp_logprob.peers._releases import ServedReleases
from tp_logprob.peers.vllm_sampler import lse_behind, row_requests, support_result
from tp_logprob.result import LogprobResult
from tp_logprob.support import SupportMode

__all__ = ["CAPABILITY", "SERVED", "honest", "vllm_processed_logprob"]

SERVED = ServedReleases(
    "vllm",
    (((0, 10), (0, 11)),),
    "the adapter drives 0.10's Sampler (logprobs_mode, SamplingMetadata.logitsprocs); "
    "tp_logprob.peers.vllm_sampler serves 0.11 to 0.33",
)
"""The vllm releases whose sampler the adapter drives (0.10.0 to 0.10.2)."""

_PROCESSORS_PACKAGE = (0, 10, 1)
"""From here ``vllm.v1.sample.logits_processor`` is a package with the newer API."""
_LOGPROBS_MODE_ENUM = (0, 10, 2)
"""From here ``logprobs_mode`` is a ``vllm.config.LogprobsMode``, not a string."""

CAPABILITY = LogprobBackendCapability(
    backend_id="vllm_sampler_010",
    roles=frozenset({LogprobRole.INFER}),
    dtypes=frozenset(LogprobDType),
    tp_world_sizes=frozenset({1}),
    cp_world_sizes=frozenset({1}),
    supports_vocab_padding=False,
    mask_modes=frozenset({MaskMode.ALL_ACTIVE}),
    exports_vocab_lse=True,
    determinism_scopes=frozenset({DeterminismScope.RUN_TO_RUN}),
    supports_temperature=True,
    support_modes=frozenset({SupportMode.FULL, SupportMode.SAMPLING_PARAMS}),
    supports_row_parameters=True,
)


@imported_once
def _vllm() -> dict[str, Any]:
    release = SERVED.installed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # import-time notices of vLLM's dependencies
        from vllm import SamplingParams
        from vllm.sampling_params import SamplingType
        from vllm.v1.sample.metadata import SamplingMetadata
        from vllm.v1.sample.sampler import Sampler

        if release < _PROCESSORS_PACKAGE:
            from vllm.v1.sample.logits_processor import (
                BatchUpdate,
                LogitsProcessorManager,
                MinPLogitsProcessor,
            )

            processors = LogitsProcessorManager
        else:
            from vllm.v1.sample.logits_processor import LogitsProcessors
            from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor
            from vllm.v1.sample.logits_processor.interface import BatchUpdate

            processors = LogitsProcessors
        mode: Any = "processed_logprobs"
        if release >= _LOGPROBS_MODE_ENUM:
            from vllm.config import LogprobsMode

            mode = LogprobsMode.PROCESSED_LOGPROBS
    return {
        "release": release,
        "SamplingParams": SamplingParams,
        "SamplingType": SamplingType,
        "SamplingMetadata": SamplingMetadata,
        "Sampler": Sampler,
        "BatchUpdate": BatchUpdate,
        "MinPLogitsProcessor": MinPLogitsProcessor,
        "processors": processors,
        "mode": mode,
    }


def sampling_params(contract: LogprobContract) -> list[Any]:
    """The vLLM ``SamplingParams`` of each row: its temperature (0 for a greedy request) and
    rules, one request per row as a heterogeneous engine batch brings them."""
    support = contract.support
    if support is not None and support.mode is not SupportMode.SAMPLING_PARAMS:
        raise ValueError(f"support={support!r}: the vLLM sampler takes sampling parameters")
    return row_requests(contract, _vllm()["SamplingParams"])


def _logits_processors(params: list[Any]) -> Any:
    """vLLM's min-p processor holding one request per row, as the release wants."""
    vllm = _vllm()
    cpu = torch.device("cpu")
    rows = len(params)
    added: list[tuple[Any, ...]]
    if vllm["release"] < _PROCESSORS_PACKAGE:
        min_p = vllm["MinPLogitsProcessor"](max_num_reqs=rows, pin_memory=False, device=cpu)
        added = [(row, request, []) for row, request in enumerate(params)]
    else:
        config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=rows))
        min_p = vllm["MinPLogitsProcessor"](config, cpu, False)
        added = [(row, request, [], []) for row, request in enumerate(params)]
    min_p.update_state(vllm["BatchUpdate"](batch_size=rows, removed=[], added=added, moved=[]))
    if vllm["release"] < _PROCESSORS_PACKAGE:
        return vllm["processors"](argmax_invariant=[min_p])
    return vllm["processors"]([min_p])


def _metadata(params: list[Any], width: int) -> Any:
    """``SamplingMetadata`` of one request per row, asking for all ``width`` logprobs, as
    0.10's input batch builds it: a greedy request's temperature ``-1.0``, no temperature
    tensor when every request is greedy, top-k and top-p tensors only when some request
    turns the rule on."""
    vllm = _vllm()
    rows = len(params)
    greedy = [request.sampling_type == vllm["SamplingType"].GREEDY for request in params]
    temperature = torch.tensor(
        [-1.0 if is_greedy else request.temperature for is_greedy, request in zip(
            greedy, params, strict=True)]
    )  # fmt: skip
    all_greedy = bool(greedy) and all(greedy)
    top_k = torch.tensor(
        [request.top_k if 0 < request.top_k < width else width for request in params],
        dtype=torch.int32,
    )
    top_p = torch.tensor([request.top_p for request in params])
    return vllm["SamplingMetadata"](
        temperature=None if all_greedy else temperature,
        all_greedy=all_greedy,
        all_random=not any(greedy),
        top_p=top_p if bool((top_p < 1).any()) else None,
        top_k=top_k if bool((top_k < width).any()) else None,
        generators={},
        max_num_logprobs=width,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(rows),
        presence_penalties=torch.zeros(rows),
        repetition_penalties=torch.ones(rows),
        output_token_ids=[],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=_logits_processors(params),
    )


def processed_logprobs(logits: torch.Tensor, contract: LogprobContract) -> torch.Tensor:
    """The processed logprob of every column of ``logits`` (a private copy), from vLLM."""
    vllm = _vllm()
    rows, width = logits.shape
    sampler = vllm["Sampler"](logprobs_mode=vllm["mode"])
    with torch.random.fork_rng(devices=[]):
        output = sampler(private_copy(logits), _metadata(sampling_params(contract), width))
    gathered = output.logprobs_tensors  # column 0: the sampled token; then the top V
    columns = gathered.logprob_token_ids[:, 1:].long()
    return torch.empty((rows, width)).scatter_(1, columns, gathered.logprobs[:, 1:])


def vllm_processed_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
) -> LogprobResult:
    """``(selected_logp, lse)``, and the support outputs with a support, from vLLM's sampler."""
    check_op_inputs(local_logits, targets, contract, group)
    vllm = _vllm()
    with torch.no_grad():
        logprobs = processed_logprobs(local_logits.detach(), contract)
        selected = logprobs.gather(1, targets.long()[:, None])[:, 0]
        sampler = vllm["Sampler"](logprobs_mode=vllm["mode"])
        # The semantics' tempered logits: a greedy row's divided by 1.
        z = sampler.apply_temperature(
            local_logits.detach().float().clone(), torch.from_numpy(contract.row_divisors())
        )
        lse = None
        if contract.export_lse:
            lse = lse_behind(z, sampler.compute_logprobs(z))
        if contract.support is None:
            return LogprobResult(selected, lse)
        # vLLM's processed logits: z where it kept the column, -inf where it dropped it.
        processed = torch.where(logprobs == -float("inf"), -float("inf"), z)
        kept = torch.isfinite(processed)
        return support_result(selected, lse, z, kept, lse_behind(processed, logprobs))


honest = (vllm_processed_logprob, CAPABILITY)
"""The honest backend: ``--tp-logprob-backend=tp_logprob.peers.vllm_sampler_010:honest``."""
