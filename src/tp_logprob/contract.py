"""The typed contract of one vocab-parallel logprob invocation.

A :class:`LogprobContract` says what one rank is asked to compute: the role, the
input dtype, which tokens are active, how the (padded) vocabulary is split across
tensor-parallel ranks, and which determinism the caller needs. It is validated
once, at construction, so kernels and the registry can trust every field.

Everything here is pure Python and numpy: importing it never imports torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob._validation import (
    check_bool,
    check_enum,
    check_instance,
    check_int,
    check_optional_int,
    check_row_temperature,
    check_temperature,
)
from tp_logprob.contract_schema import CONTRACT_SCHEMA_VERSION, upgrade
from tp_logprob.errors import LogprobContractError, LogprobDispatchError
from tp_logprob.support import SupportMode, SupportSpec

__all__ = [
    "DeterminismScope",
    "LogprobContract",
    "LogprobContractError",
    "LogprobDType",
    "LogprobDispatchError",
    "LogprobInputKind",
    "LogprobOutputSpec",
    "LogprobRole",
    "MaskMode",
    "MaskSpec",
    "ReductionSpec",
    "ShardingSpec",
    "SupportMode",
    "SupportSpec",
    "even_shard_bounds",
]


class LogprobRole(str, Enum):
    """What the result is for: ``train`` needs a backward pass, ``infer`` does not."""

    TRAIN = "train"
    INFER = "infer"


class LogprobDType(str, Enum):
    """The dtype of the logits a rank passes in."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"


class LogprobInputKind(str, Enum):
    """What a rank passes in: its shard of the ``logits``, or the ``hidden`` states.

    With ``hidden`` the op receives ``hidden[N, hidden_size]`` (replicated across
    TP ranks) and the rank's weight rows ``W[local_vocab_size, hidden_size]``, and
    computes ``x = hidden @ W.T (+ bias)`` itself (the fused LM head).
    """

    LOGITS = "logits"
    HIDDEN = "hidden"


class DeterminismScope(str, Enum):
    """How far bitwise reproducibility must reach (``docs/semantics.md``, "Determinism scopes").

    ``run_to_run``: the same inputs (the whole batch) give the same bits on every run.
    ``fixed_topology``: additionally batch invariant: a row's bits do not depend on
    the other rows, their order, N, or the row's position, for one shard layout.
    ``cross_tp_bitwise``: additionally across every TP degree and shard layout.
    ``cross_platform_bitwise``: additionally across platforms: the same bits on every
    platform in the capability's ``bitwise_platforms`` (CPU, NVIDIA, AMD), which needs
    an op built from IEEE-exact operations alone (no vendor ``exp``/``log``, no
    contraction a compiler chose, no flushed subnormals).

    ``run_to_run`` is what an all-reduce SUM of per-rank partials (``loss_parallel``)
    or an N-dependent chunking of the rows (Liger's fused linear cross entropy) offers.
    """

    RUN_TO_RUN = "run_to_run"
    FIXED_TOPOLOGY = "fixed_topology"
    CROSS_TP_BITWISE = "cross_tp_bitwise"
    CROSS_PLATFORM_BITWISE = "cross_platform_bitwise"

    def satisfies(self, requested: DeterminismScope) -> bool:
        """Whether a backend offering ``self`` meets a request for ``requested``."""
        return _SCOPE_STRENGTH[self] >= _SCOPE_STRENGTH[requested]


_SCOPE_STRENGTH = {
    DeterminismScope.RUN_TO_RUN: 0,
    DeterminismScope.FIXED_TOPOLOGY: 1,
    DeterminismScope.CROSS_TP_BITWISE: 2,
    DeterminismScope.CROSS_PLATFORM_BITWISE: 3,
}


class MaskMode(str, Enum):
    """How a backend learns which tokens are inactive.

    ``explicit_active_mask``: from a per-token active mask, so an inactive token's
    target may hold anything. ``ignore_index``: only from ``target == ignore_index``,
    so such a backend can serve a contract only when every token is active (the
    contract never promises that inactive targets hold ``ignore_index``).
    ``all_active``: it has no notion of an inactive token and reads every target
    (Megatron's vocab-parallel cross entropy, TRL's selective log-softmax); it
    serves the same contracts as ``ignore_index``, and says so honestly.

    A contract whose every token is active needs ``ignore_index`` (nothing to skip,
    :attr:`MaskSpec.mode`); one with an inactive token needs ``explicit_active_mask``.
    """

    EXPLICIT_ACTIVE_MASK = "explicit_active_mask"
    IGNORE_INDEX = "ignore_index"
    ALL_ACTIVE = "all_active"

    def serves(self, required: MaskMode) -> bool:
        """Whether a backend offering ``self`` serves a mask that needs ``required``."""
        return (
            self is MaskMode.EXPLICIT_ACTIVE_MASK or required is not MaskMode.EXPLICIT_ACTIVE_MASK
        )


