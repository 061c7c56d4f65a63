"""Metamorphic properties: change the input in a way whose effect on the output is known.

Padding columns and inactive rows' targets must change nothing; deactivating a
row changes only that row; shifting a row by ``c`` shifts its LSE by ``c``;
permuting the vocabulary (and the targets with it) changes nothing beyond rounding.
Each test draws the case and the change; the check itself lives in
:mod:`tp_logprob.properties.checks`, so a failure replays from its artifact.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tp_logprob.contract import LogprobDType
from tp_logprob.properties._harness import draw_case
from tp_logprob.properties.checks import run_check
from tp_logprob.strategies import logits


@given(data=st.data())
def test_padding_is_ignored(tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any) -> None:
    """Garbage (NaN, +-inf, huge values) in the padding columns changes no bit of the output."""
    backend = tp_logprob_backend
    case = draw_case(data, backend, tp_logprob_suite, padding=True)
    real = case.contract.sharding.real_vocab_size
    donor = data.draw(
        logits(case.contract, special_values=True, kinds=("max_in_padding", "special_in_padding")),
        label="logits whose padding columns replace the case's",
    )
    padding = np.ascontiguousarray(donor[:, real:], dtype=np.float32)
    run_check("padding_ignored", backend, case, {"padding": padding})


_GARBAGE_TARGETS = st.one_of(
    st.sampled_from([-1, -100, 2**31 - 1, 2**62, -(2**62)]),
    st.integers(-(2**63), 2**63 - 1),
)


@given(data=st.data())
def test_inactive_rows(tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any) -> None:
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
    run_check("inactive_rows", backend, case, {"flipped": flipped, "inactive_targets": targets})


_PRECISION_BITS = {LogprobDType.FP32: 24, LogprobDType.BF16: 8, LogprobDType.FP16: 11}


@given(data=st.data())
def test_shift_equivariance(tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any) -> None:
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
    run_check("shift_equivariance", backend, base, {"shift": float(shift)})


@given(data=st.data())
def test_vocabulary_permutation(tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any) -> None:
    """Permuting the live columns (and the targets with them) changes nothing beyond tolerance."""
    backend = tp_logprob_backend
    case = draw_case(data, backend, tp_logprob_suite)
    real = case.contract.sharding.real_vocab_size
    order = np.array(
        data.draw(st.permutations(range(real)), label="new column j holds old column order[j]"),
        dtype=np.int64,
    )
    run_check("vocabulary_permutation", backend, case, {"order": order})
