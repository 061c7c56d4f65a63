"""Temperature and entropy: NaN-freedom, exact scaling and ``-inf`` columns.

Oracle agreement of temperature-scaled outputs and of entropy, gradients of
``selected_logp`` and ``entropy`` together, and cross-TP bitwise entropy come
from the other modules, whose drawn contracts include both; these properties
aim at the bugs trainers shipped: ``0 * -inf`` in entropy, entropy over padding,
and temperature applied anywhere but to the logits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st

from tp_logprob.contract import MaskSpec, ShardingSpec
from tp_logprob.judging.expected import exact_outputs
from tp_logprob.judging.measuring import (
    allowed_error,
    entropy_room,
    expect_bitwise,
    expect_close,
)
from tp_logprob.judging.violation import PropertyInputError
from tp_logprob.strategies import LogprobCase, round_to_dtype
from tp_logprob.suite.applicability import (
    EXPORTS_ENTROPY,
    LOGITS_INPUT,
    TEMPERATURE_NOT_ONE,
    applies_to,
)
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.draws import draw_case
from tp_logprob.suite.expect import expect_exact_and_gradient
from tp_logprob.suite.profiles import scaled
from tp_logprob.suite.property import suite_property
from tp_logprob.suite.running import execute
from tp_logprob.suite.session import Suite
from tp_logprob.suite.summary import SuiteStats


@suite_property("entropy_nan_free")
def entropy_nan_free(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """Rows full of ``-inf`` logits and garbage padding: entropy and its gradient are finite
    (and within tolerance) wherever the exact values are finite."""
    expect_exact_and_gradient(
        "entropy NaN-freedom: -inf logits or padding broke entropy",
        "entropy NaN-freedom (gradient)",
        backend,
        case,
        stats,
    )


@applies_to(LOGITS_INPUT, EXPORTS_ENTROPY)
@given(data=st.data())
def test_entropy_is_nan_free_where_exact_is_finite(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """Rows with -inf logits and garbage padding: entropy (and, for train, its gradient)
    finite and within tolerance wherever the exact value is finite."""
    backend = tp_logprob_backend
    case = draw_case(
        data,
        backend,
        tp_logprob_suite,
        export_entropy=True,
        min_padded_vocab_size=2,
        special_values=True,
        logit_kinds=("neg_inf_columns", "special_in_padding", "max_in_padding", "ties_at_max"),
    )
    entropy_nan_free.run(backend, case, stats=tp_logprob_suite.stats)


@suite_property("temperature_power_of_two", params={"exponent": "int"})
def temperature_power_of_two(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """``T = 2^k`` gives the bits of ``T = 1`` on the logits scaled by ``2^-k`` (exact in
    the dtype), since ``x / 2^k`` is then exact: the division is the contract's, once."""
    exponent = params["exponent"]
    scaled_logits = case.logits.astype(np.float64) * 2.0**-exponent
    exact = round_to_dtype(scaled_logits, case.contract.dtype)
    if not np.array_equal(exact, scaled_logits, equal_nan=True):
        raise PropertyInputError(
            f"params.exponent={exponent!r}: x * 2^-{exponent} is not exact in {case.contract.dtype}"
        )
    hot = case.replace(contract=dataclasses.replace(case.contract, temperature=2.0**exponent))
    cold = case.replace(
        contract=dataclasses.replace(case.contract, temperature=1.0), logits=scaled_logits
    )
    expect_bitwise(
        f"temperature: T = 2^{exponent} differs from T = 1 on logits pre-scaled by 2^-{exponent}",
        hot,
        backend.backend_id,
        execute(backend, hot),
        execute(backend, cold),
        labels=(f"T = 2^{exponent}", "pre-scaled, T = 1"),
    )


@applies_to(LOGITS_INPUT, TEMPERATURE_NOT_ONE)
@scaled(0.5)
@given(data=st.data())
def test_power_of_two_temperature_is_exact_scaling(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """T = 2^k gives bitwise the outputs of T = 1 on logits scaled by 2^-k (when exact)."""
    backend = tp_logprob_backend
    case = draw_case(data, backend, tp_logprob_suite, temperature=2.0)
    exponent = data.draw(st.integers(-3, 3).filter(bool), label="exponent k of T = 2^k")
    scaled_logits = case.logits.astype(np.float64) * 2.0**-exponent
    exact = round_to_dtype(scaled_logits, case.contract.dtype)
    assume(np.array_equal(exact, scaled_logits, equal_nan=True))  # else not an exact scaling
    temperature_power_of_two.run(backend, case, {"exponent": exponent})


@suite_property("neg_inf_columns_ignored", params={"columns": "int"})
def neg_inf_columns_ignored(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """``params["columns"]`` more live columns, all ``-inf``, appended to the real vocabulary
    (the last live shard grows): entropy, lse and selected_logp do not change, within
    tolerance (``p = 0`` adds exactly 0 to each sum)."""
    extra = params["columns"]
    if not 1 <= extra <= 64:
        raise PropertyInputError(f"params.columns={extra!r}: expected 1..64")
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
    expect_close(
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
        extra_entropy=entropy_room(case, before, lse),
        count_ulps=False,
        inactive_zero=False,
    )


@applies_to(LOGITS_INPUT, EXPORTS_ENTROPY)
@scaled(0.5)
@given(data=st.data())
def test_entropy_ignores_appended_neg_inf_columns(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """Appending -inf columns to the real vocabulary changes no output beyond tolerance."""
    backend = tp_logprob_backend
    case = draw_case(data, backend, tp_logprob_suite, export_entropy=True)
    columns = data.draw(st.integers(1, 24), label="-inf columns appended")
    neg_inf_columns_ignored.run(backend, case, {"columns": columns})
