"""Bad inputs raise LogprobContractError at the op's boundary, before any output exists.

The test draws which bad input to make; :mod:`tp_logprob.properties._checks_inputs`
makes the call and judges it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tp_logprob.properties._checks_inputs import BAD_DTYPES, BAD_INPUT_KINDS
from tp_logprob.properties._harness import draw_case
from tp_logprob.properties.checks import run_check
from tp_logprob.strategies import LogprobCase

_TORCH_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _draw_bad_input(data: Any, case: LogprobCase, kind: str) -> dict[str, Any]:
    """Exactly which bad input of ``kind`` to make, as params of the check."""
    contract = case.contract
    if kind == "wrong shard width":
        sharding = contract.sharding
        rank = data.draw(
            st.integers(0, sharding.tp_world_size - 1), label="rank given the bad width"
        )
        start, end = sharding.vocab_shard_bounds[rank]
        width = data.draw(
            st.sampled_from([w for w in (end - start - 1, end - start + 1) if w >= 0]),
            label="wrong width",
        )
        return {"kind": kind, "rank": rank, "width": width}
    if kind == "wrong logits dtype":
        own = _TORCH_NAMES[contract.dtype.value]
        wrong = data.draw(st.sampled_from([d for d in BAD_DTYPES if d != own]), label="wrong dtype")
        return {"kind": kind, "dtype": wrong}
    if kind == "wrong targets shape":
        rows = contract.num_tokens
        shape = data.draw(
            st.sampled_from([(rows + 1,), (rows, 1), (1, rows), ()]), label="targets shape"
        )
        return {"kind": kind, "targets_shape": list(shape)}
    row = data.draw(st.sampled_from(np.flatnonzero(case.active).tolist()), label="active row")
    real = contract.sharding.real_vocab_size
    target = data.draw(
        st.sampled_from(
            [
                -1,
                real,
                contract.sharding.padded_vocab_size,
                contract.mask.ignore_index,
                2**40,
                -(2**40),
            ]
        ),
        label="bad target",
    )
    return {"kind": kind, "row": row, "target": target}


@given(data=st.data())
def test_rejects_bad_inputs(tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any) -> None:
    """Each bad input raises LogprobContractError, returns nothing and leaves the logits alone."""
    backend = tp_logprob_backend
    case = draw_case(data, backend, tp_logprob_suite)
    kinds = [k for k in BAD_INPUT_KINDS if k != BAD_INPUT_KINDS[0] or case.active.any()]
    kind = data.draw(st.sampled_from(kinds), label="bad input")
    run_check("bad_inputs", backend, case, _draw_bad_input(data, case, kind))


@given(data=st.data())
def test_inputs_are_left_untouched(
    tp_logprob_backend: Any, tp_logprob_suite: Any, data: Any
) -> None:
    """local_logits and targets keep their bits and version through forward and backward."""
    backend = tp_logprob_backend
    if backend.capability.consumes_input:
        pytest.skip(f"{backend.backend_id} declares consumes_input: it may write its inputs")
    case = draw_case(data, backend, tp_logprob_suite, special_values=True)
    run_check("inputs_untouched", backend, case, stats=tp_logprob_suite.stats)
