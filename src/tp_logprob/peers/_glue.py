"""What every adapter needs between a library's loss and the contract's outputs.

Libraries return a cross-entropy *loss*, ``lse - x[target]``, and most of them
no LSE. Three pieces of glue turn that into ``(selected_logp, lse)``:

- **Sign of zero.** ``-loss`` turns a loss of ``+0.0`` (an ignored row, or a row
  with one live column) into ``-0.0``; the contract's inactive rows are exactly
  ``+0.0``. :func:`selected_from_loss` computes ``0.0 - loss`` instead, which is
  ``+0.0`` there and ``-loss`` bit for bit everywhere else.
- **An LSE from a shifted sum.** Where the library exposes the row maximum ``M``
  and ``log S`` (``S = sum exp(x - M)``), ``lse = M + log S``, except on rows whose
  maximum is infinite: ``x - M`` is ``inf - inf = NaN`` there, while the contract
  wants ``lse = +inf`` (a ``+inf`` logit) and ``lse = -inf`` (no finite live logit).
  :func:`lse_from_max` patches exactly those rows; a NaN maximum stays NaN.
- **Input copies.** Liger stores gradients (and zeroes ignored rows) in its
  input, Megatron subtracts the maximum from fp32 logits in place: the adapters
  hand those libraries a copy (:func:`private_copy`), so the caller's logits are
  untouched, at the cost of one extra logits-sized buffer.

The adapters that take hidden states share their argument checks
(:func:`check_hidden_inputs`, which also refuses a process whose fp32 matmul precision
would let the library's matmul use TF32 or bfloat16: an adapter never changes that
setting, since it belongs to the whole process) and, at TP=1, the shape of their capability
(:func:`fused_peer_capability`); the TP=1 adapters of a torch logprob helper share
their capability and "what users assume" variants (:func:`torch_helper_backends`).
Every adapter imports its library on its first call (:func:`imported_once`).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import torch

from tp_logprob.capability import LogprobBackendCapability
from tp_logprob.contract import (
    DeterminismScope,
    LogprobDType,
    LogprobInputKind,
    LogprobRole,
    MaskMode,
)
from tp_logprob.errors import LogprobContractError, LogprobDispatchError
from tp_logprob.kernels.dtypes import TORCH_DTYPES
from tp_logprob.kernels.validation import check_contract, check_hidden_op_targets

__all__ = [
    "FUSED_PEER_VARIANTS",
    "TORCH_HELPER_VARIANTS",
    "FusedPeerBackends",
    "TorchHelperBackends",
    "argmax_logits",
    "check_hidden_inputs",
    "claiming",
    "fused_peer_backends",
    "fused_peer_capability",
    "imported_once",
    "lse_from_argmax_logprob",
    "lse_from_max",
    "private_copy",
    "selected_from_loss",
    "torch_helper_backends",
]


_T = TypeVar("_T")


def imported_once(loader: Callable[[], _T]) -> Callable[[], _T]:
    """``loader``, run by the first call only; every later call returns what it returned.

    An adapter imports its library on its first call, not when the adapter is imported
    (the catalogue imports every adapter, installed or not), and the emulated ranks are
    threads that may make that first call together: a lock lets one of them load. A
    loader that raises is run again by the next call.
    """
    lock = threading.Lock()
    loaded: list[_T] = []

    @functools.wraps(loader)
    def once() -> _T:
        with lock:
            if not loaded:
                loaded.append(loader())
        return loaded[0]

    return once


def selected_from_loss(loss: torch.Tensor) -> torch.Tensor:
    """``-loss`` in fp32, with ``+0.0`` (not ``-0.0``) where the loss is zero."""
    return 0.0 - loss.float()


def lse_from_max(row_max: torch.Tensor, log_sum: torch.Tensor) -> torch.Tensor:
    """``row_max + log_sum`` in fp32; ``row_max`` itself where it is ``+-inf``."""
    row_max, log_sum = row_max.float(), log_sum.float()
    return torch.where(torch.isinf(row_max), row_max, row_max + log_sum)


_PRODUCT_ELEMENTS = 1 << 22
"""Float64 logits per chunk of :func:`argmax_logits`: rows x vocabulary stay below this."""


def argmax_logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's argmax of ``hidden @ weight.T (+ bias)`` and that logit, in float64 rounded
    to fp32.

    For an LSE where the library exposes no logits: its logprob of the argmax is
    ``x[a] - lse``, and this ``x[a]`` is nearly exact (one rounding).
    """
    rows, vocab = hidden.shape[0], weight.shape[0]
    top = torch.zeros(rows, dtype=torch.int64, device=hidden.device)
    value = torch.full((rows,), -torch.inf, dtype=torch.float32, device=hidden.device)
    if vocab == 0:
        return top, value
    step = max(1, _PRODUCT_ELEMENTS // vocab)
    columns = weight.to(torch.float64).T
    for begin in range(0, rows, step):
        logits = hidden[begin : begin + step].to(torch.float64) @ columns
        if bias is not None:
            logits = logits + bias.to(torch.float64)
        best = logits.nan_to_num(nan=torch.inf).argmax(dim=1)  # a NaN row: its NaN column
        top[begin : begin + step] = best
        value[begin : begin + step] = logits.gather(1, best[:, None])[:, 0].float()
    return top, value


def lse_from_argmax_logprob(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    temperature_fp32: float,
    logprob: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor], Any],
) -> torch.Tensor:
    """The LSE of a hidden-input op that returns logprobs only, without gradients.

    ``logprob(hidden, weight, bias, labels)`` is the library's logprob; called with each
    row's argmax ``a`` (:func:`argmax_logits`) it gives ``z[a] - lse``, so ``lse = z[a] -
    that``, with ``z[a] = x[a] / fp32(T)``, and ``lse = z[a]`` where that is ``+-inf``.
    """
    with torch.no_grad():
        hidden, weight = hidden.detach(), weight.detach()
        bias = None if bias is None else bias.detach()
        top, x_top = argmax_logits(hidden, weight, bias)
        z_top = x_top / torch.tensor(temperature_fp32, dtype=torch.float32)
        return lse_from_max(z_top, -logprob(hidden, weight, bias, top).float())


