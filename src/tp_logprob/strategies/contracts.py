"""Strategies for contracts: shard bounds, active masks, ignore_index and whole contracts.

Every strategy here shrinks toward the plainest case a kernel engineer tries
first: TP=1, the even shard layout, no vocabulary padding, every token active,
``ignore_index=-100``, fp32, role ``infer``, scope ``fixed_topology``.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable
from enum import Enum
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from tp_logprob._validation import check_temperature
from tp_logprob.capability import LogprobBackendCapability, mask_modes_served
from tp_logprob.contract import (
    DeterminismScope,
    LogprobContract,
    LogprobDType,
    LogprobInputKind,
    LogprobRole,
    MaskMode,
    MaskSpec,
    ReductionSpec,
    ShardingSpec,
    SupportMode,
    even_shard_bounds,
)
from tp_logprob.errors import LogprobContractError
from tp_logprob.oracle.formats import FORMATS
from tp_logprob.strategies.supports import supports

__all__ = [
    "temperatures",
    "LAYOUT_KINDS",
    "MASK_KINDS",
    "Bounds",
    "active_masks",
    "contracts",
    "ignore_indices",
    "shard_bounds",
]

Bounds = tuple[tuple[int, int], ...]

LAYOUT_KINDS = ("even", "uneven", "width_one", "padding_only")
"""Shard layouts :func:`shard_bounds` draws, the one it shrinks toward first.

``even``: Megatron's ``ceil(padded / tp)`` split (or the balanced split where that
leaves a rank empty); ``uneven``: random cut points; ``width_one``: at least one
shard of a single column; ``padding_only``: at least one shard holding only
padding columns (needs ``real_vocab_size < padded_vocab_size`` and TP >= 2).
"""

MASK_KINDS = ("no_mask", "all_active", "none_active", "random", "runs")
"""Active masks :func:`active_masks` draws. ``no_mask`` is ``active_mask=None``;
the others are explicit per-token masks; ``runs`` alternates inactive and active
stretches like prompt / response segments. ``no_mask`` and ``all_active`` leave
every token active, so they need only mask mode ``ignore_index``."""

_MASK_KIND_NEEDS = {
    "no_mask": MaskMode.IGNORE_INDEX,
    "all_active": MaskMode.IGNORE_INDEX,
    "none_active": MaskMode.EXPLICIT_ACTIVE_MASK,
    "random": MaskMode.EXPLICIT_ACTIVE_MASK,
    "runs": MaskMode.EXPLICIT_ACTIVE_MASK,
}
"""The mask mode a contract of each mask kind may need (``random`` can leave a token out)."""


def _mask_kinds(needs: Iterable[MaskMode]) -> tuple[str, ...]:
    """The kinds of :data:`MASK_KINDS` whose every mask has a served mask mode, in order."""
    served = frozenset(needs)
    return tuple(kind for kind in MASK_KINDS if _MASK_KIND_NEEDS[kind] in served)


MAX_TP_WORLD_SIZE = 8

E = TypeVar("E", bound=Enum)
T = TypeVar("T")


def _even_layout(padded: int, world: int) -> Bounds:
    try:
        return even_shard_bounds(padded, world)
    except LogprobContractError:
        # ceil-width shards would leave a rank empty: balance widths instead.
        edges = [round(rank * padded / world) for rank in range(world + 1)]
        return tuple(itertools.pairwise(edges))


def _partition(draw: Any, start: int, end: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous non-empty shards of ``[start, end)`` from sorted unique cuts."""
    if parts <= 1:
        return [(start, end)] if parts else []
    inner = range(start + 1, end)
    cuts = draw(
        st.lists(st.sampled_from(inner), min_size=parts - 1, max_size=parts - 1, unique=True)
    )
    edges = [start, *sorted(cuts), end]
    return list(itertools.pairwise(edges))


def _available_layouts(padded: int, world: int, real: int) -> tuple[str, ...]:
    kinds = ["even"]
    if world >= 2:
        kinds += ["uneven", "width_one"]
        if real < padded:
            kinds.append("padding_only")
    return tuple(kinds)


