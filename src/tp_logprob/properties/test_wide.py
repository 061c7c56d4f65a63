"""The wide sweep: vocabularies of up to 2^18 columns with block structure.

Production kernels tile the vocabulary in blocks of 2^12 to 2^16 columns; their
multi-block paths (rescaling between blocks, a block with no finite value, the
last partial block) are only reached by rows this wide. Rows come from
:func:`tp_logprob.strategies.wide_cases` and are judged against the float64
reference plus its proven bound (``reference_error_bounds``), which costs
milliseconds on a 2^18-column row where the exact oracle costs a second on
all-distinct fp32 rows.

The built-in Triton backends on CPU run through the Triton interpreter at about
10 ms per 16-column tile, so there the sweep stops at 2^10 columns (where the
CPU launch table's 16-column tiles still give 64 blocks a row); on a GPU, and
for every other backend, it reaches ``--tp-logprob-wide-max-vocab`` (2^18).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tp_logprob.contract import LogprobInputKind
from tp_logprob.properties.measuring import expect_reference
from tp_logprob.properties.profiles import scaled
from tp_logprob.properties.registry import run_property, suite_property
from tp_logprob.properties.report import SuiteStats
from tp_logprob.strategies import LogprobCase, wide_cases

_INTERPRETED = frozenset({"triton_online", "triton_exact_sum"})
_INTERPRETED_MAX_VOCAB = 1 << 10


def wide_max_vocab(backend: Any, configured: int) -> int:
    """The widest vocabulary the sweep draws for ``backend``."""
    if backend.platform == "cpu" and backend.backend_id in _INTERPRETED:
        return min(configured, _INTERPRETED_MAX_VOCAB)
    return configured


@suite_property("wide_reference")
def wide_reference(
    backend: Any, case: LogprobCase, params: Mapping[str, Any], *, stats: SuiteStats | None = None
) -> None:
    """A wide case within tolerance of the float64 reference, entropy included."""
    expect_reference("wide sweep", backend, case, stats)


@scaled(0.4)
@given(data=st.data())
def test_wide_vocabularies(tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any) -> None:
    """Up to 2^18 columns, -inf blocks, constant blocks, a lone finite column, an extreme
    block, padding across a block edge and shard bounds that cut blocks: within the
    float64 reference's bound plus the tolerance table."""
    backend = tp_logprob_backend
    if LogprobInputKind.LOGITS not in backend.capability.input_kinds:
        pytest.skip(f"{backend.backend_id} takes hidden states: the wide sweep is on logits")
    limit = wide_max_vocab(backend, tp_logprob_suite.wide_max_vocab)
    case = data.draw(wide_cases(backend.capability, max_vocab=limit), label="wide case")
    tp_logprob_suite.stats.example(backend.backend_id)
    run_property("wide_reference", backend, case, stats=tp_logprob_suite.stats)
    assert np.isfinite(case.logits).any()