def even_shard_bounds(padded_vocab_size: int, tp_world_size: int) -> tuple[tuple[int, int], ...]:
    """Megatron-style contiguous shards of ``ceil(padded / tp)`` columns.

    The last bound is pinned to ``padded_vocab_size`` so the shards always partition
    the vocabulary, even when it does not divide evenly.

    >>> even_shard_bounds(10, 3)
    ((0, 4), (4, 8), (8, 10))
    """
    padded = check_int("padded_vocab_size", padded_vocab_size, min_value=1)
    world = check_int("tp_world_size", tp_world_size, min_value=1)
    if world > padded:
        raise LogprobContractError(
            f"tp_world_size={world!r}: more ranks than padded_vocab_size={padded!r} columns"
        )
    width = -(-padded // world)
    starts = [min(rank * width, padded) for rank in range(world)]
    bounds = [(start, min(start + width, padded)) for start in starts]
    if any(end <= start for start, end in bounds):
        raise LogprobContractError(
            f"padded_vocab_size={padded!r}, tp_world_size={world!r}: an even split of width "
            f"{width} leaves a rank without columns; pass vocab_shard_bounds explicitly"
        )
    bounds[-1] = (bounds[-1][0], padded)
    return tuple(bounds)


def _check_bounds(value: object, world: int, padded: int) -> tuple[tuple[int, int], ...]:
    name = "vocab_shard_bounds"
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise LogprobContractError(f"{name}={value!r}: expected a sequence of (start, end) pairs")
    if len(value) != world:
        raise LogprobContractError(
            f"{name}={value!r}: has {len(value)} shards but tp_world_size={world!r}"
        )
    bounds: list[tuple[int, int]] = []
    for index, pair in enumerate(value):
        item = f"{name}[{index}]"
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise LogprobContractError(f"{item}={pair!r}: expected a (start, end) pair")
        start = check_int(f"{item}[0]", pair[0], min_value=0)
        end = check_int(f"{item}[1]", pair[1], min_value=0)
        if end <= start:
            raise LogprobContractError(f"{item}={(start, end)!r}: end must be greater than start")
        expected_start = bounds[-1][1] if bounds else 0
        if start != expected_start:
            raise LogprobContractError(
                f"{item}={(start, end)!r}: shards must be contiguous; expected start "
                f"{expected_start}"
            )
        bounds.append((start, end))
    if bounds[-1][1] != padded:
        raise LogprobContractError(
            f"{name}={tuple(bounds)!r}: last end must equal padded_vocab_size={padded!r}"
        )
    return tuple(bounds)


@dataclass(frozen=True)
class ShardingSpec:
    """How the padded vocabulary is split into contiguous per-rank column shards."""

    tp_rank: int
    tp_world_size: int
    vocab_shard_bounds: tuple[tuple[int, int], ...]
    real_vocab_size: int
    padded_vocab_size: int
    cp_rank: int = 0
    cp_world_size: int = 1

    def __post_init__(self) -> None:
        world = check_int("tp_world_size", self.tp_world_size, min_value=1)
        rank = check_int("tp_rank", self.tp_rank, min_value=0)
        if rank >= world:
            raise LogprobContractError(f"tp_rank={rank!r}: must be < tp_world_size={world!r}")
        real = check_int("real_vocab_size", self.real_vocab_size, min_value=1)
        padded = check_int("padded_vocab_size", self.padded_vocab_size, min_value=1)
        if padded < real:
            raise LogprobContractError(
                f"padded_vocab_size={padded!r}: must be >= real_vocab_size={real!r}"
            )
        cp_world = check_int("cp_world_size", self.cp_world_size, min_value=1)
        cp_rank = check_int("cp_rank", self.cp_rank, min_value=0)
        if cp_rank >= cp_world:
            raise LogprobContractError(f"cp_rank={cp_rank!r}: must be < cp_world_size={cp_world!r}")
        bounds = _check_bounds(self.vocab_shard_bounds, world, padded)
        for name, value in (
            ("tp_rank", rank),
            ("tp_world_size", world),
            ("vocab_shard_bounds", bounds),
            ("real_vocab_size", real),
            ("padded_vocab_size", padded),
            ("cp_rank", cp_rank),
            ("cp_world_size", cp_world),
        ):
            object.__setattr__(self, name, value)

    @property
    def local_bounds(self) -> tuple[int, int]:
        """This rank's ``[start, end)`` columns of the padded vocabulary."""
        return self.vocab_shard_bounds[self.tp_rank]

    @property
    def local_vocab_size(self) -> int:
        """Width of this rank's shard, padding included."""
        start, end = self.local_bounds
        return end - start

    @property
    def has_padding(self) -> bool:
        """Whether some columns exist in the tensor but are not real vocabulary."""
        return self.padded_vocab_size > self.real_vocab_size

    @property
    def is_even_layout(self) -> bool:
        """Whether every shard is ``padded / tp`` columns wide: the TP degree divides the
        padded vocabulary and the bounds are :func:`even_shard_bounds` (``rank * width``),
        as Megatron lays them out after padding the vocabulary to a multiple of 128 x TP."""
        padded, world = self.padded_vocab_size, self.tp_world_size
        if padded % world:
            return False
        return self.vocab_shard_bounds == even_shard_bounds(padded, world)

    def live_bounds(self, rank: int | None = None) -> tuple[int, int]:
        """The ``[start, end)`` of real (non-padding) columns a rank owns; may be empty."""
        start, end = self.vocab_shard_bounds[self.tp_rank if rank is None else rank]
        return start, max(start, min(end, self.real_vocab_size))

    def owner_of(self, column: int) -> int:
        """The rank whose shard holds global ``column``."""
        for rank, (start, end) in enumerate(self.vocab_shard_bounds):
            if start <= column < end:
                return rank
        raise LogprobContractError(
            f"column={column!r}: outside [0, padded_vocab_size={self.padded_vocab_size})"
        )


def _mask_array(value: object, num_tokens: int) -> npt.NDArray[np.bool_] | None:
    """Return the mask as a read-only numpy bool array without a per-token Python loop."""
    if value is None:
        return None
    name = "active_mask"
    if type(value).__module__.startswith("torch"):
        if str(getattr(value, "dtype", "")) != "torch.bool":
            raise LogprobContractError(
                f"{name}: expected a torch.bool tensor, got dtype={getattr(value, 'dtype', None)}"
            )
        value = value.detach().cpu().numpy()  # type: ignore[attr-defined]
    elif isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise LogprobContractError(
            f"{name}={value!r}: expected None, a sequence of bools, a numpy bool array "
            "or a torch bool tensor"
        )
    try:
        array = np.array(value, copy=True)
    except (ValueError, TypeError) as error:
        raise LogprobContractError(f"{name}={value!r}: not a flat sequence of bools") from error
    if array.size == 0 and array.ndim == 1:
        array = array.astype(np.bool_)  # [] carries no dtype of its own
    if array.dtype != np.bool_:
        raise LogprobContractError(
            f"{name}: expected bools, got an array of dtype {array.dtype}"
            + (" (use True/False, not 1/0)" if array.dtype.kind in "iu" else "")
        )
    if array.shape != (num_tokens,):
        raise LogprobContractError(
            f"{name}: has shape {array.shape}, expected ({num_tokens},) for num_tokens={num_tokens}"
        )
    array.flags.writeable = False
    return array


@dataclass(frozen=True, eq=False)
class MaskSpec:
    """Which of the ``num_tokens`` rows are active.

    ``active_mask=None`` means every token is active. Inactive tokens get
    ``selected_logp = 0.0`` and their target is never read, so it may hold
    ``ignore_index`` or anything else.
    """

    num_tokens: int
    active_mask: Any = None
    ignore_index: int = -100
    _digest: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        num_tokens = check_int("num_tokens", self.num_tokens, min_value=0)
        object.__setattr__(self, "num_tokens", num_tokens)
        object.__setattr__(self, "ignore_index", check_int("ignore_index", self.ignore_index))
        mask = _mask_array(self.active_mask, num_tokens)
        object.__setattr__(self, "active_mask", mask)
        object.__setattr__(self, "_digest", _mask_digest(mask, num_tokens))

    @property
    def mode(self) -> MaskMode:
        """The mask mode a backend needs: ``explicit_active_mask`` when a token is inactive.

        With every token active there is nothing to skip, so ``ignore_index``
        (which an ``explicit_active_mask`` backend serves too).
        """
        if self.active_token_count < self.num_tokens:
            return MaskMode.EXPLICIT_ACTIVE_MASK
        return MaskMode.IGNORE_INDEX

    @property
    def active_token_count(self) -> int:
        """How many tokens are active."""
        mask = self.active_mask
        return self.num_tokens if mask is None else int(np.count_nonzero(mask))

    @property
    def active_mask_sha256(self) -> str:
        """sha256 of the mask (and token count): provenance without the per-token data."""
        return self._digest

    def dense(self) -> npt.NDArray[np.bool_]:
        """The mask as a writable bool array of length ``num_tokens`` (all True if none)."""
        if self.active_mask is None:
            return np.ones(self.num_tokens, dtype=np.bool_)
        return np.array(self.active_mask, copy=True)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MaskSpec):
            return NotImplemented
        return (self.num_tokens, self.ignore_index, self._digest) == (
            other.num_tokens,
            other.ignore_index,
            other._digest,
        )

    def __hash__(self) -> int:
        return hash((self.num_tokens, self.ignore_index, self._digest))


