"""Case-level metamorphic checks: a known change of the input, a known effect on the output.

Each takes the case and what the property drew (a donor's padding columns, a
shift, a permutation, ...) as params, so an artifact replays it exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from tp_logprob.contract import MaskSpec, ShardingSpec
from tp_logprob.properties._harness import (
    Outputs,
    allowed_error,
    check_bitwise,
    check_close,
    entropy_error,
    exact_entropy_of,
    exact_outputs,
    execute,
    select_rows,
    sub_batch,
)
from tp_logprob.properties._params import CheckInputError
from tp_logprob.properties._report import SuiteStats, violation
from tp_logprob.strategies import LogprobCase, round_to_dtype

_SIGNED_ZERO_HINT = (
    "-0.0 is not +0.0: an op that returns -loss (negating a cross entropy that is 0.0 on "
    "ignored rows) gives -0.0; write torch.where(active, -loss, 0.0) or add 0.0 after negating"
)


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
    check_bitwise(
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
        check_close(
            f"mask semantics: the lse of row {flipped}, made inactive, is not the row's LSE",
            row_case,
            backend.backend_id,
            select_rows(after, [flipped]),
            selected,
            lse,
            expected_entropy=None,  # inactive now: its entropy is 0.0, checked above
            count_ulps=False,
        )


def _entropy_bound(case: LogprobCase, run: Outputs, lse: Any) -> Any:
    """The entropy tolerance at ``case``'s exact values, when ``run`` returned entropy."""
    return 0.0 if run.entropy is None else entropy_error(case, exact_entropy_of(case), lse)


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
    if case.contract.temperature != 1.0:
        raise CheckInputError(
            f"temperature={case.contract.temperature!r}: x + c is not z + c / T exactly; "
            "shift equivariance is checked at T = 1"
        )
    shifted = case.replace(logits=moved)
    before, after = execute(backend, case), execute(backend, shifted)
    selected, lse = exact_outputs(case)
    selected_error, lse_error = allowed_error(case, selected, lse)
    entropy_bound = _entropy_bound(case, before, lse)
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
        expected_entropy=before.entropy,
        extra_entropy=entropy_bound,
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
        expected_entropy=before.entropy,
        extra_entropy=_entropy_bound(case, before, lse),
        count_ulps=False,
        inactive_zero=False,
    )


def check_temperature_power_of_two(
    backend: Any, case: LogprobCase, params: Mapping[str, Any], *, stats: SuiteStats | None = None
) -> None:
    """``T = 2^k`` gives the bits of ``T = 1`` on the logits scaled by ``2^-k`` (exact in
    the dtype), since ``x / 2^k`` is then exact: the division is the contract's, once."""
    exponent = params["exponent"]
    scaled_logits = case.logits.astype(np.float64) * 2.0**-exponent
    exact = round_to_dtype(scaled_logits, case.contract.dtype)
    if not np.array_equal(exact, scaled_logits, equal_nan=True):
        raise CheckInputError(
            f"params.exponent={exponent!r}: x * 2^-{exponent} is not exact in {case.contract.dtype}"
        )
    hot = case.replace(contract=dataclasses.replace(case.contract, temperature=2.0**exponent))
    cold = case.replace(
        contract=dataclasses.replace(case.contract, temperature=1.0), logits=scaled_logits
    )
    check_bitwise(
        f"temperature: T = 2^{exponent} differs from T = 1 on logits pre-scaled by 2^-{exponent}",
        hot,
        backend.backend_id,
        execute(backend, hot),
        execute(backend, cold),
        labels=(f"T = 2^{exponent}", "pre-scaled, T = 1"),
    )


def check_neg_inf_columns_ignored(
    backend: Any, case: LogprobCase, params: Mapping[str, Any], *, stats: SuiteStats | None = None
) -> None:
    """``params["columns"]`` more live columns, all ``-inf``, appended to the real vocabulary
    (the last live shard grows): entropy, lse and selected_logp do not change, within
    tolerance (``p = 0`` adds exactly 0 to each sum)."""
    extra = params["columns"]
    if not 1 <= extra <= 64:
        raise CheckInputError(f"params.columns={extra!r}: expected 1..64")
    contract = case.contract
    sharding = contract.sharding
    real, padded = sharding.real_vocab_size, sharding.padded_vocab_size
    # The shard holding the last live column grows; later shards move right.
    owner = sharding.owner_of(real - 1)
    bounds = tuple(
        (start + extra * (rank > owner), end + extra * (rank >= owner))
        for rank, (start, end) in enumerate(sharding.vocab_shard_bounds)
    )
    wider_sharding = ShardingSpec(
        sharding.tp_rank, sharding.tp_world_size, bounds, real + extra, padded + extra
    )
    blank = np.full((contract.num_tokens, extra), -np.inf, dtype=np.float32)
    logits = np.concatenate([case.logits[:, :real], blank, case.logits[:, real:]], axis=1)
    mask = contract.mask
    if 0 <= mask.ignore_index < real + extra:  # would now name a real column
        mask = MaskSpec(mask.num_tokens, mask.active_mask, ignore_index=-100)
    wider = case.replace(
        contract=dataclasses.replace(contract, sharding=wider_sharding, mask=mask), logits=logits
    )
    before, after = execute(backend, case), execute(backend, wider)
    selected, lse = exact_outputs(case)
    selected_error, lse_error = allowed_error(case, selected, lse)
    check_close(
        f"-inf columns: {extra} appended -inf columns changed the result",
        wider,
        backend.backend_id,
        after,
        before.selected,
        lse if before.lse is None else before.lse,
        expected_name=f"without the {extra} -inf columns",
        extra_selected=selected_error,
        extra_lse=lse_error,
        expected_entropy=before.entropy,
        extra_entropy=_entropy_bound(case, before, lse),
        count_ulps=False,
        inactive_zero=False,
    )
