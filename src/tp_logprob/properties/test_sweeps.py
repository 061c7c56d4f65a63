"""Fixed sweeps that complement the drawn properties where random draws rarely bite.

Small drawn cases seldom put two summation orders on opposite sides of a rounding:
a reverse-order merge or an N-dependent tiling then survives most seeds. These
sweeps use wide random rows (64 x 64, where reordering a sum changes its bits in
a large share of rows) and compare every layout and batch shape bitwise. Where the
backend claims them, the sweeps request entropy and (except the TP=1 batch sweep)
temperature 0.7, so both ride along in every bit comparison.

On a real process group of N ranks, the layouts of N ranks run on the group and the
others on the emulated group; the uneven layout the batch and special-row sweeps
use is then one of N ranks (:func:`group_layout`), added to the layouts if none
of them has N ranks.
"""

from __future__ import annotations

import itertools

import numpy as np

from tp_logprob.capability import LogprobBackendCapability
from tp_logprob.contract import (
    DeterminismScope,
    LogprobContract,
    LogprobDType,
    LogprobRole,
    MaskMode,
    MaskSpec,
    ReductionSpec,
    ShardingSpec,
    even_shard_bounds,
)
from tp_logprob.judging.expected import exact_outputs
from tp_logprob.judging.measuring import expect_bitwise, expect_close
from tp_logprob.real_group.group import Launch, launched_by_torchrun
from tp_logprob.strategies import LogprobCase, round_to_dtype
from tp_logprob.suite.applicability import CROSS_TP_BITWISE, LOGITS_INPUT, applies_to
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.outcomes import NotApplicable
from tp_logprob.suite.running import execute, select_rows
from tp_logprob.suite.variants import variants

ROWS = 64
SWEEP_TEMPERATURE = 0.7
PADDED = 64
REAL = 61
LAYOUTS = {
    "tp1": ((0, 64),),
    "tp2-even": even_shard_bounds(64, 2),
    "tp3-uneven": ((0, 21), (21, 22), (22, 64)),
    "tp4-width1": ((0, 1), (1, 30), (30, 61), (61, 64)),
    "tp8-even": even_shard_bounds(64, 8),
    "tp8-mixed": ((0, 1), (1, 2), (2, 9), (9, 30), (30, 31), (31, 50), (50, 61), (61, 64)),
}