def _mask_digest(mask: npt.NDArray[np.bool_] | None, num_tokens: int) -> str:
    hasher = hashlib.sha256(f"tp-logprob-mask:{num_tokens}:".encode())
    if mask is None:
        hasher.update(b"all-active")
    else:
        hasher.update(np.packbits(mask).tobytes())
    return hasher.hexdigest()


@dataclass(frozen=True)
class ReductionSpec:
    """How the cross-rank reduction must behave; today, its determinism scope."""

    determinism_scope: DeterminismScope = DeterminismScope.CROSS_TP_BITWISE

    def __post_init__(self) -> None:
        scope = check_enum("determinism_scope", self.determinism_scope, DeterminismScope)
        object.__setattr__(self, "determinism_scope", scope)


@dataclass(frozen=True)
class LogprobOutputSpec:
    """The dtype of the returned tensors. Backends compute in fp32 and cast at the last write."""

    dtype: LogprobDType = LogprobDType.FP32

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", check_enum("output.dtype", self.dtype, LogprobDType))


@dataclass(frozen=True)
class LogprobContract:
    """One rank's view of one vocab-parallel logprob invocation.

    >>> import tp_logprob as tpl
    >>> contract = tpl.LogprobContract(
    ...     role="infer", dtype="bf16", mask=tpl.MaskSpec(num_tokens=4),
    ...     sharding=tpl.ShardingSpec(0, 2, tpl.even_shard_bounds(256, 2), 250, 256),
    ...     reduction=tpl.ReductionSpec("fixed_topology"))
    >>> contract.sharding.local_bounds
    (0, 128)
    """

    role: LogprobRole
    dtype: LogprobDType
    mask: MaskSpec
    sharding: ShardingSpec
    reduction: ReductionSpec
    output: LogprobOutputSpec = field(default_factory=LogprobOutputSpec)
    export_lse: bool = True
    temperature: float | tuple[float, ...] = 1.0
    export_entropy: bool = False
    input_kind: LogprobInputKind = LogprobInputKind.LOGITS
    hidden_size: int | None = None
    has_bias: bool = False
    allow_tf32: bool = False
    support: SupportSpec | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", check_enum("role", self.role, LogprobRole))
        object.__setattr__(self, "dtype", check_enum("dtype", self.dtype, LogprobDType))
        check_instance("mask", self.mask, MaskSpec)
        check_instance("sharding", self.sharding, ShardingSpec)
        check_instance("reduction", self.reduction, ReductionSpec)
        check_instance("output", self.output, LogprobOutputSpec)
        object.__setattr__(self, "export_lse", check_bool("export_lse", self.export_lse))
        object.__setattr__(self, "temperature", self._checked_temperature())
        object.__setattr__(
            self, "export_entropy", check_bool("export_entropy", self.export_entropy)
        )
        self._check_input_kind()
        self._check_support()
        ignore_index, real = self.mask.ignore_index, self.sharding.real_vocab_size
        if 0 <= ignore_index < real:
            raise LogprobContractError(
                f"mask.ignore_index={ignore_index!r}: lies inside [0, real_vocab_size={real}), "
                "so it would collide with a real token id; use a negative value such as -100"
            )

    def _checked_temperature(self) -> float | tuple[float, ...]:
        """One temperature, or one per row: each ``> 0``, or ``0.0`` for a greedy row."""
        value = self.temperature
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value.item()
        if not isinstance(value, (list, tuple, np.ndarray)):
            return check_temperature(value)
        rows = self.mask.num_tokens if isinstance(self.mask, MaskSpec) else None
        if len(value) != rows:
            raise LogprobContractError(
                f"temperature: {len(value)} per-row values, expected num_tokens={rows} "
                "(one per row)"
            )
        return tuple(
            check_row_temperature(f"temperature[row {row}]", item) for row, item in enumerate(value)
        )

    def _check_input_kind(self) -> None:
        """``hidden_size`` is required with ``hidden`` input; bias and TF32 only exist there."""
        kind = check_enum("input_kind", self.input_kind, LogprobInputKind)
        object.__setattr__(self, "input_kind", kind)
        hidden_size = check_optional_int("hidden_size", self.hidden_size, min_value=1)
        object.__setattr__(self, "hidden_size", hidden_size)
        object.__setattr__(self, "has_bias", check_bool("has_bias", self.has_bias))
        object.__setattr__(self, "allow_tf32", check_bool("allow_tf32", self.allow_tf32))
        if kind is LogprobInputKind.HIDDEN:
            if hidden_size is None:
                raise LogprobContractError(
                    "hidden_size=None: input_kind='hidden' needs the hidden size (>= 1)"
                )
            return
        for name, value, default in (
            ("hidden_size", hidden_size, None),
            ("has_bias", self.has_bias, False),
            ("allow_tf32", self.allow_tf32, False),
        ):
            if value != default:
                raise LogprobContractError(
                    f"{name}={value!r}: only meaningful with input_kind='hidden' "
                    f"(input_kind={kind.value!r}); leave it at {default!r}"
                )

    def _check_support(self) -> None:
        """A replayed mask has one row per token, ids in the real vocabulary, and at least
        one kept id for every active token."""
        support = self.support
        if support is None:
            return
        check_instance("support", support, SupportSpec)
        rows, num_tokens = support.num_rows, self.mask.num_tokens
        if support.mode is not SupportMode.REPLAYED_MASK:
            if rows is not None and rows != num_tokens:
                raise LogprobContractError(
                    f"support: per-row sampling parameters describe {rows} rows, expected "
                    f"num_tokens={num_tokens} (one entry per row)"
                )
            return
        if rows != num_tokens:
            raise LogprobContractError(
                f"support.kept_offsets: describes {rows} rows, expected num_tokens={num_tokens} "
                f"(len(kept_offsets) = num_tokens + 1)"
            )
        real = self.sharding.real_vocab_size
        ids = support.kept_ids
        if ids.size and int(ids.max()) >= real:
            position = int(np.flatnonzero(ids >= real)[0])
            row = int(np.searchsorted(support.kept_offsets, position, side="right")) - 1
            raise LogprobContractError(
                f"support.kept_ids[row {row}]={int(ids[position])!r}: outside the real "
                f"vocabulary [0, real_vocab_size={real})"
            )
        empty = (support.kept_counts() == 0) & self.mask.dense()
        if empty.any():
            row = int(np.flatnonzero(empty)[0])
            raise LogprobContractError(
                f"support.kept_ids[row {row}]=[]: an active token needs a non-empty support "
                f"({int(empty.sum())} active rows have none)"
            )

    @property
    def support_mode(self) -> SupportMode:
        """``full`` without a support, else the support's mode (see :class:`SupportMode`)."""
        return SupportMode.FULL if self.support is None else self.support.mode

    @property
    def num_tokens(self) -> int:
        """Rows in this invocation."""
        return self.mask.num_tokens

    @property
    def mask_mode(self) -> MaskMode:
        """The mask mode a backend needs for this contract (see :attr:`MaskSpec.mode`)."""
        return self.mask.mode

    @property
    def heterogeneous(self) -> bool:
        """Whether rows bring their own sampling parameters: a per-row temperature or per-row
        ``top_k`` / ``top_p`` / ``min_p`` (see ``docs/semantics.md``, "Heterogeneous batches")."""
        per_row_support = self.support is not None and self.support.per_row
        return isinstance(self.temperature, tuple) or per_row_support

    def greedy_rows(self) -> npt.NDArray[np.bool_]:
        """bool ``[num_tokens]``: the rows whose per-row temperature is 0 (greedy requests)."""
        if not isinstance(self.temperature, tuple):
            return np.zeros(self.num_tokens, dtype=np.bool_)
        return np.array([value == 0.0 for value in self.temperature], dtype=np.bool_)

    def row_divisors(self) -> npt.NDArray[np.float32]:
        """fp32 ``[num_tokens]``: each row's divisor ``fp32(T)`` of ``z = fp32(x) / fp32(T)``,
        1 for a greedy row (one value repeated for one temperature per batch)."""
        temperature = self.temperature
        if not isinstance(temperature, tuple):
            return np.full(self.num_tokens, temperature, dtype=np.float32)
        values = [1.0 if value == 0.0 else value for value in temperature]
        return np.asarray(values, dtype=np.float64).astype(np.float32)

    @property
    def batch_temperature(self) -> float:
        """The batch's one temperature, as given.

        A per-row temperature has none: a backend serves such a contract group by group of
        rows (:func:`tp_logprob.row_groups.row_groups`), each with one temperature."""
        if isinstance(self.temperature, tuple):
            raise LogprobContractError(
                "temperature: per-row values have no single divisor; split the batch with "
                "tp_logprob.row_groups.row_groups(contract)"
            )
        return self.temperature

    @property
    def temperature_fp32(self) -> float:
        """``fp32(temperature)``: the divisor of ``z = fp32(x) / T``, exact as a Python float
        (one temperature per batch, :attr:`batch_temperature`)."""
        return float(np.float32(self.batch_temperature))

    def with_rank(self, tp_rank: int) -> LogprobContract:
        """The same invocation as seen by another tensor-parallel rank."""
        sharding = dataclasses.replace(self.sharding, tp_rank=tp_rank)
        return dataclasses.replace(self, sharding=sharding)

    def to_dict(self) -> dict[str, Any]:
        """Stable, JSON-compatible provenance; the mask appears as a sha256 digest."""
        sharding = self.sharding
        return {
            "schema": CONTRACT_SCHEMA_VERSION,
            "role": self.role.value,
            "dtype": self.dtype.value,
            "mask": {
                "num_tokens": self.mask.num_tokens,
                "mode": self.mask.mode.value,
                "explicit": self.mask.active_mask is not None,
                "active_token_count": self.mask.active_token_count,
                "ignore_index": self.mask.ignore_index,
                "active_mask_sha256": self.mask.active_mask_sha256,
            },
            "sharding": {
                "tp_rank": sharding.tp_rank,
                "tp_world_size": sharding.tp_world_size,
                "vocab_shard_bounds": [list(pair) for pair in sharding.vocab_shard_bounds],
                "local_bounds": list(sharding.local_bounds),
                "real_vocab_size": sharding.real_vocab_size,
                "padded_vocab_size": sharding.padded_vocab_size,
                "cp_rank": sharding.cp_rank,
                "cp_world_size": sharding.cp_world_size,
            },
            "reduction": {"determinism_scope": self.reduction.determinism_scope.value},
            "output": {"dtype": self.output.dtype.value},
            "export_lse": self.export_lse,
            "temperature": (
                list(self.temperature) if isinstance(self.temperature, tuple) else self.temperature
            ),
            "export_entropy": self.export_entropy,
            "input": {
                "kind": self.input_kind.value,
                "hidden_size": self.hidden_size,
                "has_bias": self.has_bias,
                "allow_tf32": self.allow_tf32,
            },
            "support": None if self.support is None else self.support.to_dict(),
        }

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        active_mask: Any = None,
        kept: tuple[Any, Any] | None = None,
    ) -> LogprobContract:
        """Rebuild a contract from :meth:`to_dict` output and the arrays it digests.

        ``active_mask`` is the active mask and ``kept`` the ``(kept_offsets, kept_ids)``
        of a replayed support. Raises :class:`LogprobContractError` when a field is
        missing or malformed, or when an array does not match its recorded digest.
        Schema 1 documents (before temperature and entropy) load with
        ``temperature=1.0`` and no entropy; schema 1 and 2 documents (before the input
        kind) load as logits input; schema 1 to 3 documents have no support.
        """
        try:
            document = upgrade(data)
            mask_data, sharding_data = document["mask"], document["sharding"]
            mask = MaskSpec(
                num_tokens=mask_data["num_tokens"],
                active_mask=active_mask,
                ignore_index=mask_data["ignore_index"],
            )
            if mask.active_mask_sha256 != mask_data["active_mask_sha256"]:
                raise LogprobContractError(
                    f"mask.active_mask_sha256={mask_data['active_mask_sha256']!r}: does not "
                    "match the given active_mask"
                )
            sharding = ShardingSpec(
                tp_rank=sharding_data["tp_rank"],
                tp_world_size=sharding_data["tp_world_size"],
                vocab_shard_bounds=tuple(
                    tuple(pair) for pair in sharding_data["vocab_shard_bounds"]
                ),
                real_vocab_size=sharding_data["real_vocab_size"],
                padded_vocab_size=sharding_data["padded_vocab_size"],
                cp_rank=sharding_data["cp_rank"],
                cp_world_size=sharding_data["cp_world_size"],
            )
            return cls(
                role=document["role"],
                dtype=document["dtype"],
                mask=mask,
                sharding=sharding,
                reduction=ReductionSpec(document["reduction"]["determinism_scope"]),
                output=LogprobOutputSpec(document["output"]["dtype"]),
                export_lse=document["export_lse"],
                temperature=document["temperature"],
                export_entropy=document["export_entropy"],
                support=_support_field(document["support"], kept),
                **_input_fields(document["input"]),
            )
        except (KeyError, TypeError) as error:
            raise LogprobContractError(
                f"contract data: malformed or missing field {error}"
            ) from None

    def cross_rank_fingerprint(self) -> str:
        """A digest every rank of one invocation computes identically.

        It covers everything except the rank itself and its local bounds, so ranks
        can all-gather it to prove they agree before dispatching collectively.
        """
        data = self.to_dict()
        del data["sharding"]["tp_rank"], data["sharding"]["local_bounds"]
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def describe(self) -> str:
        """The contract in one line, for reports."""
        s = self.sharding
        if isinstance(self.temperature, tuple):
            greedy = int(self.greedy_rows().sum())
            extras = f" T=per-row ({len(set(self.temperature))} values, {greedy} greedy rows)"
        else:
            extras = "" if self.temperature == 1.0 else f" T={self.temperature!r}"
        extras += " +entropy" if self.export_entropy else ""
        if self.input_kind is LogprobInputKind.HIDDEN:
            extras += f" hidden H={self.hidden_size}"
            extras += " +bias" if self.has_bias else ""
            extras += " +tf32" if self.allow_tf32 else ""
        if self.support is not None:
            extras += f" support: {self.support.rules()}"
        return (
            f"{self.role.value} {self.dtype.value} N={self.num_tokens} "
            f"(active {self.mask.active_token_count}) tp={s.tp_rank}/{s.tp_world_size} "
            f"bounds={list(s.vocab_shard_bounds)} real={s.real_vocab_size} "
            f"padded={s.padded_vocab_size} {self.reduction.determinism_scope.value}{extras}"
        )