@st.composite
def _layout(draw: Any, padded: int, world: int, real: int, kinds: tuple[str, ...]) -> Bounds:
    kind = draw(st.sampled_from(kinds))
    if kind == "even":
        return _even_layout(padded, world)
    if kind == "uneven":
        return tuple(_partition(draw, 0, padded, world))
    if kind == "width_one":
        rank = draw(st.integers(0, world - 1))
        if rank == 0:
            start = 0
        elif rank == world - 1:
            start = padded - 1
        else:
            start = draw(st.integers(rank, padded - world + rank))
        before = _partition(draw, 0, start, rank)
        after = _partition(draw, start + 1, padded, world - rank - 1)
        return (*before, (start, start + 1), *after)
    # padding_only: a cut at real_vocab_size, then ``pad_shards`` shards of padding alone.
    pad_shards = draw(st.integers(max(1, world - real), min(world - 1, padded - real)))
    live = _partition(draw, 0, real, world - pad_shards)
    return (*live, *_partition(draw, real, padded, pad_shards))


def shard_bounds(
    padded_vocab_size: int,
    tp_world_size: int,
    *,
    real_vocab_size: int | None = None,
    layouts: Iterable[str] | None = None,
) -> st.SearchStrategy[Bounds]:
    """Contiguous ``vocab_shard_bounds`` partitions of ``[0, padded_vocab_size)``.

    Draws the even layout, random uneven cuts, width-1 shards and (when
    ``real_vocab_size < padded_vocab_size``) shards made only of padding; see
    :data:`LAYOUT_KINDS`. Shrinks toward the even layout.

    Example::

        @given(shard_bounds(64, 4, real_vocab_size=50))
        def test_partition(bounds): ...
    """
    padded = _positive("padded_vocab_size", padded_vocab_size)
    world = _positive("tp_world_size", tp_world_size)
    if world > padded:
        raise InvalidArgument(
            f"tp_world_size={world!r}: more ranks than padded_vocab_size={padded!r} columns"
        )
    real = padded if real_vocab_size is None else _positive("real_vocab_size", real_vocab_size)
    if real > padded:
        raise InvalidArgument(f"real_vocab_size={real!r}: must be <= padded_vocab_size={padded!r}")
    kinds = _available_layouts(padded, world, real)
    if layouts is not None:
        wanted = _subset("layouts", layouts, LAYOUT_KINDS)
        kinds = tuple(kind for kind in kinds if kind in wanted) or ("even",)
    return _layout(padded, world, real, kinds)


def _mask_from_runs(first_active: bool, cuts: list[int], num_tokens: int) -> npt.NDArray[np.bool_]:
    mask = np.empty(num_tokens, dtype=np.bool_)
    edges = [0, *sorted(cuts), num_tokens]
    for index, (start, end) in enumerate(itertools.pairwise(edges)):
        mask[start:end] = first_active ^ bool(index % 2)
    return mask


@st.composite
def _mask(draw: Any, num_tokens: int, kinds: tuple[str, ...]) -> npt.NDArray[np.bool_] | None:
    kind = draw(st.sampled_from(kinds))
    if kind == "no_mask":
        return None
    if kind in ("all_active", "none_active"):
        return np.full(num_tokens, kind == "all_active", dtype=np.bool_)
    if kind == "random":
        flags = draw(st.lists(st.booleans(), min_size=num_tokens, max_size=num_tokens))
        return np.array(flags, dtype=np.bool_).reshape(num_tokens)
    first_active = draw(st.booleans())
    cuts = (
        draw(st.lists(st.sampled_from(range(1, num_tokens)), unique=True)) if num_tokens > 1 else []
    )
    return _mask_from_runs(first_active, cuts, num_tokens)


def active_masks(
    num_tokens: int, *, mask_modes: Iterable[MaskMode | str] | None = None
) -> st.SearchStrategy[npt.NDArray[np.bool_] | None]:
    """``active_mask`` values for :class:`~tp_logprob.MaskSpec`: None or a bool array.

    Draws every kind in :data:`MASK_KINDS` that a backend offering ``mask_modes``
    serves: with only ``ignore_index`` or ``all_active``, masks that leave every token active.
    Shrinks toward None.
    """
    n = _non_negative("num_tokens", num_tokens)
    kinds = _mask_kinds(mask_modes_served(_enum_filter("mask_modes", mask_modes, MaskMode)))
    if not kinds:
        raise InvalidArgument(f"mask_modes={mask_modes!r}: leaves no mask kind to draw")
    return _mask(n, kinds)


