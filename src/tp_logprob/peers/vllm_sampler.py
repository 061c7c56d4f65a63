"""vLLM's v1 sampler in ``processed_logits`` mode as a processed-logprob backend (TP=1).

Runs ``vllm.v1.sample.sampler.Sampler`` (``logprobs_mode="processed_logits"``) on
one request per row, with the request's ``SamplingParams`` built from the
contract's temperature and support (the row's own in a heterogeneous batch, a
greedy request at temperature 0), as vLLM's input batch builds its
``SamplingMetadata`` (``InputBatch.add_request``, ``_make_sampling_metadata``: a
greedy request's temperature 0, ``all_greedy`` / ``all_random``, top-k and top-p
tensors only when some request turns the rule on): the temperature
``SamplingParams`` keeps (it raises one below ``0.01`` to ``0.01``), top-k off
unless ``0 < top_k < V``, top-p off at ``1.0``, min-p through vLLM's
``MinPLogitsProcessor``. The sampler then runs vLLM's own order: logits to
fp32, ``logits / temperature`` (a tensor division), min-p on ``softmax`` (drop
``p < min_p * max p``), then ``apply_top_k_top_p``, whose PyTorch path sorts the
row ascending, keeps values ``>=`` the k-th largest, and drops the positions whose
ascending fp32 ``cumsum`` of the renormalised ``softmax`` is ``<= 1 - top_p``
(``apply_top_k_top_p_pytorch``; no Triton driver on CPU, so never the Triton
kernel). The processed logprobs are ``log_softmax`` of the returned logits, which
is what ``processed_logprobs`` mode returns (both modes take the same tensor;
``TopKTopPSampler.forward_native`` and ``Sampler.compute_logprobs``). The support
is vLLM's own: the columns whose processed logit is finite, the rule of the
sampling mask it returns (``_compact_sampling_mask_kernel``).

Served from 0.11.0, the first release whose input batch holds a greedy request's
temperature as 0 and whose sampler divides that row by 1 (``apply_temperature(...,
all_random)``; 0.10's holds -1 and divides by it, negating the row's processed logits, and
``tp_logprob.peers.vllm_sampler_010`` serves 0.10 with one request per batch), to 0.33,
the last with ``vllm.v1.sample.sampler`` (0.34 removed it, with ``SamplingMetadata``, for
the model runner's own samplers, ``vllm.v1.worker.cpu.sampler`` and
``vllm.v1.worker.gpu.sample.sampler``, which take its input batch and request states;
``tp_logprob.peers.vllm_sampler_034`` drives the first).
Between them the sampler, ``SamplingMetadata``, ``SamplingParams`` and the logits
processors keep the calls made here, read from each release's sources, with one difference
(:data:`_FULL_LOGPROBS`): 0.11.0 has no ``max_num_logprobs=-1`` (the whole unsorted
tensor), so there the sampler is asked for the top ``V`` of every row and they are
scattered back into vocabulary order, the same values. 0.11.0's ``apply_temperature`` and
``compute_logprobs`` are methods, static from 0.11.1: they are called on an instance.
``SamplingParams`` refuses a temperature above 2 (``VLLMValidationError``) from 0.24.0
only; before, any ``T >= 0`` runs. The adapter passes the refusal on.

vLLM's wheel pins a CUDA build of torch, so it is installed ``--no-deps`` with only
the packages its sampler modules import (see ``noxfile.py``, ``conformance``); it
then runs on the CPU build of torch on an "unspecified" platform.

Capability, from vLLM's source:

- TP=1 (the sampler sees a whole row); no vocabulary padding;
- fp32, bf16 and fp16: the sampler converts the logits to fp32 before anything;
- infer only (the sampler runs in place, under no gradient);
- every token is read as a sampled token (mask mode ``all_active``);
- temperature: vLLM's division by ``fp32(T)``, except that ``SamplingParams``
  raises a temperature below ``0.01`` to ``0.01``; no entropy;
- heterogeneous batches: one request per row with its own temperature and rules,
  greedy requests beside sampled ones (vLLM divides a greedy row by 1 and turns its
  rules off, ``SamplingParams`` and ``Sampler.apply_temperature``);
- support mode ``sampling_params`` only: vLLM produces sampling masks, it does not
  consume one; ``run_to_run``.

Glue: the sampler writes into its input (``.to(float32)`` of fp32 logits is the same
tensor), so it gets a private copy, and its random draw runs under a forked RNG so
the caller's stream is untouched. ``lse`` is ``z_max - log_softmax(z)[argmax]`` with
vLLM's ``compute_logprobs`` on vLLM's tempered logits; ``support_lse`` the same from
the processed logits (the normaliser of the distribution vLLM returns),
``support_threshold`` the smallest kept tempered logit, ``support_size`` the count
of kept columns. A row whose support is undefined (no finite processed logit, or a NaN or
``+inf`` in ``z``; docs/semantics.md) gets NaN, ``0`` and NaN there.
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
from tp_logprob.peers._glue import imported_once, lse_from_max, private_copy
from tp_logprob.peers._releases import ServedReleases
from tp_logprob.result import LogprobResult
from tp_logprob.support import SupportMode

__all__ = [
    "CAPABILITY",
    "SERVED",
    "VERIFIED_VERSIONS",
    "honest",
    "lse_behind",
    "row_requests",
    "support_result",
    "vllm_processed_logprob",
]

SERVED = ServedReleases(
    "vllm",
    (((0, 11), (0, 34)),),
    "0.10's sampler, which divides a greedy request's row by the -1 its input batch holds, "
    "is tp_logprob.peers.vllm_sampler_010's (one request per batch); 0.34 removed "
    "vllm.v1.sample.sampler and SamplingMetadata (the model runner's samplers take its input "
    "batch instead): from 0.34 use tp_logprob.peers.vllm_sampler_034; before 0.10 the v1 "
    "sampler had no logprobs_mode",
)
"""The releases of vllm the adapter serves; it refuses the others before any work."""

VERIFIED_VERSIONS = str(SERVED)

_FULL_LOGPROBS = (0, 11, 1)
"""From here ``max_num_logprobs=-1`` returns every row whole, in vocabulary order."""

CAPABILITY = LogprobBackendCapability(
    backend_id="vllm_sampler",
    roles=frozenset({LogprobRole.INFER}),
    dtypes=frozenset(LogprobDType),
    tp_world_sizes=frozenset({1}),
    cp_world_sizes=frozenset({1}),
    supports_vocab_padding=False,
    mask_modes=frozenset({MaskMode.ALL_ACTIVE}),
    exports_vocab_lse=True,
    determinism_scopes=frozenset({DeterminismScope.RUN_TO_RUN}),
    supports_temperature=True,
    support_modes=frozenset({SupportMode.SAMPLING_PARAMS}),
    supports_row_parameters=True,
)


@imported_once
def _vllm() -> dict[str, Any]:
    release = SERVED.installed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # import-time notices of vLLM's dependencies
        from vllm import SamplingParams
        from vllm.sampling_params import SamplingType
        from vllm.v1.sample.logits_processor import LogitsProcessors
        from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor
        from vllm.v1.sample.logits_processor.interface import BatchUpdate
        from vllm.v1.sample.metadata import SamplingMetadata
        from vllm.v1.sample.sampler import Sampler
    return {
        "release": release,
        "SamplingParams": SamplingParams,
        "SamplingType": SamplingType,
        "LogitsProcessors": LogitsProcessors,
        "MinPLogitsProcessor": MinPLogitsProcessor,
        "BatchUpdate": BatchUpdate,
        "SamplingMetadata": SamplingMetadata,
        "Sampler": Sampler,
    }


def sampling_params(contract: LogprobContract) -> list[Any]:
    """The vLLM ``SamplingParams`` of each row: its temperature (0 for a greedy request) and
    rules, one request per row as a heterogeneous engine batch brings them."""
    support = contract.support
    if support is None or support.mode is not SupportMode.SAMPLING_PARAMS:
        raise ValueError(f"support={support!r}: the vLLM sampler needs sampling parameters")
    return row_requests(contract, _vllm()["SamplingParams"])


def row_requests(contract: LogprobContract, make: Any, **extra: Any) -> list[Any]:
    """One request per row, ``make(temperature=..., top_k=..., top_p=..., min_p=...,
    **extra)`` (the installed release's ``SamplingParams``): the row's temperature (0 for a
    greedy row) and rules, a rule off as vLLM spells it (``top_k=0``, ``top_p=1``,
    ``min_p=0``), every rule off without a support."""
    support, temperature = contract.support, contract.temperature
    params = []
    for row in range(contract.num_tokens):
        top_k, top_p, min_p = (None, None, None) if support is None else support.row_rules(row)
        params.append(
            make(
                temperature=temperature[row] if isinstance(temperature, tuple) else temperature,
                top_k=0 if top_k is None else top_k,
                top_p=1.0 if top_p is None else top_p,
                min_p=0.0 if min_p is None else min_p,
                **extra,
            )
        )
    return params


def _metadata(params: list[Any], width: int) -> Any:
    """``SamplingMetadata`` of one request per row, as vLLM's input batch builds it
    (``InputBatch.add_request`` and ``_make_sampling_metadata``): a greedy request's
    temperature 0, no temperature tensor when every request is greedy, top-k and top-p
    tensors only when some request turns the rule on."""
    vllm = _vllm()
    rows = len(params)
    min_p = vllm["MinPLogitsProcessor"](
        SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=rows)),
        torch.device("cpu"),
        False,
    )
    added: list[tuple[int, Any, None, list[int]]] = [
        (row, request, None, []) for row, request in enumerate(params)
    ]
    min_p.update_state(vllm["BatchUpdate"](batch_size=rows, removed=[], added=added, moved=[]))
    temperature, all_random = _temperatures(params)
    all_greedy = not bool((temperature > 0).any())
    top_k = torch.tensor(
        [request.top_k if 0 < request.top_k < width else width for request in params],
        dtype=torch.int32,
    )
    top_p = torch.tensor([request.top_p for request in params])
    return vllm["SamplingMetadata"](
        temperature=None if all_greedy else temperature,
        all_greedy=all_greedy,
        all_random=all_random,
        top_p=top_p if bool((top_p < 1).any()) else None,
        top_k=top_k if bool((top_k < width).any()) else None,
        generators={},
        max_num_logprobs=-1 if vllm["release"] >= _FULL_LOGPROBS else width,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(rows),
        presence_penalties=torch.zeros(rows),
        repetition_penalties=torch.ones(rows),
        output_token_ids=[],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=vllm["LogitsProcessors"]([min_p]),
    )


def _temperatures(params: list[Any]) -> tuple[torch.Tensor, bool]:
    """Each request's temperature as the input batch holds it (0 for a greedy request), and
    whether no request is greedy (``all_random``)."""
    greedy = [request.sampling_type == _vllm()["SamplingType"].GREEDY for request in params]
    values = [
        0.0 if is_greedy else request.temperature
        for is_greedy, request in zip(greedy, params, strict=True)
    ]
    return torch.tensor(values), not any(greedy)


def processed_logits(logits: torch.Tensor, contract: LogprobContract) -> torch.Tensor:
    """vLLM's processed logits of ``logits`` (a private copy): -inf outside its support."""
    vllm = _vllm()
    metadata = _metadata(sampling_params(contract), logits.shape[1])
    sampler = vllm["Sampler"](logprobs_mode="processed_logits")
    with torch.random.fork_rng(devices=[]):
        output = sampler(private_copy(logits), metadata)
    return in_vocabulary_order(output.logprobs_tensors, logits.shape[1])


def in_vocabulary_order(returned: Any, width: int) -> torch.Tensor:
    """The rows of ``returned`` (the sampler's ``LogprobsTensors``) whole, in vocabulary order:
    as returned from 0.11.1; before, column 0 is the sampled token and the others the top
    ``width``, scattered back."""
    if _vllm()["release"] >= _FULL_LOGPROBS:
        return returned.logprobs  # type: ignore[no-any-return]
    columns = returned.logprob_token_ids[:, 1:].long()
    return torch.empty((len(columns), width)).scatter_(1, columns, returned.logprobs[:, 1:])


def vllm_processed_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
) -> LogprobResult:
    """``(selected_logp, lse)`` and the support outputs from vLLM's v1 sampler."""
    check_op_inputs(local_logits, targets, contract, group)
    vllm = _vllm()
    sampler = vllm["Sampler"](logprobs_mode="processed_logits")  # 0.11.0: not static methods
    with torch.no_grad():
        processed = processed_logits(local_logits.detach(), contract)
        logprobs = sampler.compute_logprobs(processed)
        selected = logprobs.gather(1, targets.long()[:, None])[:, 0]
        kept = torch.isfinite(processed)
        z = sampler.apply_temperature(
            local_logits.detach().float().clone(), torch.from_numpy(contract.row_divisors()), True
        )
        lse = None
        if contract.export_lse:
            lse = lse_behind(z, sampler.compute_logprobs(z))
        return support_result(selected, lse, z, kept, lse_behind(processed, logprobs))


