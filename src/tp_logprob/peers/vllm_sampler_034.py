"""vLLM 0.34's CPU model runner sampler as a processed-logprob backend (TP=1).

0.34 removed ``vllm.v1.sample.sampler`` and ``SamplingMetadata``: the model runner
samples with its own ``CPUSampler`` (``vllm.v1.worker.cpu.sampler``), which keeps
each request's sampling parameters in per-slot state tensors filled by
``CPUSampler.add_request(req_idx, sampling_params)`` and reads a step's rows
through the runner's ``InputBatch`` (``idx_mapping``: batch row to request slot).
The adapter builds that state as the runner does for one decode step: a
``CPURequestState`` with one request per row (``CPURequestState.add_request``
hands out slots from the top, so row 0 is the last slot), the request's
``SamplingParams`` added to the sampler, and the step's ``InputBatch`` (one
logit per request, ``InputBatch.make_dummy``) mapped onto those slots.

The sampler then runs vLLM's own order (``CPUSampler.apply_sampling_params``): when
some request needs processing (``CPUSamplingStates.add_request``: a sampled request
whose temperature is not 1 or that names a rule), the logits are copied to fp32,
divided by each row's temperature (a greedy row, temperature 0, by 1; no division
when every row's temperature is 0 or 1), min-p drops ``z < max z + log(min_p)``
(in logit space, fp32; before 0.34 it compared softmax probabilities), and
``apply_top_k_top_p`` with the batch's top-k and top-p tensors (only when some
row turns the rule on; its PyTorch path, since there is no Triton here: top-k
keeps values ``>=`` the k-th largest, top-p sorts ascending and drops the
positions whose fp32 ``cumsum`` of the renormalised ``softmax`` is
``<= 1 - top_p``). With no request to process the logits pass through as given.
The processed logprobs are what ``processed_logprobs`` mode returns to a request
that asks for every logprob (``logprobs=-1``, ``compute_topk_scores`` on the
processed logits, gathered back into vocabulary order), and the support is the
sampling mask the sampler returns (``return_sampling_mask``:
``CPUSamplingMaskTensors.from_logits``, the columns whose processed logit is
finite).

The one step of ``CPUSampler.__call__`` not run is the random draw:
``gumbel_sample`` is ``vllm._C``'s ``gumbel_sample_cpu``, compiled only into
vLLM's CPU build, which PyPI does not publish. The draw reads the processed logits
and writes neither them nor the mask; the sampled token it would give is only the
first column of the returned logprobs, which the adapter does not read, so the
processed logits' argmax stands in for it. This is the standalone CPU runner's
sampler (``StandaloneCPUModelRunner``, CPUs without Triton); the Triton runner's
(``vllm.v1.worker.gpu.sample.sampler``) runs the same steps as Triton kernels.

Served from 0.34.0, the first release with these samplers and without
``vllm.v1.sample.sampler`` (:mod:`tp_logprob.peers.vllm_sampler` serves 0.11 to
0.33), to 0.34, the newest read. ``SamplingParams`` raises a temperature below
``0.01`` to ``0.01`` and refuses one above 2 (``VLLMValidationError``); the adapter
passes the refusal on. ``CPUSamplingStates.add_request`` draws a seed for an
unseeded request from numpy's global generator: the adapter restores that
generator's state, so the caller's stream is untouched.

Capability, from vLLM's source: TP=1 (the sampler sees a whole row), no
vocabulary padding; fp32, bf16 and fp16; infer only; every token active;
temperature (the floor of ``0.01``, the ceiling of 2); heterogeneous batches, greedy
requests beside sampled ones (``SamplingParams`` turns a greedy request's rules off);
support mode ``sampling_params`` only; ``run_to_run``.

Glue: ``lse`` is that of ``z = x / T`` (the contract's divisors, vLLM's tensor
division), ``support_lse`` the normaliser of the processed logprobs,
``support_threshold`` the smallest tempered logit in vLLM's sampling mask and
``support_size`` the mask's count. A row whose support is undefined (an empty mask, or a
NaN or ``+inf`` in ``z``; docs/semantics.md) gets NaN, ``0`` and NaN there: vLLM's
``support_lse`` of a row of ``-inf`` logits would read ``-inf``.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import numpy as np
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

__all__ = [
    "CAPABILITY",
    "SERVED",
    "VERIFIED_VERSIONS",
    "Step",
    "honest",
    "processed_step",
    "sampling_params",
    "vllm_processed_logprob",
]

SERVED = ServedReleases(
    "vllm",
    (((0, 34), (0, 35)),),
    "before 0.34 vLLM samples with vllm.v1.sample.sampler and SamplingMetadata, which "
    "tp_logprob.peers.vllm_sampler (0.11 to 0.33) and tp_logprob.peers.vllm_sampler_010 "
    "(0.10) drive",
)
"""The releases of vllm the adapter serves; it refuses the others before any work."""

VERIFIED_VERSIONS = str(SERVED)

CAPABILITY = LogprobBackendCapability(
    backend_id="vllm_sampler_034",
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
    SERVED.installed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # import-time notices of vLLM's dependencies
        from vllm import SamplingParams
        from vllm.v1.worker.cpu.input_batch import (
            InputBatch,
            InputBuffers,
            get_num_sampled_and_rejected,
        )
        from vllm.v1.worker.cpu.logprob import compute_topk_scores
        from vllm.v1.worker.cpu.sampler import CPUSampler, CPUSamplingMaskTensors
        from vllm.v1.worker.cpu.states import CPURequestState
    return {
        "SamplingParams": SamplingParams,
        "InputBatch": InputBatch,
        "InputBuffers": InputBuffers,
        "get_num_sampled_and_rejected": get_num_sampled_and_rejected,
        "compute_topk_scores": compute_topk_scores,
        "CPUSampler": CPUSampler,
        "CPUSamplingMaskTensors": CPUSamplingMaskTensors,
        "CPURequestState": CPURequestState,
    }


def sampling_params(contract: LogprobContract) -> list[Any]:
    """The vLLM ``SamplingParams`` of each row: its temperature (0 for a greedy request) and
    rules, asking for every logprob (``logprobs=-1``), one request per row."""
    support = contract.support
    if support is None or support.mode is not SupportMode.SAMPLING_PARAMS:
        raise ValueError(f"support={support!r}: the vLLM sampler needs sampling parameters")
    return row_requests(contract, _vllm()["SamplingParams"], logprobs=-1)


@dataclasses.dataclass(frozen=True)
class Step:
    """What one decode step of the sampler gives: the processed logits (-inf outside the
    support), the processed logprobs in vocabulary order, and each row's sampling mask
    (the kept token ids)."""

    logits: torch.Tensor
    logprobs: torch.Tensor
    kept: list[np.ndarray]


@contextmanager
def _numpy_stream_kept() -> Iterator[None]:
    """Restores numpy's global generator, which ``add_request`` draws unseeded seeds from."""
    state = np.random.get_state()
    try:
        yield
    finally:
        np.random.set_state(state)


