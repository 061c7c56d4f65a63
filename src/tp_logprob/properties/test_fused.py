"""The fused LM head (``input_kind="hidden"``): every backend that takes hidden states.

Cases come from :func:`~tp_logprob.strategies.hidden_cases`: small hidden sizes,
dot products that cancel, huge and tiny magnitudes, garbage in the weight's
padding rows, bias, NaN hidden rows that are inactive, uneven and padding-only
shards at TP 1-8. The oracle, determinism and TP-consistency checks are the
logits path's, with room for the backend's own fp32 dot products
(``docs/tolerances.md``, "Fused LM head"); the rest are the fused path's own.
Backends that take only logits are not collected for this module, nor hidden-only
backends for the logits-path modules (:mod:`tp_logprob.suite.applicability`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
from hypothesis import given
from hypothesis import strategies as st

from tp_logprob.judging.expected import exact_entropy_of, exact_outputs
from tp_logprob.judging.fused import fused_only, logits_contract
from tp_logprob.judging.measuring import (
    allowed_error,
    entropy_error,
    expect_bitwise,
    expect_close,
)
from tp_logprob.judging.violation import PropertyInputError, violation
from tp_logprob.properties.test_determinism import (
    batch_invariance,
    row_positions,
    run_to_run,
    tp_consistency,
)
from tp_logprob.properties.test_oracle import oracle
from tp_logprob.registry import registry
from tp_logprob.strategies import LogprobCase, round_to_dtype
from tp_logprob.suite.applicability import (
    BATCH_INVARIANT,
    HIDDEN_INPUT,
    SEVERAL_LAYOUTS,
    TRAIN_ROLE,
    VOCAB_PADDING,
    applies_to,
)
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.case_kinds import (
    check_across_layouts,
    check_run_to_run_and_batch_invariance,
)
from tp_logprob.suite.draws import (
    claims_batch_invariance,
    draw_fused_case,
    draw_positions,
)
from tp_logprob.suite.expect import expect_fused_gradients
from tp_logprob.suite.profiles import scaled
from tp_logprob.suite.property import suite_property
from tp_logprob.suite.running import (
    execute,
    outputs_of,
    run_hidden,
    select_rows,
    sub_batch,
)
from tp_logprob.suite.session import Suite
from tp_logprob.suite.summary import SuiteStats

Floats = npt.NDArray[np.float64]


@applies_to(HIDDEN_INPUT)
@given(data=st.data())
def test_fused_matches_exact_oracle(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """selected_logp, lse and entropy within the tolerance table plus the dot-product room
    of the exact values on ``fp32(hidden @ W.T + b)``."""
    backend = tp_logprob_backend
    case = draw_fused_case(data, backend, tp_logprob_suite)
    oracle.run(backend, case, stats=tp_logprob_suite.stats)


@suite_property("fused_exact_products")
def fused_exact_products(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """Operands whose fp32 dot products are exact (small integers): the fused backend must
    be as accurate as a logits backend on ``x``, with no dot-product room, and agree with
    torch_native run on those logits within both tolerances."""
    case = fused_only(case)
    dot = case.dot_bound
    exact_x = case.exact_logits
    if not np.array_equal(exact_x, exact_x.astype(np.float32), equal_nan=True) or (
        np.isfinite(dot).all() and float(np.max(np.abs(exact_x), initial=0.0)) >= 2.0**24
    ):
        raise PropertyInputError(
            "the case's dot products are not exact in fp32 (not small integers)"
        )
    fused = execute(backend, case)
    selected, lse = exact_outputs(case)
    expect_close(
        "fused exact dot products: outside the logits path's tolerance of the oracle",
        case,
        backend.backend_id,
        fused,
        selected,
        lse,
        stats=stats,
    )
    plain = LogprobCase(logits_contract(case.contract), case.logits, case.targets)
    capability = next(c for c in registry.backends("cpu") if c.backend_id == "torch_native")
    native = BackendUnderTest("torch_native", capability, registry, "cpu")
    logits_path = execute(native, plain)
    selected_room, lse_room = allowed_error(plain, selected, lse)
    expect_close(
        "fused exact dot products: the fused path and the logits path (torch_native) disagree",
        case,
        backend.backend_id,
        fused,
        logits_path.selected,
        lse if logits_path.lse is None else logits_path.lse,
        expected_name="torch_native on fp32(x)",
        extra_selected=selected_room,
        extra_lse=lse_room,
        expected_entropy=logits_path.entropy,
        extra_entropy=2.0 * _entropy_room(case),
        count_ulps=False,
        inactive_zero=False,
    )


def _entropy_room(case: LogprobCase) -> Floats:
    _, lse = exact_outputs(case)
    return entropy_error(case, exact_entropy_of(case), lse)


@applies_to(HIDDEN_INPUT)
@scaled(0.5)
@given(data=st.data())
def test_fused_exact_dot_products_match_logits_path(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """Small-integer operands (exact fp32 dot products): as accurate as the logits path,
    and within tolerance of torch_native run on the same logits."""
    backend = tp_logprob_backend
    case = draw_fused_case(data, backend, tp_logprob_suite, small_integers=True)
    fused_exact_products.run(backend, case, stats=tp_logprob_suite.stats)


_GARBAGE = np.array([np.nan, np.inf, -np.inf, 2.0**100, -(2.0**100), 0.0], dtype=np.float32)


@suite_property("fused_padding_rows", params={"seed": "int"})
def fused_padding_rows(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """Other garbage in the weight's (and bias's) padding rows changes no output bit.

    ``params["seed"]`` picks the new garbage (NaN, +-inf, 2^100, 0) for every element.
    """
    case = fused_only(case)
    real = case.contract.sharding.real_vocab_size
    rng = np.random.default_rng(int(params["seed"]))
    weight = np.array(case.weight)
    weight[real:] = round_to_dtype(rng.choice(_GARBAGE, weight[real:].shape), case.contract.dtype)
    bias = None if case.bias is None else np.array(case.bias)
    if bias is not None:
        bias[real:] = round_to_dtype(rng.choice(_GARBAGE, bias[real:].shape), case.contract.dtype)
    other = case.replace(weight=weight, bias=bias)
    expect_bitwise(
        "fused padding rows: other garbage in the weight's padding rows changed an output",
        case,
        backend.backend_id,
        execute(backend, case),
        execute(backend, other),
        labels=("drawn padding rows", "other padding rows"),
    )


@applies_to(HIDDEN_INPUT, VOCAB_PADDING)
@scaled(0.5)
@given(data=st.data())
def test_fused_padding_rows_never_read(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """Other garbage (NaN, +-inf, 2^100) in the weight's and bias's padding rows: same bits."""
    backend = tp_logprob_backend
    case = draw_fused_case(data, backend, tp_logprob_suite, padding=True)
    seed = data.draw(st.integers(0, 2**31 - 1), label="garbage seed")
    fused_padding_rows.run(backend, case, {"seed": seed})


@suite_property("fused_gradients")
def fused_gradients(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """``d hidden`` (every rank's partial, summed as the caller's all-reduce does), ``d weight``
    and ``d bias`` of ``sum(w selected_logp + v entropy)`` within their bounds of the exact
    values; exactly 0 on inactive rows and padding rows."""
    expect_fused_gradients(backend, case, stats)


@applies_to(HIDDEN_INPUT, TRAIN_ROLE)
@given(data=st.data())
def test_fused_gradients(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """d hidden (rank partials summed), d weight and d bias of w * selected + v * entropy
    within their bounds; exactly 0 on inactive rows and padding rows."""
    backend = tp_logprob_backend
    case = draw_fused_case(data, backend, tp_logprob_suite, roles={"train"})
    fused_gradients.run(backend, case, stats=tp_logprob_suite.stats)


@applies_to(HIDDEN_INPUT)
@scaled(0.5)
@given(data=st.data())
def test_fused_run_to_run_and_batch_invariance(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """Two runs give the same bits, and rows run as their own batch keep their bits
    (unless the backend claims run_to_run determinism only)."""
    check_run_to_run_and_batch_invariance(
        data, tp_logprob_backend, tp_logprob_suite, "fused", run_to_run, batch_invariance
    )


@applies_to(HIDDEN_INPUT, BATCH_INVARIANT)
@scaled(0.2)
@given(data=st.data())
def test_fused_row_positions(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """One hidden row at odd and even positions, inside and at the end of row chunks and
    tiles: every copy has the bits of the row run alone."""
    backend = tp_logprob_backend
    case = draw_fused_case(data, backend, tp_logprob_suite)
    row_positions.run(backend, case, draw_positions(data, case, backend))


@applies_to(HIDDEN_INPUT, SEVERAL_LAYOUTS)
@scaled(0.5)
@given(data=st.data())
def test_fused_tp_consistency(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """Another TP degree and shard layout of the same weight: bitwise for cross_tp_bitwise,
    else within tolerance (with the dot-product room of both runs)."""
    check_across_layouts(data, tp_logprob_backend, tp_logprob_suite, "fused", tp_consistency)


MEMORY_ROWS = 384
_PARTIAL_WIDTH = 8
"""Rows of the memory check's batch: a backend that processes rows in chunks of fewer
rows never holds an fp32 tensor as wide as a shard with all of them."""


@suite_property("fused_memory")
def fused_memory(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """The case's rows repeated to :data:`MEMORY_ROWS` rows: no fp32 tensor that the op
    allocates (forward, and backward for train; every aten op, every rank's thread) is
    ``[MEMORY_ROWS, w]`` or taller for ``w`` a shard's live or padded width. A backend
    that claims batch invariance must also give each of those rows the bits it has in
    the case's own batch: a free check on a batch that crosses every chunk and tile.

    Seen through :func:`~tp_logprob.suite.allocations.track_allocations`: outputs of
    aten ops, not memory inside a kernel (a BLAS workspace). Widths up to 8 (per-row
    partials hold 3-4 fp32 fields) and the hidden size (``d hidden`` is ``[N, H]`` fp32)
    are not watched; the property draws vocabularies wide enough to have other widths.
    """
    import torch

    from tp_logprob.suite.allocations import track_allocations

    case = fused_only(case)
    big = fused_only(sub_batch(case, np.arange(MEMORY_ROWS) % case.contract.num_tokens))
    contract = big.contract
    sharding = contract.sharding
    widths = {end - start for start, end in sharding.vocab_shard_bounds}
    widths |= {
        end - start for start, end in map(sharding.live_bounds, range(sharding.tp_world_size))
    }
    # [N, k] fp32 for k <= 8 are per-row partials (3-4 fields); [N, H] is d hidden.
    widths = {w for w in widths if w > _PARTIAL_WIDTH and w != contract.hidden_size}
    if not widths:
        return
    op = backend.op_for(contract)
    hidden, weight, bias = big.torch_inputs(backend.device)
    train = contract.role.value == "train"
    for tensor in (hidden, weight, bias):
        if tensor is not None and train:
            tensor.requires_grad_(True)
    targets = big.torch_targets(backend.device)
    with track_allocations() as seen:
        results = run_hidden(backend, seen.wrap(op), hidden, weight, targets, contract, bias=bias)
        if train:
            total = sum(result.selected_logp.float().sum() for result in results)
            if isinstance(total, torch.Tensor) and total.requires_grad:
                torch.autograd.backward(total)
    largest = seen.largest_2d(torch.float32, widths)
    if largest is not None and largest.shape[0] >= MEMORY_ROWS:
        raise violation(
            "fused memory: an fp32 tensor as wide as a shard holds every row (the logits)",
            big,
            backend.backend_id,
            [
                (
                    "worst",
                    f"{largest.op} allocated float32 {list(largest.shape)} "
                    f"({largest.nbytes} bytes) on thread {largest.thread}",
                ),
                (
                    "rows",
                    f"N={MEMORY_ROWS} (the case's rows repeated); shard widths {sorted(widths)}",
                ),
                (
                    "peak",
                    f"{seen.peak_live_bytes} bytes live at once ({'train' if train else 'infer'})",
                ),
            ],
        )
    if claims_batch_invariance(backend):  # the repeated rows are a free batch-invariance check
        rows = case.contract.num_tokens
        expect_bitwise(
            f"fused memory: the {MEMORY_ROWS} rows, copies of the case's {rows}, do not have "
            "the bits those rows have in the case's own batch",
            big,
            backend.backend_id,
            select_rows(execute(backend, case), np.arange(MEMORY_ROWS) % rows),
            outputs_of(results, big, backend.backend_id),
            labels=(f"in the case's batch of {rows}", f"in the batch of {MEMORY_ROWS}"),
        )


@applies_to(HIDDEN_INPUT)
@scaled(0.12)
@given(data=st.data())
def test_fused_never_materializes_the_logits(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """384 rows, forward and (train) backward: no fp32 tensor the op allocates is a
    shard's width with every row, i.e. the ``[N, local_vocab]`` logits never exist."""
    backend = tp_logprob_backend
    case = draw_fused_case(
        data, backend, tp_logprob_suite, max_num_tokens=4, min_padded_vocab_size=32
    )
    fused_memory.run(backend, case)