def ignore_indices(real_vocab_size: int) -> st.SearchStrategy[int]:
    """Valid ``ignore_index`` values: never in ``[0, real_vocab_size)``.

    Negative values (``-100`` first, the shrink target) and ids at or past the
    real vocabulary, which a contract also accepts.
    """
    real = _positive("real_vocab_size", real_vocab_size)
    return st.one_of(
        st.sampled_from([-100, -1, real, 2**31 - 1]),
        st.integers(min_value=-(2**63), max_value=-1),
        st.integers(min_value=real, max_value=2**63 - 1),
    )


@st.composite
def _contract(
    draw: Any,
    worlds: tuple[int, ...],
    roles: tuple[LogprobRole, ...],
    dtypes: tuple[LogprobDType, ...],
    scopes: tuple[DeterminismScope, ...],
    mask_kinds: tuple[str, ...],
    padding: frozenset[bool],
    export_lse: tuple[bool, ...],
    tokens: tuple[int, int],
    vocab: tuple[int, int],
    layouts: tuple[str, ...] | None,
    temperature: st.SearchStrategy[float],
    export_entropy: tuple[bool, ...],
    even_only: bool,
    hidden: tuple[tuple[int, int], tuple[bool, ...]] | None,
    support_modes: tuple[SupportMode, ...],
) -> LogprobContract:
    world = draw(st.sampled_from(worlds))
    low = max(world, vocab[0], 1 + (False not in padding))
    if even_only:
        # Multiples of the TP degree: even_shard_bounds gives every rank a full shard.
        padded = world * draw(st.integers(-(-low // world), vocab[1] // world))
        layouts = ("even",)
    else:
        padded = draw(st.integers(low, vocab[1]))
    # Drawn as the padding width so that real_vocab_size shrinks toward padded_vocab_size.
    pad = draw(st.integers(0 if False in padding else 1, padded - 1 if True in padding else 0))
    real = padded - pad
    bounds = draw(shard_bounds(padded, world, real_vocab_size=real, layouts=layouts))
    num_tokens = draw(st.integers(*tokens))
    mask = draw(_mask(num_tokens, mask_kinds))
    contract = LogprobContract(
        role=draw(st.sampled_from(roles)),
        dtype=draw(st.sampled_from(dtypes)),
        mask=MaskSpec(num_tokens, mask, ignore_index=draw(ignore_indices(real))),
        sharding=ShardingSpec(draw(st.integers(0, world - 1)), world, bounds, real, padded),
        reduction=ReductionSpec(draw(st.sampled_from(scopes))),
        export_lse=draw(st.sampled_from(export_lse)),
        temperature=draw(temperature),
        export_entropy=draw(st.sampled_from(export_entropy)),
        **_hidden_fields(draw, hidden),
    )
    mode = draw(st.sampled_from(support_modes))
    if mode is SupportMode.FULL:
        return contract
    return dataclasses.replace(contract, support=draw(supports(contract, modes=(mode,))))


def _hidden_fields(
    draw: Any, hidden: tuple[tuple[int, int], tuple[bool, ...]] | None
) -> dict[str, Any]:
    """The fused LM-head fields: none for logits input; hidden size and bias for hidden."""
    if hidden is None:
        return {}
    sizes, biases = hidden
    return {
        "input_kind": LogprobInputKind.HIDDEN,
        "hidden_size": draw(st.integers(*sizes)),
        "has_bias": draw(st.sampled_from(biases)),
    }


_FP32_TINIEST_NORMAL = FORMATS["fp32"].smallest_normal
_FP32_LARGEST = FORMATS["fp32"].max


def temperatures() -> st.SearchStrategy[float]:
    """Valid sampling temperatures, shrinking toward 1.0.

    Draws rollout-engine values (0.6, 0.7, ...), exact powers of two, and the
    extremes: ``T`` so tiny that ``z = x / T`` overflows to ``+-inf`` and so huge
    that ``z`` underflows to 0 or a subnormal. Every value is finite and ``> 0``
    in fp32, as the contract requires.

    >>> from hypothesis import find
    >>> find(temperatures(), lambda t: True)
    1.0
    """
    return st.one_of(
        st.just(1.0),
        st.sampled_from([0.6, 0.7, 0.8, 0.9, 1.2, 1.5]),
        st.integers(-20, 20).map(lambda k: 2.0**k),
        st.sampled_from([_FP32_TINIEST_NORMAL, 1e-30, 1e-20, 1e20, 1e30, _FP32_LARGEST]),
        st.floats(min_value=_FP32_TINIEST_NORMAL, max_value=_FP32_LARGEST, allow_subnormal=False),
    )


def contracts(
    *,
    capability: LogprobBackendCapability | None = None,
    roles: Iterable[LogprobRole | str] | None = None,
    dtypes: Iterable[LogprobDType | str] | None = None,
    tp_world_sizes: Iterable[int] | None = None,
    determinism_scopes: Iterable[DeterminismScope | str] | None = None,
    mask_modes: Iterable[MaskMode | str] | None = None,
    padding: bool | None = None,
    export_lse: bool | None = None,
    temperature: float | st.SearchStrategy[float] | None = None,
    export_entropy: bool | None = None,
    layouts: Iterable[str] | None = None,
    min_num_tokens: int = 1,
    max_num_tokens: int = 8,
    min_padded_vocab_size: int = 1,
    max_padded_vocab_size: int = 64,
    input_kind: LogprobInputKind | str = LogprobInputKind.LOGITS,
    min_hidden_size: int = 1,
    max_hidden_size: int = 24,
    has_bias: bool | None = None,
    support_modes: Iterable[SupportMode | str] | None = None,
) -> st.SearchStrategy[LogprobContract]:
    """Valid :class:`~tp_logprob.LogprobContract` values (as seen by a random rank).

    Every keyword narrows what is drawn; ``capability=cap`` keeps exactly the
    contracts ``cap`` claims to serve (as ``cap.serves`` answers, from the rules
    dispatch runs), so a backend tested on them is tested on every kind of contract
    it claims. ``padding=True`` forces
    ``real_vocab_size < padded_vocab_size``, ``False`` forbids it, None draws both.
    ``temperature`` is a fixed value or a strategy (default :func:`temperatures`;
    1.0 only for a capability without ``supports_temperature``), and
    ``export_entropy`` None draws both (False only without ``exports_entropy``).
    TP degrees are 1..8 unless ``tp_world_sizes`` says otherwise; shapes stay
    small by default (raise ``max_num_tokens`` / ``max_padded_vocab_size``).
    ``input_kind="hidden"`` draws fused LM-head contracts: ``hidden_size`` in
    ``[min_hidden_size, max_hidden_size]`` and ``has_bias`` (None draws both);
    ``allow_tf32`` stays False. A capability whose ``input_kinds`` lacks the
    requested kind serves none of these contracts (InvalidArgument).
    ``support_modes`` draws sampling supports (``docs/semantics.md``, "Processed
    logprobs"; see :func:`~tp_logprob.strategies.supports`): they change what every
    output means, so they are drawn only when asked for, and None draws ``full``
    only (the modes the capability serves, if it serves no ``full``).

    Example::

        @given(contracts(dtypes={"bf16"}, tp_world_sizes={2, 4}, padding=True))
        def test_my_kernel(contract): ...
    """
    token_range = (
        _non_negative("min_num_tokens", min_num_tokens),
        _non_negative("max_num_tokens", max_num_tokens),
    )
    vocab_range = (
        _positive("min_padded_vocab_size", min_padded_vocab_size),
        _positive("max_padded_vocab_size", max_padded_vocab_size),
    )
    for name, (low, high) in (("num_tokens", token_range), ("padded_vocab_size", vocab_range)):
        if low > high:
            raise InvalidArgument(f"min_{name}={low!r}: must be <= max_{name}={high!r}")
    role_set = _enum_filter("roles", roles, LogprobRole)
    dtype_set = _enum_filter("dtypes", dtypes, LogprobDType)
    scope_set = _enum_filter("determinism_scopes", determinism_scopes, DeterminismScope)
    need_set = set(mask_modes_served(_enum_filter("mask_modes", mask_modes, MaskMode)))
    world_set = _world_filter(tp_world_sizes)
    padding_set = {True, False} if padding is None else {bool(padding)}
    export_set = {True, False} if export_lse is None else {bool(export_lse)}
    entropy_set = {True, False} if export_entropy is None else {bool(export_entropy)}
    fixed_temperature = None
    if temperature is None:
        temperature = temperatures()
    elif not isinstance(temperature, st.SearchStrategy):
        try:
            fixed_temperature = check_temperature(temperature)
        except LogprobContractError as error:
            raise InvalidArgument(str(error)) from None
        temperature = st.just(fixed_temperature)
    kind = _input_kind(input_kind)
    asked_supports = support_modes is not None
    support_set = _enum_filter("support_modes", support_modes, SupportMode)
    if not asked_supports:
        support_set = {SupportMode.FULL}
    hidden = None
    if kind is LogprobInputKind.HIDDEN:
        sizes = (
            _positive("min_hidden_size", min_hidden_size),
            _positive("max_hidden_size", max_hidden_size),
        )
        if sizes[0] > sizes[1]:
            raise InvalidArgument(
                f"min_hidden_size={sizes[0]!r}: must be <= max_hidden_size={sizes[1]!r}"
            )
        biases: tuple[bool, ...] = (False, True) if has_bias is None else (bool(has_bias),)
        hidden = (sizes, biases)
    elif has_bias is not None:
        raise InvalidArgument(f"has_bias={has_bias!r}: only meaningful with input_kind='hidden'")
    even_only = False
    if capability is not None:
        if not isinstance(capability, LogprobBackendCapability):
            raise InvalidArgument(f"capability={capability!r}: expected a LogprobBackendCapability")
        # Every narrowing below asks the rules dispatch runs (tp_logprob.capability's
        # CAPABILITY_RULES), so what is drawn is exactly what the backend may be sent.
        if not capability.serves("input_kind", kind):
            offered = ", ".join(_values(capability, "input_kind"))
            raise InvalidArgument(
                f"input_kind={kind.value!r}: capability={capability.backend_id!r} takes "
                f"{offered} input only"
            )
        if not capability.serves("cp_world_size", 1):
            raise InvalidArgument(
                f"capability={capability.backend_id!r}: serves no cp_world_size=1 contract, "
                "the only context-parallel size drawn"
            )
        role_set = _served(capability, "role", role_set)
        dtype_set = _served(capability, "dtype", dtype_set)
        scope_set = _served(capability, "determinism_scope", scope_set)
        if determinism_scopes is None and scope_set != {DeterminismScope.RUN_TO_RUN}:
            # The same code serves a run_to_run request: draw it only where nothing stronger is.
            scope_set.discard(DeterminismScope.RUN_TO_RUN)
        need_set = _served(capability, "mask_mode", need_set)
        if not asked_supports and not capability.serves("support_mode", SupportMode.FULL):
            support_set = set(SupportMode)
        support_set = _served(capability, "support_mode", support_set)
        world_set = _served(capability, "tp_world_size", world_set)
        padding_set = _served(capability, "vocab_padding", padding_set)
        export_set = _served(capability, "export_lse", export_set)
        entropy_set = _served(capability, "export_entropy", entropy_set)
        if hidden is not None:
            biases = tuple(b for b in hidden[1] if capability.serves("has_bias", b))
            if not biases:
                raise _refused(capability, "has_bias", True)
            hidden = (hidden[0], biases)
        served_temperatures = capability.served_values("temperature")
        if served_temperatures is not None:
            if fixed_temperature is not None and fixed_temperature not in served_temperatures:
                raise _refused(capability, "temperature", fixed_temperature)
            temperature = st.sampled_from(sorted(served_temperatures))
        even_only = not capability.serves("even_layout", False)
        if even_only and layouts is not None and "even" not in layouts:
            raise InvalidArgument(
                f"layouts={layouts!r}: capability={capability.backend_id!r} serves even shards only"
            )
    world_set = {world for world in world_set if world <= vocab_range[1]}
    if even_only:  # padded must be a multiple of the TP degree within the vocabulary range
        least = max(vocab_range[0], 1 + (False not in padding_set))
        world_set = {w for w in world_set if -(-max(w, least) // w) <= vocab_range[1] // w}
    if True in padding_set and vocab_range[1] < 2:
        padding_set.discard(True)
    for name, chosen in (
        ("roles", role_set),
        ("dtypes", dtype_set),
        ("determinism_scopes", scope_set),
        ("mask_modes", need_set),
        ("tp_world_sizes", world_set),
        ("padding", padding_set),
        ("export_lse", export_set),
        ("export_entropy", entropy_set),
        ("support_modes", support_set),
    ):
        if not chosen:
            raise InvalidArgument(
                f"contracts(...): the filters leave no {name} to draw (capability="
                f"{getattr(capability, 'backend_id', None)!r}, max_padded_vocab_size="
                f"{vocab_range[1]!r})"
            )
    if layouts is not None:
        layouts = tuple(_subset("layouts", layouts, LAYOUT_KINDS))
    return _contract(
        worlds=tuple(sorted(world_set)),
        roles=_ordered(role_set, LogprobRole.INFER),
        dtypes=_ordered(dtype_set, LogprobDType.FP32),
        scopes=_ordered(scope_set, DeterminismScope.FIXED_TOPOLOGY),
        mask_kinds=_mask_kinds(need_set),
        padding=frozenset(padding_set),
        export_lse=tuple(sorted(export_set, reverse=True)),
        tokens=token_range,
        vocab=vocab_range,
        layouts=layouts,
        temperature=temperature,
        export_entropy=tuple(sorted(entropy_set)),
        even_only=even_only,
        hidden=hidden,
        support_modes=_ordered(support_set, SupportMode.FULL),
    )


def _served(capability: LogprobBackendCapability, dimension: str, wanted: set[T]) -> set[T]:
    """The ``wanted`` values of ``dimension`` that ``capability`` serves."""
    return {value for value in wanted if capability.serves(dimension, value)}


def _values(capability: LogprobBackendCapability, dimension: str) -> list[str]:
    served = capability.served_values(dimension) or ()
    return sorted(str(getattr(value, "value", value)) for value in served)


def _refused(
    capability: LogprobBackendCapability, dimension: str, value: object
) -> InvalidArgument:
    return InvalidArgument(
        f"{dimension}={value!r}: capability={capability.backend_id!r} serves {dimension} "
        f"{', '.join(_values(capability, dimension))} only"
    )


def _input_kind(value: object) -> LogprobInputKind:
    try:
        return LogprobInputKind(value)
    except ValueError:
        known = ", ".join(repr(k.value) for k in LogprobInputKind)
        raise InvalidArgument(f"input_kind={value!r}: expected one of {known}") from None


def _ordered(members: set[E], first: E) -> tuple[E, ...]:
    """Members in a stable order with the shrink target first."""
    rest = sorted((m for m in members if m != first), key=lambda m: str(m.value))
    return ((first,) if first in members else ()) + tuple(rest)


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidArgument(f"{name}={value!r}: expected an int >= 1")
    return int(value)


def _non_negative(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise InvalidArgument(f"{name}={value!r}: expected an int >= 0")
    return int(value)


def _enum_filter(name: str, values: Iterable[Any] | None, enum: type[E]) -> set[E]:
    if values is None:
        return set(enum)
    if isinstance(values, (str, bytes)):
        raise InvalidArgument(f"{name}={values!r}: expected a collection, e.g. {{{values!r}}}")
    members: set[E] = set()
    for value in values:
        try:
            members.add(enum(value))
        except ValueError:
            choices = ", ".join(repr(m.value) for m in enum)
            raise InvalidArgument(f"{name}: {value!r} is not one of {choices}") from None
    if not members:
        raise InvalidArgument(f"{name}={values!r}: must not be empty (use None for any)")
    return members


def _world_filter(values: Iterable[int] | None) -> set[int]:
    if values is None:
        return set(range(1, MAX_TP_WORLD_SIZE + 1))
    if isinstance(values, (str, bytes)):
        raise InvalidArgument(f"tp_world_sizes={values!r}: expected a collection of ints")
    worlds = {_positive("tp_world_sizes item", value) for value in values}
    if not worlds:
        raise InvalidArgument(f"tp_world_sizes={values!r}: must not be empty (use None for any)")
    return worlds


def _subset(name: str, values: Iterable[str], allowed: tuple[str, ...]) -> set[str]:
    if isinstance(values, (str, bytes)):
        raise InvalidArgument(f"{name}={values!r}: expected a collection, e.g. {{{values!r}}}")
    chosen = set(values)
    unknown = chosen - set(allowed)
    if unknown or not chosen:
        raise InvalidArgument(f"{name}={values!r}: expected a non-empty subset of {allowed}")
    return chosen