def _engine(params: list[Any], width: int) -> tuple[Any, Any]:
    """A ``CPUSampler`` holding one request per row and the decode step's ``InputBatch``
    mapping each row onto its request's slot, as the CPU model runner builds them."""
    vllm = _vllm()
    rows, cpu = len(params), torch.device("cpu")
    states = vllm["CPURequestState"](
        max_num_reqs=rows,
        max_model_len=2,
        max_num_batched_tokens=rows,
        vocab_size=width,
        device=cpu,
    )
    sampler = vllm["CPUSampler"](
        vllm_config=SimpleNamespace(reasoning_config=None),  # the one field it reads
        max_num_reqs=rows,
        vocab_size=width,
        device=cpu,
        req_states=states,
        logprobs_mode="processed_logprobs",
        return_sampling_mask=True,
    )
    slots = []
    with _numpy_stream_kept():
        for row, request in enumerate(params):
            # A decode step: a one-token prompt already computed, one token to sample.
            states.add_request(
                f"row-{row}", prompt_len=1, all_token_ids=[0], num_computed_tokens=1, max_tokens=1
            )
            slots.append(states.req_id_to_index[f"row-{row}"])
            sampler.add_request(slots[-1], request)
    batch = vllm["InputBatch"].make_dummy(rows, rows, vllm["InputBuffers"](rows, rows, cpu))
    mapping = torch.tensor(slots, dtype=torch.int64)
    batch = dataclasses.replace(
        batch,
        idx_mapping=mapping,
        idx_mapping_np=mapping.numpy().astype(np.intp),
        expanded_idx_mapping=mapping,
    )
    return sampler, batch


