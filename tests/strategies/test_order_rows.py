"""The rows built against an order make every addition of that order round up."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis.errors import InvalidArgument

from tests.helpers.order_sums import F32, Realization, shard_sum
from tp_logprob.accumulation import AccumulationOrder
from tp_logprob.kernels.builtin import TORCH_NATIVE, TRITON_ONLINE
from tp_logprob.strategies import ORDER_LAYOUTS, LogprobCase, order_cases
from tp_logprob.strategies.order_rows import HALF_ULP, order_layout, order_row


@pytest.mark.parametrize(
    ("layout", "how"),
    [
        ("sequential", Realization("sequential")),
        ("tree", Realization("tree")),
        ("tree", Realization("tree", fan_in=3)),
        ("lanes", Realization("lanes", block=16)),
        ("lanes", Realization("lanes", block=16, within="tree")),
        ("blocks", Realization("blocks", block=16)),
        ("blocks", Realization("blocks", block=16, within="tree")),
    ],
)
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_every_addition_on_the_path_rounds_up(layout: str, how: Realization, dtype: str) -> None:
    width = 200
    groups = order_layout(
        layout, width, block=how.block, fan_in=how.fan_in, tree_inside=how.within == "tree"
    )
    assert sorted(c for group in groups for c in group) == list(range(1, width))
    row = order_row(groups, width, dtype)
    terms = np.exp(row.astype(np.float64) - 1.0)
    for group in groups:
        assert HALF_ULP < terms[group].sum() < 1.5 * HALF_ULP
    computed = float(shard_sum(np.exp(row - F32(1.0)).astype(F32), how))
    # Every addition on the maximum's path rounded up to one more ulp of 1.
    assert computed == 1.0 + len(groups) * 2.0**-23


@settings(max_examples=20, deadline=None)
@given(case=order_cases(TRITON_ONLINE, max_width=40))
def test_cases_hold_one_row_per_layout(case: LogprobCase) -> None:
    sharding = case.contract.sharding
    assert case.contract.num_tokens == len(ORDER_LAYOUTS)
    widths = {end - start for start, end in sharding.vocab_shard_bounds}
    assert len(widths) == 1 and max(widths) <= 40
    assert np.all(case.logits.max(axis=1) == 1.0)


def test_bad_arguments() -> None:
    with pytest.raises(InvalidArgument, match=r"max_width=0"):
        order_cases(TORCH_NATIVE, max_width=0)
    with pytest.raises(InvalidArgument, match=r"capability=.*expected a LogprobBackendCapability"):
        order_cases(AccumulationOrder.tree())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"layout='zigzag'"):
        order_layout("zigzag", 8)