def support_result(
    selected: torch.Tensor,
    lse: torch.Tensor | None,
    z: torch.Tensor,
    kept: torch.Tensor,
    support_lse: torch.Tensor,
) -> LogprobResult:
    """The result with the support outputs of the mask ``kept`` over the tempered logits
    ``z``; NaN, size 0 and NaN where the support is undefined (nothing kept, or a NaN or
    +inf ``z``), as docs/semantics.md says."""
    defined = kept.any(dim=1) & ~(z.isnan() | z.isposinf()).any(dim=1)
    threshold = torch.where(kept, z, torch.full_like(z, float("inf"))).amin(dim=1)
    nan = float("nan")
    return LogprobResult(
        selected,
        lse,
        support_lse=torch.where(defined, support_lse, nan),
        support_size=torch.where(defined, kept.sum(dim=1, dtype=torch.int64), 0),
        support_threshold=torch.where(defined, threshold, nan),
    )


def lse_behind(values: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    """``max - logprob[argmax]`` per row: the log normaliser behind ``logprobs``."""
    top = values.argmax(dim=1, keepdim=True)
    return lse_from_max(values.gather(1, top)[:, 0], -logprobs.gather(1, top)[:, 0])


honest = (vllm_processed_logprob, CAPABILITY)
"""The honest backend: ``--tp-logprob-backend=tp_logprob.peers.vllm_sampler:honest``."""
