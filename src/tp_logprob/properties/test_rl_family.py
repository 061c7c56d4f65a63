"""Temperature and entropy: NaN-freedom, exact scaling and ``-inf`` columns.

Oracle agreement of temperature-scaled outputs and of entropy, gradients of
``selected_logp`` and ``entropy`` together, and cross-TP bitwise entropy come
from the other modules, whose drawn contracts include both; these properties
aim at the bugs trainers shipped: ``0 * -inf`` in entropy, entropy over padding,
and temperature applied anywhere but to the logits.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st

from tp_logprob.properties._harness import draw_case
from tp_logprob.properties.checks import run_check
from tp_logprob.properties.profiles import scaled
from tp_logprob.strategies import round_to_dtype


@given(data=st.data())
def test_entropy_is_nan_free_where_exact_is_finite(
    tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any
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
    run_check("entropy_nan_free", backend, case, stats=tp_logprob_suite.stats)


@scaled(0.5)
@given(data=st.data())
def test_power_of_two_temperature_is_exact_scaling(
    tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any
) -> None:
    """T = 2^k gives bitwise the outputs of T = 1 on logits scaled by 2^-k (when exact)."""
    backend = tp_logprob_backend
    case = draw_case(data, backend, tp_logprob_suite, temperature=2.0)
    exponent = data.draw(st.integers(-3, 3).filter(bool), label="exponent k of T = 2^k")
    scaled_logits = case.logits.astype(np.float64) * 2.0**-exponent
    exact = round_to_dtype(scaled_logits, case.contract.dtype)
    assume(np.array_equal(exact, scaled_logits, equal_nan=True))  # else not an exact scaling
    run_check("temperature_power_of_two", backend, case, {"exponent": exponent})


@scaled(0.5)
@given(data=st.data())
def test_entropy_ignores_appended_neg_inf_columns(
    tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any
) -> None:
    """Appending -inf columns to the real vocabulary changes no output beyond tolerance."""
    backend = tp_logprob_backend
    case = draw_case(data, backend, tp_logprob_suite, export_entropy=True)
    columns = data.draw(st.integers(1, 24), label="-inf columns appended")
    run_check("neg_inf_columns_ignored", backend, case, {"columns": columns})
