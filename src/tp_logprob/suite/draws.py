"""What the properties draw for a backend: cases from the contracts it claims.

A property test declares what it needs of a backend
(:mod:`tp_logprob.suite.applicability`) and is not collected for one that does
not claim it; a draw that still finds no contract (filters narrower than that, or no
contract of a real group's TP degree) raises
:class:`~tp_logprob.suite.outcomes.NotApplicable` with the reason (the plugin's skip),
never fails. On a real
process group of N ranks the contracts drawn are those of TP degree N
(:func:`drawing_capability`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from tp_logprob.capability import LogprobBackendCapability
from tp_logprob.contract import DeterminismScope, LogprobInputKind, ShardingSpec
from tp_logprob.strategies import (
    HiddenCase,
    LogprobCase,
    cases,
    contracts,
    hidden_cases,
    shard_bounds,
)
from tp_logprob.strategies.engine_batches import engine_batches
from tp_logprob.strategies.input_forms import InputForm, input_forms
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.outcomes import NotApplicable
from tp_logprob.suite.session import Suite
from tp_logprob.support import SupportMode

__all__ = [
    "INTERPRETED",
    "INTERPRETED_LONG_BATCH_ROWS",
    "INTERPRETED_LONG_BATCH_VOCAB",
    "LONG_BATCH_ROWS",
    "batch_rows",
    "cases_for",
    "claims_batch_invariance",
    "draw_case",
    "draw_form",
    "draw_fused_case",
    "draw_positions",
    "BATCH_KINDS",
    "draw_processed_case",
    "drawing_capability",
    "interpreted",
    "long_lengths",
    "max_batch_rows",
    "max_batch_vocab",
    "position_lengths",
    "relayouts",
    "support_modes_served",
]


def drawing_capability(backend: BackendUnderTest) -> LogprobBackendCapability:
    """What the properties draw ``backend``'s contracts from: its capability, and on a real
    process group of N ranks that capability at TP degree N only (every strategy that
    takes a capability then draws for the group); not applicable if it serves no TP N."""
    group = backend.group
    capability: LogprobBackendCapability = backend.capability
    if group is None:
        return capability
    world = group.world_size
    if not capability.serves("tp_world_size", world):
        raise NotApplicable(
            f"{backend.backend_id} serves no tp_world_size={world} contract: nothing of it "
            f"runs on this {world}-rank group"
        )
    return dataclasses.replace(capability, tp_world_sizes=frozenset({world}))


def cases_for(backend: BackendUnderTest, **filters: Any) -> st.SearchStrategy[LogprobCase]:
    """Cases from the contracts ``backend`` claims; not applicable if it claims none such."""
    special_values = filters.pop("special_values", False)
    logit_kinds = filters.pop("logit_kinds", None)
    support_rules = filters.pop("support_rules", None)
    try:
        contract_strategy = contracts(capability=drawing_capability(backend), **filters)
    except InvalidArgument as error:
        raise NotApplicable(
            f"{backend.backend_id} claims no contract of this kind: {error}"
        ) from None
    return cases(
        contract_strategy,
        special_values=special_values,
        logit_kinds=logit_kinds,
        support_rules=support_rules,
    )


def draw_case(data: Any, backend: BackendUnderTest, suite: Suite, **filters: Any) -> LogprobCase:
    """Draw one case for ``backend`` (labelled ``case``), laid out in a drawn form
    (:func:`draw_form`), and count the example."""
    case: LogprobCase = data.draw(cases_for(backend, **filters), label="case")
    suite.stats.example(backend.backend_id)
    return draw_form(data, case)


_Case = TypeVar("_Case", bound=LogprobCase)


def draw_form(data: Any, case: _Case) -> _Case:
    """``case`` with the layout its tensors reach the op in
    (:func:`~tp_logprob.strategies.input_forms.input_forms`, labelled ``input form``): each
    tensor contiguous, or a strided or offset view as trainers pass."""
    fused = isinstance(case, HiddenCase)
    form: InputForm = data.draw(input_forms(fused=fused), label="input form")
    return dataclasses.replace(case, form=form)


def draw_fused_case(
    data: Any, backend: BackendUnderTest, suite: Suite, **filters: Any
) -> HiddenCase:
    """A fused case from the contracts ``backend`` claims; not applicable to backends
    that take logits."""
    try:
        strategy = hidden_cases(capability=drawing_capability(backend), **filters)
    except InvalidArgument as error:
        raise NotApplicable(
            f"{backend.backend_id} claims no fused LM-head contract: {error}"
        ) from None
    case: HiddenCase = data.draw(strategy, label="case")
    suite.stats.example(backend.backend_id)
    return draw_form(data, case)


SAMPLING_SUPPORTS = (SupportMode.SAMPLING_PARAMS, SupportMode.REPLAYED_MASK)


def support_modes_served(backend: BackendUnderTest) -> list[SupportMode]:
    """The sampling supports ``backend`` claims (``full`` aside), in a stable order."""
    return [mode for mode in SAMPLING_SUPPORTS if backend.capability.serves("support_mode", mode)]


BATCH_KINDS = ("one set per batch", "engine batch", "engine batch")
"""How a processed case is batched, for a backend that serves per-row parameters:
one temperature and one set of rules for the batch, or an engine batch of requests with
their own (twice as often; it shrinks to one set per batch)."""


def draw_processed_case(
    data: Any,
    backend: BackendUnderTest,
    suite: Suite,
    *,
    modes: Any = SAMPLING_SUPPORTS,
    **filters: Any,
) -> LogprobCase:
    """A case with a sampling support (one of ``modes`` the backend claims), drawn as
    :func:`draw_case` or :func:`draw_fused_case` for what the backend takes; not
    applicable to a backend that claims none of ``modes``. For a backend that serves
    per-row parameters, two cases in three (:data:`BATCH_KINDS`), logits or fused,
    become heterogeneous engine batches
    (:func:`~tp_logprob.strategies.engine_batches.engine_batches`). A fused case with a
    recomputed support has small-integer operands (exact products: the backend's ``x``
    is the oracle's)."""
    served = [mode for mode in support_modes_served(backend) if mode in modes]
    if not served:
        claimed = sorted(mode.value for mode in backend.capability.support_modes)
        wanted = ", ".join(SupportMode(mode).value for mode in modes)
        raise NotApplicable(
            f"{backend.backend_id} serves no sampling support this property needs ({wanted}); "
            f"support_modes {claimed}"
        )
    mode = data.draw(st.sampled_from(served), label="support mode")
    if backend.capability.serves("input_kind", LogprobInputKind.LOGITS):
        case = draw_case(data, backend, suite, support_modes={mode}, **filters)
    else:
        filters.pop("special_values", None)
        exact = mode is SupportMode.SAMPLING_PARAMS
        case = draw_fused_case(
            data, backend, suite, support_modes={mode}, small_integers=exact, **filters
        )
    if backend.capability.serves("heterogeneous", True):
        batch = data.draw(st.sampled_from(BATCH_KINDS), label="batch kind")
        if batch == "engine batch":
            case = data.draw(engine_batches(case), label="engine batch")
    return case


def claims_batch_invariance(backend: BackendUnderTest) -> bool:
    """Whether ``backend`` claims a scope with batch invariance (more than run-to-run bits)."""
    return bool(backend.capability.serves("determinism_scope", DeterminismScope.FIXED_TOPOLOGY))


def batch_rows(num_tokens: int) -> st.SearchStrategy[np.ndarray]:
    """Rows of a case, in any order, repeats allowed: a second batch for batch invariance."""
    return st.lists(st.sampled_from(range(num_tokens)), min_size=1, max_size=2 * num_tokens).map(
        lambda rows: np.array(rows, dtype=np.int64)
    )


@st.composite
def relayouts(draw: Any, sharding: ShardingSpec, capability: Any) -> dict[str, Any]:
    """Another layout of ``sharding``'s vocabulary that ``capability`` serves: the
    ``tp_rank`` and ``vocab_shard_bounds`` params of a TP-consistency property."""
    padded = sharding.padded_vocab_size
    worlds = [w for w in range(1, 9) if w <= padded]
    worlds = [w for w in worlds if capability.serves("tp_world_size", w)]
    uneven = capability.serves("even_layout", False)
    if not uneven:
        worlds = [w for w in worlds if padded % w == 0]  # equal shards only
    world = draw(st.sampled_from(worlds))
    layouts = None if uneven else {"even"}
    bounds = draw(
        shard_bounds(padded, world, real_vocab_size=sharding.real_vocab_size, layouts=layouts)
    )
    return {
        "tp_rank": draw(st.integers(0, world - 1)),
        "vocab_shard_bounds": [list(pair) for pair in bounds],
    }


INTERPRETED = frozenset(
    {
        "triton_online",
        "triton_exact_sum",
        "triton_fused",
        "triton_fused_exact_sum",
        "triton_portable",
    }
)
"""The built-in backends that a CPU runs through the Triton interpreter, at about 10 ms a
program: the properties that draw long batches or wide rows keep them shorter there."""

LONG_BATCH_ROWS = 700
"""Most rows a long batch draws: past the 64- to 256-row tiles and chunks of real kernels."""

INTERPRETED_LONG_BATCH_ROWS = 100
"""Most rows for an interpreted backend: still past the 64-row boundary."""

INTERPRETED_LONG_BATCH_VOCAB = 32
"""Most columns of an interpreted backend's long batch: two of the CPU launch table's tiles."""


def interpreted(backend: BackendUnderTest) -> bool:
    """Whether ``backend`` is a built-in Triton backend run by the interpreter here."""
    return bool(backend.platform == "cpu" and backend.backend_id in INTERPRETED)


def max_batch_rows(backend: BackendUnderTest) -> int:
    """The most rows a long batch for ``backend`` draws."""
    return INTERPRETED_LONG_BATCH_ROWS if interpreted(backend) else LONG_BATCH_ROWS


def max_batch_vocab(backend: BackendUnderTest, default: int) -> int:
    """The widest vocabulary a long batch for ``backend`` draws."""
    return min(default, INTERPRETED_LONG_BATCH_VOCAB) if interpreted(backend) else default


_BOUNDARIES = (64, 128, 256, 512)


def long_lengths(max_rows: int) -> st.SearchStrategy[int]:
    """Batch lengths past the first 64 rows and never a multiple of 64: a row just past a
    tile boundary (65, 129, ...), one just short of it, or any length up to ``max_rows``."""
    near = sorted(
        {edge + offset for edge in _BOUNDARIES for offset in (-1, 1) if edge + offset > 64}
    )
    choices = [n for n in near if n <= max_rows]
    anywhere = st.integers(65, max(65, max_rows)).filter(lambda n: n % 64 != 0)
    return st.one_of(st.sampled_from(choices), anywhere) if choices else anywhere


def position_lengths(max_rows: int) -> st.SearchStrategy[int]:
    """Batch lengths for the row-position property: tiny ones (register blocks of 2-8 rows),
    and ones that end just past or inside the 16-, 64- and 128-row tiles."""
    lengths = [n for n in (2, 3, 5, 8, 9, 17, 33, 63, 65, 129, 257) if n <= max_rows]
    return st.sampled_from(lengths)


def draw_positions(data: Any, case: LogprobCase, backend: BackendUnderTest) -> dict[str, Any]:
    """The ``row`` and ``length`` params of the row-position property."""
    rows = case.contract.num_tokens
    return {
        "row": data.draw(st.integers(0, rows - 1), label="row placed at many positions"),
        "length": data.draw(position_lengths(max_batch_rows(backend)), label="batch length"),
    }