def group_layout() -> tuple[str, tuple[tuple[int, int], ...]] | None:
    """The uneven layout a real process group of N ranks runs, and its name: one of
    :data:`LAYOUTS` with N uneven shards, else ``tpN-uneven``; None off a real group.

    Read from torchrun's variables: the parametrization below is fixed at import, and the
    session joins the group of that size before it collects."""
    if not launched_by_torchrun():
        return None
    world = Launch.from_environ().world_size
    for name, bounds in LAYOUTS.items():
        if len(bounds) == world and not name.endswith("-even"):
            return name, bounds
    edges = [0, *((PADDED * rank) // world - rank % 2 for rank in range(1, world)), PADDED]
    return f"tp{world}-uneven", tuple(itertools.pairwise(edges))


def _layouts() -> dict[str, tuple[tuple[int, int], ...]]:
    """Every layout the sweeps run: :data:`LAYOUTS`, and the real group's."""
    found = group_layout()
    return LAYOUTS if found is None else {**LAYOUTS, found[0]: found[1]}


UNEVEN = (group_layout() or ("tp3-uneven", LAYOUTS["tp3-uneven"]))[0]
"""The uneven layout of the batch and special-row sweeps (the real group's, on one)."""


def _contract(
    capability: LogprobBackendCapability,
    bounds: tuple[tuple[int, int], ...],
    scope: DeterminismScope,
    num_tokens: int = ROWS,
    temperature: float = SWEEP_TEMPERATURE,
) -> LogprobContract:
    """A contract of ``bounds`` that ``capability`` claims, or skip the test."""
    role = LogprobRole.INFER if capability.serves("role", LogprobRole.INFER) else LogprobRole.TRAIN
    dtypes = capability.served_values("dtype") or frozenset(LogprobDType)
    dtype = LogprobDType.FP32 if LogprobDType.FP32 in dtypes else min(dtypes)
    mask = (
        None
        if capability.mask_modes - {MaskMode.EXPLICIT_ACTIVE_MASK}
        else np.ones(num_tokens, bool)
    )
    real = REAL if capability.serves("vocab_padding", True) else PADDED
    contract = LogprobContract(
        role=role,
        dtype=dtype,
        mask=MaskSpec(num_tokens, mask),
        sharding=ShardingSpec(0, len(bounds), bounds, real, PADDED),
        reduction=ReductionSpec(scope),
        export_lse=capability.serves("export_lse", True),
        temperature=temperature if capability.serves("temperature", temperature) else 1.0,
        export_entropy=capability.serves("export_entropy", True),
    )
    reasons = capability.incompatibilities(contract)
    if reasons:
        raise NotApplicable(
            f"{capability.backend_id} does not claim this sweep's contract: {reasons[0]}"
        )
    return contract


def _case(contract: LogprobContract, seed: int = 0) -> LogprobCase:
    rng = np.random.default_rng(seed)
    logits = round_to_dtype(rng.normal(0.0, 3.0, (contract.num_tokens, PADDED)), contract.dtype)
    targets = rng.integers(0, contract.sharding.real_vocab_size, contract.num_tokens)
    return LogprobCase(contract, logits.astype(np.float32), targets)


@applies_to(LOGITS_INPUT, CROSS_TP_BITWISE)
def test_cross_tp_bitwise_sweep(tp_logprob_backend: BackendUnderTest) -> None:
    """A cross_tp_bitwise claim: the same bits at TP 1, 2, 3, 4, 8, even and uneven."""
    backend = tp_logprob_backend
    scope = DeterminismScope.CROSS_TP_BITWISE
    first = _case(_contract(backend.capability, LAYOUTS["tp1"], scope))
    baseline = execute(backend, first)
    for name, bounds in _layouts().items():
        case = first.replace(contract=_contract(backend.capability, bounds, scope))
        expect_bitwise(
            f"cross-TP bitwise sweep: {name} differs from tp1",
            case,
            backend.backend_id,
            baseline,
            execute(backend, case),
            labels=("tp1", name),
        )


@applies_to(LOGITS_INPUT)
@variants("layout", ["tp1", UNEVEN])
def test_batch_invariance_sweep(tp_logprob_backend: BackendUnderTest, layout: str) -> None:
    """Each row alone, and in batches of 2, 5 and 64, gives the same bits."""
    backend = tp_logprob_backend
    scope = DeterminismScope.FIXED_TOPOLOGY
    temperature = 1.0 if layout == "tp1" else SWEEP_TEMPERATURE
    bounds = _layouts()[layout]
    full = _case(_contract(backend.capability, bounds, scope, ROWS, temperature), seed=1)
    whole = execute(backend, full)
    for size in (1, 2, 5):
        for start in range(0, ROWS, 13):
            rows = np.arange(start, min(start + size, ROWS))
            contract = _contract(backend.capability, bounds, scope, len(rows), temperature)
            part = LogprobCase(contract, full.logits[rows], full.targets[rows])
            observed = execute(backend, part)
            expected = select_rows(whole, rows)
            expect_bitwise(
                f"batch invariance sweep: rows {rows.tolist()} alone vs in the batch of {ROWS}",
                part,
                backend.backend_id,
                expected,
                observed,
                labels=(f"in batch of {ROWS}", f"in batch of {len(rows)}"),
            )


@applies_to(LOGITS_INPUT)
def test_special_rows_with_lse(tp_logprob_backend: BackendUnderTest) -> None:
    """NaN, +inf and all -inf rows with the LSE exported, against the oracle, at TP 3 (or
    the real group's uneven layout)."""
    backend = tp_logprob_backend
    inf, nan = float("inf"), float("nan")
    bounds = _layouts()[UNEVEN]
    contract = _contract(backend.capability, bounds, DeterminismScope.RUN_TO_RUN, 4)
    base = _case(contract, seed=2)
    logits = np.array(base.logits)
    logits[0, 40] = inf  # +inf in a live column of the last rank (at TP 3)
    logits[1, 3] = nan  # NaN on the first rank
    logits[2, :] = -inf  # no finite live value
    logits[3, 21] = inf  # +inf in the width-1 shard (at TP 3)
    case = base.replace(logits=logits)
    selected, lse = exact_outputs(case)
    expect_close(
        "special rows sweep: NaN/inf pattern differs from the oracle",
        case,
        backend.backend_id,
        execute(backend, case),
        selected,
        lse,
    )
