"""Case-level metamorphic checks: a known change of the input, a known effect on the output.

Each takes the case and what the property drew (a donor's padding columns, a
shift, a permutation, ...) as params, so an artifact replays it exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from tp_logprob.contract import MaskSpec
from tp_logprob.properties._harness import (
    Outputs,
    allowed_error,
    check_bitwise,
    check_close,
    exact_outputs,
    execute,
    select_rows,
    sub_batch,
)
from tp_logprob.properties._params import CheckInputError
from tp_logprob.properties._report import SuiteStats, violation
from tp_logprob.strategies import LogprobCase, round_to_dtype


def check_padding_ignored(
    backend: Any, case: LogprobCase, params: Mapping[str, Any], *, stats: SuiteStats | None = None
) -> None:
    """``params["padding"]`` (garbage) in the padding columns changes no bit of the output."""
    real = case.contract.sharding.real_vocab_size
    garbage = np.concatenate([case.logits[:, :real], params["padding"]], axis=1)
    check_bitwise(
        "padding independence: values in padding columns changed the result",
        case,
        backend.backend_id,
        execute(backend, case),
        execute(backend, case.replace(logits=garbage)),
        labels=("original padding", "garbage padding"),
    )


def check_inactive_rows(
    backend: Any, case: LogprobCase, params: Mapping[str, Any], *, stats: SuiteStats | None = None
) -> None:
    """Row ``params["flipped"]`` (if any) made inactive, and every inactive row's target
    replaced by ``params["inactive_targets"]``: inactive rows give +0.0, other rows do not move."""
    contract = case.contract
    active = case.active
    flipped = params.get("flipped")
    if flipped is not None:
        if not (0 <= flipped < contract.num_tokens and active[flipped]):
            raise CheckInputError(f"params.flipped={flipped!r}: not an active row of the case")
        active[flipped] = False
    targets = np.where(active, case.targets, params["inactive_targets"])
    mask = MaskSpec(contract.num_tokens, active, ignore_index=contract.mask.ignore_index)
    changed = case.replace(contract=dataclasses.replace(contract, mask=mask), targets=targets)
    before, after = execute(backend, case), execute(backend, changed)
    inactive = np.flatnonzero(~active)
    nonzero = inactive[(after.selected[inactive] != 0.0) | np.signbit(after.selected[inactive])]
    if nonzero.size:
        row = int(nonzero[0])
        raise violation(
            "mask semantics: an inactive row's selected_logp is not exactly +0.0",
            changed,
            backend.backend_id,
            [
                ("worst", f"selected_logp, row {row} (target {int(targets[row])})"),
                ("rows", f"every inactive row that is not +0.0: {nonzero.tolist()}"),
                ("observed", repr(float(after.selected[row]))),
                ("expected", "0.0"),
            ],
        )
    # Compare every row but the deactivated one (given its old values), keeping row numbers.
    selected, lse = after.selected.copy(), None if after.lse is None else after.lse.copy()
    if flipped is not None:
        selected[flipped] = before.selected[flipped]
        if lse is not None and before.lse is not None:
            lse[flipped] = before.lse[flipped]
    check_bitwise(
        "mask semantics: garbage targets of inactive rows, or deactivating row "
        f"{flipped}, changed other rows",
        changed,
        backend.backend_id,
        before,
        Outputs(selected, lse, after.results),
        labels=("before", "after"),
    )
    if flipped is not None and after.lse is not None:
        row_case = sub_batch(changed, [flipped])
        selected, lse = exact_outputs(row_case)
        check_close(
            f"mask semantics: the lse of row {flipped}, made inactive, is not the row's LSE",
            row_case,
            backend.backend_id,
            select_rows(after, [flipped]),
            selected,
            lse,
            count_ulps=False,
        )


def check_shift_equivariance(
    backend: Any, case: LogprobCase, params: Mapping[str, Any], *, stats: SuiteStats | None = None
) -> None:
    """``x + params["shift"]`` (exact in the dtype): lse moves by the shift, selected stays."""
    shift = params["shift"]
    moved = case.logits.astype(np.float64) + shift
    if not np.array_equal(round_to_dtype(moved, case.contract.dtype), moved, equal_nan=True):
        raise CheckInputError(
            f"params.shift={shift!r}: the shifted logits are not exact in {case.contract.dtype}"
        )
    shifted = case.replace(logits=moved)
    before, after = execute(backend, case), execute(backend, shifted)
    selected, lse = exact_outputs(case)
    selected_error, lse_error = allowed_error(case, selected, lse)
    expected_lse = lse + shift if before.lse is None else before.lse + shift
    check_close(
        f"shift equivariance: adding {shift!r} to every logit broke lse + c / selected",
        shifted,
        backend.backend_id,
        after,
        before.selected,
        expected_lse,
        expected_name=f"unshifted result (+ {shift!r} for lse)",
        extra_selected=selected_error,
        extra_lse=lse_error,
        count_ulps=False,
        inactive_zero=False,
    )


def check_vocabulary_permutation(
    backend: Any, case: LogprobCase, params: Mapping[str, Any], *, stats: SuiteStats | None = None
) -> None:
    """New column j holds old column ``params["order"][j]`` (targets follow): same result."""
    real = case.contract.sharding.real_vocab_size
    order = np.asarray(params["order"])
    if not np.array_equal(np.sort(order), np.arange(real)):
        raise CheckInputError(f"params.order: not a permutation of range({real})")
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
    check_close(
        "vocabulary permutation: permuting the live columns changed the result",
        other,
        backend.backend_id,
        after,
        before.selected,
        lse if before.lse is None else before.lse,
        expected_name="unpermuted result",
        extra_selected=selected_error,
        extra_lse=lse_error,
        count_ulps=False,
        inactive_zero=False,
    )