def private_copy(local_logits: torch.Tensor) -> torch.Tensor:
    """A copy the library may write into; gradients still flow to ``local_logits``."""
    return local_logits.clone(memory_format=torch.contiguous_format)


def claiming(
    pair: tuple[Any, LogprobBackendCapability], suffix: str, **claims: Any
) -> tuple[Any, LogprobBackendCapability]:
    """The same op under a capability that also claims ``claims`` (a "users assume" variant).

    The backend id gains ``.suffix`` so reports tell the variants apart.
    """
    op, capability = pair
    backend_id = f"{capability.backend_id}.{suffix}"
    return op, dataclasses.replace(capability, backend_id=backend_id, **claims)


def check_hidden_inputs(
    backend_id: str,
    hidden: Any,
    targets: Any,
    contract: Any,
    group: Any,
    weight: Any,
    bias: Any,
    *,
    no_bias: str | None = None,
    logits_backend: str | None = None,
) -> None:
    """A hidden-input op's argument checks, then the ones it shares with the logits ops.

    ``no_bias`` is why the library takes no bias (``None`` where it takes one);
    ``logits_backend`` names the library's logits-input backend, for the hint.
    """
    contract = check_contract(contract)
    if contract.input_kind is not LogprobInputKind.HIDDEN:
        hint = f"; use {logits_backend} for logits" if logits_backend else ""
        raise LogprobContractError(
            f"input_kind={contract.input_kind.value!r}: {backend_id} takes hidden states "
            f"(input_kind='hidden'){hint}"
        )
    if no_bias is not None and (contract.has_bias or bias is not None):
        raise LogprobContractError(f"has_bias={contract.has_bias!r}: {no_bias}")
    dtype = TORCH_DTYPES[contract.dtype]
    local = contract.sharding.local_vocab_size
    expected: list[tuple[str, Any, tuple[int | None, ...]]] = [
        ("hidden", hidden, (contract.num_tokens, contract.hidden_size)),
        ("weight", weight, (local, contract.hidden_size)),
    ]
    if contract.has_bias:
        expected.append(("bias", bias, (local,)))
    elif bias is not None:
        raise LogprobContractError(
            "bias: given, but the contract has has_bias=False (set has_bias=True to add it)"
        )
    for name, value, shape in expected:
        if not isinstance(value, torch.Tensor):
            raise LogprobContractError(
                f"{name}: expected a torch.Tensor, got {type(value).__name__}"
            )
        if tuple(value.shape) != shape or value.dtype != dtype:
            raise LogprobContractError(
                f"{name}: shape {tuple(value.shape)} and dtype {value.dtype}; the contract "
                f"needs {shape} and {dtype}"
            )
        if value.device != hidden.device:
            raise LogprobContractError(f"{name}.device={value.device} != {hidden.device}")
    check_hidden_op_targets(targets, contract, group, hidden.device)
    _check_full_fp32_matmul(backend_id, hidden.device)


def _check_full_fp32_matmul(backend_id: str, device: torch.device) -> None:
    """Raise unless torch's fp32 matmuls on ``device`` form full fp32 products.

    The library's matmul follows torch's fp32 matmul precision, one setting of the whole
    process; the contract (``allow_tf32=False``) needs full fp32 products, and changing
    the setting for the call would change it for the caller's other threads meanwhile.
    """
    module = "cuda" if device.type == "cuda" else "mkldnn"
    # torch.backends.mkldnn sets ``matmul`` at import, where its stubs do not see it.
    precision = getattr(torch.backends, module).matmul.fp32_precision
    if precision not in ("none", "ieee"):
        raise LogprobDispatchError(
            f"torch.backends.{module}.matmul.fp32_precision={precision!r}: {backend_id}'s "
            "matmul would not form full fp32 products (allow_tf32=False); call it where "
            'the precision is "ieee" (torch.set_float32_matmul_precision("highest"))'
        )


