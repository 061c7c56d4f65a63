"""Metamorphic properties: change the input in a way whose effect on the output is known.

Padding columns and inactive rows' targets must change nothing; deactivating a
row changes only that row; shifting a row by ``c`` shifts its LSE by ``c``;
permuting the vocabulary (and the targets with it) changes nothing beyond rounding.
Each test draws the case and the change, which its property takes as params, so a
failure replays exactly from its artifact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tp_logprob.contract import LogprobDType, MaskSpec
from tp_logprob.judging.expected import exact_outputs
from tp_logprob.judging.measuring import (
    allowed_error,
    entropy_room,
    expect_bitwise,
    expect_close,
)
from tp_logprob.judging.outputs import Outputs
from tp_logprob.judging.violation import PropertyInputError, violation
from tp_logprob.strategies import LogprobCase, logits, round_to_dtype
from tp_logprob.suite.applicability import EXPLICIT_MASK, LOGITS_INPUT, VOCAB_PADDING, applies_to
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.draws import draw_case
from tp_logprob.suite.params import (
    ArraySpec,
    live_columns,
    padding_columns,
    per_row,
)
from tp_logprob.suite.property import suite_property
from tp_logprob.suite.running import execute, select_rows, sub_batch
from tp_logprob.suite.session import Suite
from tp_logprob.suite.summary import SuiteStats


@suite_property("padding_ignored", arrays={"padding": ArraySpec("float32", padding_columns)})
def padding_ignored(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """``params["padding"]`` (garbage) in the padding columns changes no bit of the output."""
    real = case.contract.sharding.real_vocab_size
    garbage = np.concatenate([case.logits[:, :real], params["padding"]], axis=1)
    expect_bitwise(
        "padding independence: values in padding columns changed the result",
        case,
        backend.backend_id,
        execute(backend, case),
        execute(backend, case.replace(logits=garbage)),
        labels=("original padding", "garbage padding"),
    )


@applies_to(LOGITS_INPUT, VOCAB_PADDING)
@given(data=st.data())
def test_padding_is_ignored(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """Garbage (NaN, +-inf, huge values) in the padding columns changes no bit of the output."""
    backend = tp_logprob_backend
    case = draw_case(data, backend, tp_logprob_suite, padding=True)
    real = case.contract.sharding.real_vocab_size
    donor = data.draw(
        logits(case.contract, special_values=True, kinds=("max_in_padding", "special_in_padding")),
        label="logits whose padding columns replace the case's",
    )
    padding = np.ascontiguousarray(donor[:, real:], dtype=np.float32)
    padding_ignored.run(backend, case, {"padding": padding})


_GARBAGE_TARGETS = st.one_of(
    st.sampled_from([-1, -100, 2**31 - 1, 2**62, -(2**62)]),
    st.integers(-(2**63), 2**63 - 1),
)


_SIGNED_ZERO_HINT = (
    "-0.0 is not +0.0: an op that returns -loss (negating a cross entropy that is 0.0 on "
    "ignored rows) gives -0.0; write torch.where(active, -loss, 0.0) or add 0.0 after negating"
)


@suite_property(
    "inactive_rows",
    params={"flipped": "int"},
    optional={"flipped"},
    arrays={"inactive_targets": ArraySpec("int64", per_row)},
)
def inactive_rows(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """Row ``params["flipped"]`` (if any) made inactive, and every inactive row's target
    replaced by ``params["inactive_targets"]``: inactive rows give +0.0, other rows do not move."""
    contract = case.contract
    active = case.active
    flipped = params.get("flipped")
    if flipped is not None:
        if not (0 <= flipped < contract.num_tokens and active[flipped]):
            raise PropertyInputError(f"params.flipped={flipped!r}: not an active row of the case")
        active[flipped] = False
    targets = np.where(active, case.targets, params["inactive_targets"])
    mask = MaskSpec(contract.num_tokens, active, ignore_index=contract.mask.ignore_index)
    changed = case.replace(contract=dataclasses.replace(contract, mask=mask), targets=targets)
    before, after = execute(backend, case), execute(backend, changed)
    inactive = np.flatnonzero(~active)
    for name, values in (("selected_logp", after.selected), ("entropy", after.entropy)):
        if values is None:
            continue
        nonzero = inactive[(values[inactive] != 0.0) | np.signbit(values[inactive])]
        if nonzero.size:
            row = int(nonzero[0])
            raise violation(
                f"mask semantics: an inactive row's {name} is not exactly +0.0",
                changed,
                backend.backend_id,
                [
                    ("worst", f"{name}, row {row} (target {int(targets[row])})"),
                    ("rows", f"every inactive row that is not +0.0: {nonzero.tolist()}"),
                    ("observed", repr(float(values[row]))),
                    ("expected", "0.0"),
                    ("hint", _SIGNED_ZERO_HINT if values[row] == 0.0 else "inactive rows are 0.0"),
                ],
            )
    # Compare every row but the deactivated one (given its old values), keeping row numbers.
    selected, lse = after.selected.copy(), None if after.lse is None else after.lse.copy()
    entropy = None if after.entropy is None else after.entropy.copy()
    if flipped is not None:
        selected[flipped] = before.selected[flipped]
        if lse is not None and before.lse is not None:
            lse[flipped] = before.lse[flipped]
        if entropy is not None and before.entropy is not None:
            entropy[flipped] = before.entropy[flipped]
    expect_bitwise(
        "mask semantics: garbage targets of inactive rows, or deactivating row "
        f"{flipped}, changed other rows",
        changed,
        backend.backend_id,
        before,
        Outputs(selected, lse, after.results, entropy),
        labels=("before", "after"),
    )
    if flipped is not None and after.lse is not None:
        row_case = sub_batch(changed, [flipped])
        selected, lse = exact_outputs(row_case)
        expect_close(
            f"mask semantics: the lse of row {flipped}, made inactive, is not the row's LSE",
            row_case,
            backend.backend_id,
            select_rows(after, [flipped]),
            selected,
            lse,
            expected_entropy=None,  # inactive now: its entropy is 0.0, checked above
            count_ulps=False,
        )


@applies_to(LOGITS_INPUT, EXPLICIT_MASK)
@given(data=st.data())
def test_inactive_rows(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """Inactive rows give exactly +0.0, their targets are never read, and the other rows
    are unaffected when one more row is made inactive."""
    backend = tp_logprob_backend
    case = draw_case(data, backend, tp_logprob_suite, mask_modes={"explicit_active_mask"})
    active = case.active
    flipped = None
    if active.any():
        flipped = data.draw(
            st.sampled_from(np.flatnonzero(active).tolist()), label="row made inactive"
        )
        active[flipped] = False
    targets = np.array(case.targets)
    for row in np.flatnonzero(~active).tolist():
        targets[row] = data.draw(_GARBAGE_TARGETS, label=f"garbage target of inactive row {row}")
    inactive_rows.run(backend, case, {"flipped": flipped, "inactive_targets": targets})


_PRECISION_BITS = {LogprobDType.FP32: 24, LogprobDType.BF16: 8, LogprobDType.FP16: 11}


@suite_property("shift_equivariance", params={"shift": "float"})
def shift_equivariance(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """``x + params["shift"]`` (exact in the dtype): lse moves by the shift, selected stays."""
    shift = params["shift"]
    moved = case.logits.astype(np.float64) + shift
    if not np.array_equal(round_to_dtype(moved, case.contract.dtype), moved, equal_nan=True):
        raise PropertyInputError(
            f"params.shift={shift!r}: the shifted logits are not exact in {case.contract.dtype}"
        )
    if case.contract.temperature != 1.0:
        raise PropertyInputError(
            f"temperature={case.contract.temperature!r}: x + c is not z + c / T exactly; "
            "shift equivariance is checked at T = 1"
        )
    shifted = case.replace(logits=moved)
    before, after = execute(backend, case), execute(backend, shifted)
    selected, lse = exact_outputs(case)
    selected_error, lse_error = allowed_error(case, selected, lse)
    entropy_bound = entropy_room(case, before, lse)
    expected_lse = lse + shift if before.lse is None else before.lse + shift
    expect_close(
        f"shift equivariance: adding {shift!r} to every logit broke lse + c / selected",
        shifted,
        backend.backend_id,
        after,
        before.selected,
        expected_lse,
        expected_name=f"unshifted result (+ {shift!r} for lse)",
        extra_selected=selected_error,
        extra_lse=lse_error,
        expected_entropy=before.entropy,
        extra_entropy=entropy_bound,
        count_ulps=False,
        inactive_zero=False,
    )


@applies_to(LOGITS_INPUT)
@given(data=st.data())
def test_shift_equivariance(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """x + c (exact in the dtype): lse moves by c, selected_logp stays, within tolerance."""
    backend = tp_logprob_backend
    case = draw_case(data, backend, tp_logprob_suite, temperature=1.0)
    # Integers below 2^(p-2) times a power of two, shifted by another such: every
    # value and every shifted value is exact in a format with p bits of precision.
    limit = 2 ** (_PRECISION_BITS[case.contract.dtype] - 2) - 1
    spread = data.draw(st.sampled_from([4, 64, limit]), label="integer spread")
    grid = 2.0 ** data.draw(st.integers(-6, 6), label="grid exponent")
    seed = data.draw(st.integers(0, 2**32 - 1), label="grid seed")
    units = np.random.default_rng(seed).integers(
        -min(spread, limit), min(spread, limit) + 1, case.logits.shape
    )
    base = case.replace(logits=np.where(np.isneginf(case.logits), -np.inf, units * grid))
    shift = grid * data.draw(st.integers(-limit, limit), label="shift in grid units")
    shift_equivariance.run(backend, base, {"shift": float(shift)})


@suite_property("vocabulary_permutation", arrays={"order": ArraySpec("int64", live_columns)})
def vocabulary_permutation(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """New column j holds old column ``params["order"][j]`` (targets follow): same result."""
    real = case.contract.sharding.real_vocab_size
    order = np.asarray(params["order"])
    if not np.array_equal(np.sort(order), np.arange(real)):
        raise PropertyInputError(f"params.order: not a permutation of range({real})")
    permuted = np.array(case.logits)
    permuted[:, :real] = case.logits[:, order]
    where = np.argsort(order)  # old column -> new column
    targets = np.array(case.targets)
    in_range = (targets >= 0) & (targets < real)
    targets[in_range] = where[targets[in_range]]
    other = case.replace(logits=permuted, targets=targets)
    before, after = execute(backend, case), execute(backend, other)
    selected, lse = exact_outputs(case)
    selected_error, lse_error = allowed_error(case, selected, lse)
    expect_close(
        "vocabulary permutation: permuting the live columns changed the result",
        other,
        backend.backend_id,
        after,
        before.selected,
        lse if before.lse is None else before.lse,
        expected_name="unpermuted result",
        extra_selected=selected_error,
        extra_lse=lse_error,
        expected_entropy=before.entropy,
        extra_entropy=entropy_room(case, before, lse),
        count_ulps=False,
        inactive_zero=False,
    )


@applies_to(LOGITS_INPUT)
@given(data=st.data())
def test_vocabulary_permutation(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """Permuting the live columns (and the targets with them) changes nothing beyond tolerance."""
    backend = tp_logprob_backend
    case = draw_case(data, backend, tp_logprob_suite)
    real = case.contract.sharding.real_vocab_size
    order = np.array(
        data.draw(st.permutations(range(real)), label="new column j holds old column order[j]"),
        dtype=np.int64,
    )
    vocabulary_permutation.run(backend, case, {"order": order})
