"""The wide sweep: vocabularies of up to 2^18 columns with block structure.

Production kernels tile the vocabulary in blocks of 2^12 to 2^16 columns; their
multi-block paths (rescaling between blocks, a block with no finite value, the
last partial block) are only reached by rows this wide. Rows come from
:func:`tp_logprob.strategies.wide_cases` and are judged against the exact oracle
and the tolerance table, as every other value property is: its certified fast
path settles a 2^18-column row in milliseconds. (``wide_reference``, the float64
reference plus its proven bound, stays registered so that its artifacts replay.)

The built-in Triton backends on CPU run through the Triton interpreter at about
10 ms per 16-column tile, so there the sweep stops at 2^10 columns (where the
CPU launch table's 16-column tiles still give 64 blocks a row); on a GPU, and
for every other backend, it reaches ``--tp-logprob-wide-max-vocab`` (2^18).

The fused sweep (:func:`tp_logprob.strategies.wide_hidden_cases`) gives a fused LM
head shards of 2^10 to 2^14 columns and hidden sizes up to 256, with small-integer
operands whose fp32 dot products are exact, so the same float64 reference judges
them; a row of general operands goes to the exact dot-product oracle. Under the
interpreter the shards stop at 2^10 columns and the hidden size at 16 (its K loop
is one deep, so any size above 1 walks it), with no general row (the fused oracle
property covers general operands).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tp_logprob.judging.fused import fused_only
from tp_logprob.judging.violation import PropertyInputError
from tp_logprob.strategies import LogprobCase, wide_cases, wide_hidden_cases
from tp_logprob.strategies.wide_fused import INTEGER_BOUND
from tp_logprob.suite.applicability import HIDDEN_INPUT, LOGITS_INPUT, applies_to
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.draws import drawing_capability, interpreted
from tp_logprob.suite.expect import expect_exact, expect_reference
from tp_logprob.suite.profiles import scaled
from tp_logprob.suite.property import suite_property
from tp_logprob.suite.running import sub_batch
from tp_logprob.suite.session import Suite
from tp_logprob.suite.summary import SuiteStats

_INTERPRETED_MAX_VOCAB = 1 << 10
_FUSED_MAX_VOCAB = 1 << 14
_FUSED_MAX_HIDDEN = 256
_INTERPRETED_MAX_HIDDEN = 16


def wide_max_vocab(backend: BackendUnderTest, configured: int) -> int:
    """The widest vocabulary the sweep draws for ``backend``."""
    if interpreted(backend):
        return min(configured, _INTERPRETED_MAX_VOCAB)
    return configured


@suite_property("wide_exact")
def wide_exact(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """A wide case within the tolerance table of the exact oracle, entropy included."""
    expect_exact("wide sweep: output outside the tolerance table", backend, case, stats)


@suite_property("wide_reference")
def wide_reference(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """A wide case within tolerance of the float64 reference plus its bound (the sweep's
    judge before the exact oracle was cheap enough; kept so that its artifacts replay)."""
    expect_reference("wide sweep", backend, case, stats)


@applies_to(LOGITS_INPUT)
@scaled(0.4)
@given(data=st.data())
def test_wide_vocabularies(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """Up to 2^18 columns, -inf blocks, constant blocks, a lone finite column, an extreme
    block, padding across a block edge and shard bounds that cut blocks: within the
    tolerance table of the exact oracle."""
    backend = tp_logprob_backend
    limit = wide_max_vocab(backend, tp_logprob_suite.wide_max_vocab)
    capability = drawing_capability(backend)
    case = data.draw(wide_cases(capability, max_vocab=limit), label="wide case")
    tp_logprob_suite.stats.example(backend.backend_id)
    wide_exact.run(backend, case, stats=tp_logprob_suite.stats)
    assert np.isfinite(case.logits).any()


def _integer_rows(case: Any) -> list[int]:
    """The rows whose hidden values are small integers (their fp32 dot products are exact)."""
    hidden = case.hidden.astype(np.float64)
    integral = np.all((hidden == np.round(hidden)) & (np.abs(hidden) <= INTEGER_BOUND), axis=1)
    return [int(row) for row in np.flatnonzero(integral)]


@suite_property("fused_wide_reference")
def fused_wide_reference(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """A wide fused case: its small-integer rows (exact dot products) within tolerance of
    the float64 reference with no dot-product room, any other row within tolerance of the
    exact oracle with it."""
    case = fused_only(case)
    exact_rows = _integer_rows(case)
    live = case.contract.sharding.real_vocab_size
    weights = case.weight[:live].astype(np.float64)
    logits = np.abs(case.logits[exact_rows, :live])
    exact = np.all(weights == np.round(weights)) and np.all(logits[np.isfinite(logits)] < 2.0**24)
    if exact_rows and not exact:
        raise PropertyInputError("the case's integer rows do not have exact fp32 dot products")
    if exact_rows:
        expect_reference("fused wide sweep", backend, sub_batch(case, exact_rows), stats)
    others = [row for row in range(case.contract.num_tokens) if row not in exact_rows]
    if others:
        expect_exact(
            "fused wide sweep (general operands): output outside the tolerance table",
            backend,
            sub_batch(case, others),
            count_ulps=False,  # the sweep's ulp errors are the exact rows' (one target per label)
        )


@applies_to(HIDDEN_INPUT)
@scaled(0.2)
@given(data=st.data())
def test_fused_wide_vocabularies(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """Fused shards of 2^10 to 2^14 columns, hidden sizes up to 256, uneven TP, bias, garbage
    padding rows, temperature and entropy; each row's maximum and target at the end of a
    shard's last, partial tile: within the float64 reference's bound."""
    backend = tp_logprob_backend
    small = interpreted(backend)
    strategy = wide_hidden_cases(
        drawing_capability(backend),
        max_vocab=min(
            tp_logprob_suite.wide_max_vocab,
            _FUSED_MAX_VOCAB,
            wide_max_vocab(backend, _FUSED_MAX_VOCAB),
        ),
        max_hidden=_INTERPRETED_MAX_HIDDEN if small else _FUSED_MAX_HIDDEN,
        general_row=not small,  # the interpreter's K loop is one deep: any H >= 2 walks it
    )
    case = data.draw(strategy, label="wide fused case")
    tp_logprob_suite.stats.example(backend.backend_id)
    fused_wide_reference.run(backend, case, stats=tp_logprob_suite.stats)