def fused_peer_capability(
    backend_id: str, mask_mode: MaskMode, **claims: Any
) -> LogprobBackendCapability:
    """The capability of a library's TP=1 hidden-input op (verl's, Liger's, CCE's).

    What those ops share: hidden states in, the whole vocabulary of a row (TP=1, no
    padding), fp32 only, train and infer, an LSE, and bits that hold from run to run
    only (a row's matmul shape follows the batch). ``mask_mode`` is how the library leaves
    rows out; ``claims`` adds its own (temperature, entropy, bias).
    """
    return _whole_vocabulary_capability(
        backend_id,
        mask_mode,
        DeterminismScope.RUN_TO_RUN,
        input_kinds=frozenset({LogprobInputKind.HIDDEN}),
        **claims,
    )


def _whole_vocabulary_capability(
    backend_id: str, mask_mode: MaskMode, scope: DeterminismScope, **claims: Any
) -> LogprobBackendCapability:
    """What every TP=1 library op here claims: the whole vocabulary of a row (no padding),
    fp32 only, train and infer, an LSE; its mask mode, scope and ``claims`` besides."""
    return LogprobBackendCapability(
        backend_id=backend_id,
        roles=frozenset({LogprobRole.TRAIN, LogprobRole.INFER}),
        dtypes=frozenset({LogprobDType.FP32}),
        tp_world_sizes=frozenset({1}),
        cp_world_sizes=frozenset({1}),
        supports_vocab_padding=False,
        mask_modes=frozenset({mask_mode}),
        exports_vocab_lse=True,
        determinism_scopes=frozenset({scope}),
        **claims,
    )


class TorchHelperBackends(NamedTuple):
    """A TP=1 torch logprob helper's honest backend and its "what users assume" variants."""

    honest: tuple[Any, LogprobBackendCapability]
    assume_padding: tuple[Any, LogprobBackendCapability]
    assume_16bit: tuple[Any, LogprobBackendCapability]
    assume_inactive_tokens: tuple[Any, LogprobBackendCapability]


TORCH_HELPER_VARIANTS = ("assume_16bit", "assume_inactive_tokens", "assume_padding")
"""The variant names of :class:`TorchHelperBackends`, for the adapters' ``__all__``."""


def torch_helper_backends(op: Any, backend_id: str, **claims: Any) -> TorchHelperBackends:
    """The backends of a trainer's torch logprob helper (TRL's, verl's, OpenRLHF's).

    What those helpers share: the whole vocabulary of a row (TP=1, no padding), fp32
    only (16-bit logits get ``log_softmax`` in their own dtype), no ``ignore_index``
    (every target is gathered, so ``all_active``), one row at a time
    (``fixed_topology``), train and infer, and an LSE from the argmax call of the
    adapter's glue. ``claims`` adds the helper's own (temperature, entropy). The
    variants claim no entropy, so that what fails is their assumption.
    """
    capability = _whole_vocabulary_capability(
        backend_id, MaskMode.ALL_ACTIVE, DeterminismScope.FIXED_TOPOLOGY, **claims
    )
    base = (op, dataclasses.replace(capability, exports_entropy=False))
    return TorchHelperBackends(
        honest=(op, capability),
        assume_padding=claiming(base, "assume_padding", supports_vocab_padding=True),
        assume_16bit=claiming(base, "assume_16bit", dtypes=frozenset(LogprobDType)),
        assume_inactive_tokens=claiming(
            base, "assume_inactive_tokens", mask_modes=frozenset(MaskMode)
        ),
    )


class FusedPeerBackends(NamedTuple):
    """A TP=1 hidden-input op's honest backend and its "what users assume" variants."""

    honest: tuple[Any, LogprobBackendCapability]
    assume_padding: tuple[Any, LogprobBackendCapability]
    assume_16bit: tuple[Any, LogprobBackendCapability]
    assume_inactive_tokens: tuple[Any, LogprobBackendCapability]
    assume_batch_invariant: tuple[Any, LogprobBackendCapability]


FUSED_PEER_VARIANTS = (
    "assume_16bit",
    "assume_batch_invariant",
    "assume_inactive_tokens",
    "assume_padding",
)
"""The variant names of :class:`FusedPeerBackends`, for the adapters' ``__all__``."""


def fused_peer_backends(op: Any, capability: LogprobBackendCapability) -> FusedPeerBackends:
    """The backends of a library's TP=1 hidden-input op (TRL's chunked, verl's fused, CCE's).

    Each variant is the same op claiming one more thing: vocabulary padding, 16-bit
    inputs, every mask mode, or bits that hold at a fixed topology. The variants claim no
    entropy, so that what fails is their assumption.
    """
    base = (op, dataclasses.replace(capability, exports_entropy=False))
    return FusedPeerBackends(
        honest=(op, capability),
        assume_padding=claiming(base, "assume_padding", supports_vocab_padding=True),
        assume_16bit=claiming(base, "assume_16bit", dtypes=frozenset(LogprobDType)),
        assume_inactive_tokens=claiming(
            base, "assume_inactive_tokens", mask_modes=frozenset(MaskMode)
        ),
        assume_batch_invariant=claiming(
            base,
            "assume_batch_invariant",
            determinism_scopes=frozenset({DeterminismScope.FIXED_TOPOLOGY}),
        ),
    )
