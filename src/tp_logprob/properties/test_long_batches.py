"""Long batches: hundreds of rows, so a bug past the first tile or chunk of rows shows.

Real kernels walk the rows in tiles or chunks of 64 to 256 (a Triton ``BLOCK_M``,
Liger's row chunks); a wrong row offset, a wrong target stride or a dropped last
partial chunk lives past the first boundary, where the other properties' 16 rows
never reach. Each example draws a small case and a length (never a multiple of
64) and builds the long batch from it (:func:`~tp_logprob.suite.running.expanded_batch`:
random copies of its rows, their own targets, permuted live columns), then judges
every row against the exact oracle and, for role ``train``, the exact gradient.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tp_logprob.judging.violation import PropertyInputError
from tp_logprob.strategies import HiddenCase, LogprobCase
from tp_logprob.suite.applicability import HIDDEN_INPUT, LOGITS_INPUT, applies_to
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.draws import (
    draw_case,
    draw_fused_case,
    long_lengths,
    max_batch_rows,
    max_batch_vocab,
)
from tp_logprob.suite.expect import expect_exact, expect_exact_and_gradient, expect_fused_gradients
from tp_logprob.suite.profiles import scaled
from tp_logprob.suite.property import suite_property
from tp_logprob.suite.running import expanded_batch
from tp_logprob.suite.session import Suite
from tp_logprob.suite.summary import SuiteStats


@suite_property("long_batch", params={"length": "int", "seed": "int"})
def long_batch(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """The ``params["length"]``-row batch built from ``case`` with ``params["seed"]``: every
    row within the tolerance table of the exact values, inactive rows exactly +0.0, and
    (train) the gradient within its bound."""
    length = params["length"]
    if not 1 <= length <= 4096:
        raise PropertyInputError(f"params.length={length!r}: expected 1..4096")
    long = expanded_batch(case, length, params["seed"])
    out_of_tolerance = f"long batch: {length} rows, a row out of tolerance"
    if not isinstance(long, HiddenCase):
        gradient = f"long batch: {length} rows (gradient)"
        expect_exact_and_gradient(out_of_tolerance, gradient, backend, long, stats)
        return
    expect_exact(out_of_tolerance, backend, long, stats)
    if long.contract.role.value == "train":
        expect_fused_gradients(backend, long, stats)


def _long_params(data: Any, backend: BackendUnderTest) -> dict[str, Any]:
    return {
        "length": data.draw(long_lengths(max_batch_rows(backend)), label="rows of the batch"),
        "seed": data.draw(st.integers(0, 2**32 - 1), label="batch seed"),
    }


@applies_to(LOGITS_INPUT)
@scaled(0.16)
@given(data=st.data())
def test_long_batches(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """65 to 700 rows (100 and 32 columns under the Triton interpreter), never a multiple
    of 64: every row against the exact oracle, and the gradient for train."""
    backend = tp_logprob_backend
    vocab = max_batch_vocab(backend, 48)
    case = draw_case(data, backend, tp_logprob_suite, max_padded_vocab_size=vocab)
    long_batch.run(backend, case, _long_params(data, backend))


@applies_to(HIDDEN_INPUT)
@scaled(0.16)
@given(data=st.data())
def test_fused_long_batches(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """A fused LM head on 65 to 700 hidden rows: every row against the exact oracle (with
    the dot-product room), and d hidden, d weight and d bias for train."""
    backend = tp_logprob_backend
    vocab = max_batch_vocab(backend, 40)
    case = draw_fused_case(data, backend, tp_logprob_suite, max_padded_vocab_size=vocab)
    long_batch.run(backend, case, _long_params(data, backend))