def processed_step(logits: torch.Tensor, contract: LogprobContract) -> Step:
    """vLLM's processed logits, processed logprobs and sampling mask of ``logits`` (a private
    copy), by the steps of ``CPUSampler.__call__`` but its random draw."""
    vllm = _vllm()
    width = logits.shape[1]
    sampler, batch = _engine(sampling_params(contract), width)
    processed = sampler.apply_sampling_params(
        private_copy(logits),
        batch.expanded_idx_mapping,
        batch.idx_mapping,
        batch.idx_mapping_np,
        batch.positions[batch.logits_indices],
        batch.input_ids[batch.logits_indices],
        batch.expanded_local_pos,
        batch.seq_lens_cpu_upper_bound.numpy(),
    )
    sampled = processed.argmax(dim=1)  # stands in for the draw (module docstring)
    num_logprobs, _ = sampler.get_logprobs_dims(batch.idx_mapping_np)
    returned = vllm["compute_topk_scores"](processed, num_logprobs, sampled)
    columns = returned.logprob_token_ids[:, 1:].long()
    logprobs = torch.empty((len(columns), width)).scatter_(1, columns, returned.logprobs[:, 1:])
    num_sampled, _ = vllm["get_num_sampled_and_rejected"](
        batch.seq_lens.new_ones(batch.num_reqs),
        batch.seq_lens,
        batch.cu_num_logits,
        batch.idx_mapping,
        sampler.req_states.prefill_len,
    )
    mask = (
        vllm["CPUSamplingMaskTensors"]
        .from_logits(
            processed,
            batch.cu_num_logits,
            num_sampled,
            int(np.max(sampler.sampling_states.top_k_np[batch.idx_mapping_np])),
        )
        .tolists()
    )
    kept = [mask.token_ids[a:b] for a, b in zip(mask.offsets[:-1], mask.offsets[1:], strict=True)]
    return Step(processed, logprobs, kept)


def vllm_processed_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
) -> LogprobResult:
    """``(selected_logp, lse)`` and the support outputs from vLLM 0.34's CPU sampler."""
    check_op_inputs(local_logits, targets, contract, group)
    with torch.no_grad():
        step = processed_step(local_logits.detach(), contract)
        selected = step.logprobs.gather(1, targets.long()[:, None])[:, 0]
        z = local_logits.detach().float() / torch.from_numpy(contract.row_divisors())[:, None]
        lse = lse_behind(z, torch.log_softmax(z, dim=1)) if contract.export_lse else None
        kept = torch.zeros_like(z, dtype=torch.bool)
        for row, ids in enumerate(step.kept):
            kept[row, torch.from_numpy(np.asarray(ids, dtype=np.int64))] = True
        return support_result(
            selected, lse, z, kept, lse_behind(step.logits.float(), step.logprobs)
        )


honest = (vllm_processed_logprob, CAPABILITY)
"""The honest backend: ``--tp-logprob-backend=tp_logprob.peers.vllm_sampler_034:honest``."""