def _input_fields(section: Mapping[str, Any]) -> dict[str, Any]:
    """The input-kind fields of a :meth:`LogprobContract.to_dict` document's ``input``."""
    return {
        "input_kind": section["kind"],
        "hidden_size": section["hidden_size"],
        "has_bias": section["has_bias"],
        "allow_tf32": section["allow_tf32"],
    }


def _support_field(
    section: Mapping[str, Any] | None, kept: tuple[Any, Any] | None
) -> SupportSpec | None:
    """The support of a :meth:`LogprobContract.to_dict` document's ``support``."""
    if section is None:
        if kept is not None:
            raise LogprobContractError("kept: given, but the contract data has no support")
        return None
    if section["mode"] == SupportMode.REPLAYED_MASK.value:
        if kept is None:
            raise LogprobContractError(
                "kept=None: the contract data has a replayed support; pass its "
                "(kept_offsets, kept_ids)"
            )
        support = SupportSpec(kept_offsets=kept[0], kept_ids=kept[1])
    else:
        support = SupportSpec(
            top_k=section["top_k"], top_p=section["top_p"], min_p=section["min_p"]
        )
    if support.digest != section["sha256"]:
        raise LogprobContractError(
            f"support.sha256={section['sha256']!r}: does not match the given support"
        )
    return support
