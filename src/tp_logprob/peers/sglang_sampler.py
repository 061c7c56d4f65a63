"""SGLang's torch-native sampler and sampling mask as a processed-logprob backend (TP=1).

Runs, on one request per row, what SGLang's ``Sampler.forward`` does on its
``pytorch`` sampling backend with a sampling mask requested: the request's
``SamplingParams`` (``sglang.srt.sampling.sampling_params``: a temperature below
``1e-6`` becomes greedy, ``top_k = 1`` at ``T = 1``; ``top_k = -1`` is
``TOP_K_ALL``), ``logits.div_(temperatures)`` with one fp32 temperature per row,
SGLang's sampler softmax (``sglang.kernels.ops.sampling.softmax``: ``torch.softmax``
on CPU; before 0.5.22 the sampler calls ``torch.softmax(logits, dim=-1)`` itself),
and the branch ``Sampler.forward`` takes for such a batch: greedy when
``top_k <= 1`` (``_build_greedy_sampling_mask_output``: the first index of the
maximum), plain sampling when no rule is active (``sampling_from_probs_torch``; the
support is every token of positive probability), else
``top_k_top_p_min_p_sampling_from_probs_torch`` with ``return_filtered_probs=True``;
then ``Sampler._build_sampling_mask_output``, whose ``support_logprobs`` are
``log(w / sum of w > 0)`` over every token id. The rules,
from that function: the fp32 probabilities sorted descending; top-k keeps the first
``top_k`` positions (a tie at the k-th value cut by sort position); top-p drops a
position whose mass before it, in the cumsum of the *full* distribution taken before
the top-k cut, is ``> top_p`` (the joint rule, not renormalised over the top-k
survivors); min-p last, ``p < min_p * (largest p)``. The support is the tokens of
positive weight. Verified with sglang 0.5.23 (the conformance run) and, with
``tests/peers/test_sglang_sampler.py`` under ``nox -s peer_releases``, 0.5.21 and 0.5.22
(``>=0.5.21,<0.6``). The sampling mask capture is new in 0.5.20, and 0.5.20 does not
import here: its ``sglang.srt.utils.common``, which ``sampling_params`` reaches, imports
torchvision at the top (see below).

``sglang.srt.layers.sampler`` itself does not import without a GPU build: its import
reaches ``sglang.srt.configs``, whose multimodal configs import torchvision, and PyPI's
only torchvision for Linux x86-64 is a CUDA build that does not load beside the CPU
build of torch (0.28.0, the release for torch 2.13: its ``_C.so`` links
``libc10_cuda.so``, and ``import torchvision`` fails with "operator torchvision::nms
does not exist"). The adapter therefore compiles the definitions it runs (the sampler's
``_SamplingMaskCapture``, ``top_k_top_p_min_p_sampling_from_probs_torch``,
``sampling_from_probs_torch`` and ``Sampler``'s two sampling mask builders, and
``SamplingMaskStatus`` and ``SamplingMaskOutput`` of ``logits_processor.py``) from the
installed files, unchanged (:mod:`tp_logprob.peers._installed`), in a namespace of the
names they use (torch, ``torch.distributed``, typing, SGLang's ``envs``); everything
else (sampling params, softmax, ``TOP_K_ALL``) is imported from the installed package.
sglang is installed ``--no-deps`` with only the packages those imports need
(``noxfile.py``, ``SGLANG_IMPORTS``).

Capability, from SGLang's source:

- TP=1 (the sampler sees a whole row); no vocabulary padding;
- fp32 only: SGLang's logits processor hands the sampler fp32 logits;
- infer only (the sampler runs in place, under no gradient);
- every token is read as a sampled token (mask mode ``all_active``);
- temperature: SGLang's division by ``fp32(T)``; no entropy;
- heterogeneous batches: one request per row with its own temperature and rules,
  greedy requests (temperature 0) beside sampled ones, through the branch
  ``SamplingBatchInfo`` picks for the whole batch. SGLang turns a greedy request into
  ``T = 1, top_k = 1``, so its sampling mask gives a greedy row the argmax alone and
  logprob 0 where the contract's greedy row keeps every live column (a finding, see
  ``docs/semantics.md``, "Heterogeneous batches");
- support mode ``sampling_params`` only; ``run_to_run``.

Glue: the sampler writes into its input, so it gets a private copy, and its random
draw runs under a forked RNG so the caller's stream is untouched. ``selected_logp`` is
the ``support_logprobs`` entry of the target (``-inf`` where its weight is 0); ``lse``
is ``torch.logsumexp`` of the tempered logits (SGLang returns no normaliser);
``support_lse`` is ``z - logprob`` at the largest kept ``z``, the normaliser of the
distribution SGLang returns; ``support_threshold`` the smallest tempered logit of
positive weight, ``support_size`` the count of such tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
import warnings
from enum import IntEnum
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
from tp_logprob.peers._installed import installed_definitions as compile_installed
from tp_logprob.peers._releases import ServedReleases
from tp_logprob.result import LogprobResult
from tp_logprob.support import SupportMode

__all__ = ["CAPABILITY", "SERVED", "VERIFIED_VERSIONS", "honest", "sglang_processed_logprob"]

SERVED = ServedReleases(
    "sglang",
    (((0, 5, 21), (0, 6)),),
    "releases before 0.5.20 have no sampling mask (Sampler._build_sampling_mask_output); "
    "0.5.20's sglang.srt.utils.common imports torchvision at the top, and PyPI's torchvision "
    "for torch 2.13 (0.28.0) is a CUDA build whose _C.so needs libc10_cuda.so, which a CPU "
    "torch lacks (import torchvision: 'operator torchvision::nms does not exist'); "
    "0.5.23 is the newest release",
)
"""The releases of sglang the adapter serves; it refuses the others before any work."""

VERIFIED_VERSIONS = str(SERVED)

CAPABILITY = LogprobBackendCapability(
    backend_id="sglang_sampler",
    roles=frozenset({LogprobRole.INFER}),
    dtypes=frozenset({LogprobDType.FP32}),
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

_DEFINITIONS = {
    "srt/layers/logits_processor.py": ("SamplingMaskStatus", "SamplingMaskOutput"),
    "srt/layers/sampler.py": (
        "_SamplingMaskCapture",
        "top_k_top_p_min_p_sampling_from_probs_torch",
        "sampling_from_probs_torch",
        "Sampler._build_greedy_sampling_mask_output",
        "Sampler._build_sampling_mask_output",
    ),
}
"""The definitions the adapter runs, by file of the installed ``sglang`` package."""


@imported_once
def _sglang() -> dict[str, Any]:
    SERVED.installed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # import-time notices of SGLang's dependencies
        try:
            from sglang.kernels.ops.sampling import softmax
        except ImportError:  # before 0.5.22 the sampler calls torch.softmax itself
            softmax = functools.partial(torch.softmax, dim=-1)
        from sglang.srt.sampling.sampling_params import TOP_K_ALL, SamplingParams
    return {
        "softmax": softmax,
        "SamplingParams": SamplingParams,
        "TOP_K_ALL": TOP_K_ALL,
        **installed_definitions(),
    }


def installed_definitions() -> dict[str, Any]:
    """The definitions of :data:`_DEFINITIONS`, compiled from the installed files unchanged."""
    from sglang.srt.environ import envs

    namespace = {
        "__name__": "tp_logprob.peers.sglang_sampler._installed",
        "torch": torch,
        "dist": torch.distributed,
        "dataclasses": dataclasses,
        "IntEnum": IntEnum,
        "envs": envs,
        **{name: getattr(typing, name) for name in ("NamedTuple", "Optional", "List", "Tuple")},
    }
    return compile_installed("sglang", _DEFINITIONS, namespace)


def sampling_params(contract: LogprobContract) -> list[Any]:
    """The SGLang ``SamplingParams`` of each row (one request per row, its temperature 0 for
    a greedy request), checked as SGLang checks a request."""
    support = contract.support
    if support is None or support.mode is not SupportMode.SAMPLING_PARAMS:
        raise ValueError(f"support={support!r}: the SGLang sampler needs sampling parameters")
    temperature = contract.temperature
    params = []
    for row in range(contract.num_tokens):
        top_k, top_p, min_p = support.row_rules(row)
        request = _sglang()["SamplingParams"](
            temperature=temperature[row] if isinstance(temperature, tuple) else temperature,
            top_k=-1 if top_k is None else top_k,
            top_p=1.0 if top_p is None else top_p,
            min_p=0.0 if min_p is None else min_p,
        )
        request.verify(contract.sharding.real_vocab_size)
        params.append(request)
    return params


def sampling_mask(logits: torch.Tensor, contract: LogprobContract) -> Any:
    """SGLang's ``SamplingMaskOutput`` of ``logits`` (a private copy), every token packed.

    The branch is ``Sampler.forward``'s for a batch of requests with these parameters
    (``SamplingBatchInfo``): greedy when every request has ``top_k <= 1``
    (``is_all_greedy``), plain sampling when no request turns a rule on, else
    ``top_k_top_p_min_p_sampling_from_probs_torch`` with one value per row.
    """
    sglang = _sglang()
    params = sampling_params(contract)
    rows, width = logits.shape
    probs = private_copy(logits)
    batch = torch.arange(rows)
    owner = SimpleNamespace(sampling_mask_max_tokens=width, tp_sync_group=None, cp_sync_group=None)
    if all(request.top_k <= 1 for request in params):
        tokens = torch.argmax(probs, -1)
        return sglang["Sampler._build_greedy_sampling_mask_output"](owner, batch, tokens, batch)
    top_ks = [request.top_k for request in params]
    top_ps = [request.top_p for request in params]
    min_ps = [request.min_p for request in params]
    temperatures = [[request.temperature] for request in params]
    probs.div_(torch.tensor(temperatures, dtype=torch.float32))
    probs[:] = sglang["softmax"](probs)
    with torch.random.fork_rng(devices=[]):
        rules_off = all(k == sglang["TOP_K_ALL"] for k in top_ks) and all(p == 1.0 for p in top_ps)
        if rules_off and not any(min_ps):
            tokens = sglang["sampling_from_probs_torch"](probs)
            weights, token_ids = probs, None
            selected = torch.gather(probs, 1, tokens.long().view(-1, 1)).squeeze(1)
        else:
            tokens, weights, token_ids, selected = sglang[
                "top_k_top_p_min_p_sampling_from_probs_torch"
            ](
                probs,
                torch.tensor(top_ks, dtype=torch.int32),
                torch.tensor(top_ps, dtype=torch.float32),
                torch.tensor(min_ps, dtype=torch.float32),
                any(value > 0 for value in min_ps),
                None,
                torch.zeros(rows, dtype=torch.int64),
                return_filtered_probs=True,
            )
    capture = sglang["_SamplingMaskCapture"](
        weights=weights, token_ids=token_ids, selected_weight=selected, batch_rows=batch
    )
    return sglang["Sampler._build_sampling_mask_output"](owner, tokens, capture, batch)


def sglang_processed_logprob(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    contract: LogprobContract,
    group: Any = None,
) -> LogprobResult:
    """``(selected_logp, lse)`` and the support outputs from SGLang's torch-native sampler."""
    check_op_inputs(local_logits, targets, contract, group)
    with torch.no_grad():
        logits = local_logits.detach()
        output = sampling_mask(logits, contract)
        rows, width = logits.shape
        logprobs = torch.full((rows, width), -torch.inf)
        logprobs.scatter_(1, output.token_ids.long(), output.support_logprobs)
        selected = logprobs.gather(1, targets.long()[:, None])[:, 0]
        z = logits.float() / torch.from_numpy(contract.row_divisors())[:, None]
        lse = torch.logsumexp(z, dim=1)
        kept = logprobs > -torch.inf
        top = torch.where(kept, z, -torch.inf).argmax(dim=1, keepdim=True)
        support_lse = lse_from_max(z.gather(1, top)[:, 0], -logprobs.gather(1, top)[:, 0])
        inf = torch.full_like(z, torch.inf)
        threshold = torch.where(kept, z, inf).amin(dim=1)
        threshold = torch.where(kept.any(dim=1), threshold, torch.nan)
    return LogprobResult(
        selected,
        lse if contract.export_lse else None,
        support_lse=support_lse,
        support_size=kept.sum(dim=1, dtype=torch.int64),
        support_threshold=threshold,
    )


honest = (sglang_processed_logprob, CAPABILITY)
"""The honest backend: ``--tp-logprob-backend=tp_logprob.peers.sglang_sampler:honest``."""
