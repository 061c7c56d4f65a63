"""Hypothesis strategies for vocab-parallel logprob contracts and inputs.

Use them to test any kernel, not only tp-logprob's::

    from hypothesis import given
    from tp_logprob.strategies import cases

    @given(cases(dtypes={"bf16"}, tp_world_sizes={1, 2, 4}))
    def test_my_kernel(case):
        ...  # case.contract, case.logits (float32 [N, padded]), case.targets (int64 [N])

Everything shrinks toward TP=1, the even layout, no padding, every token active.
Importing this package does not import torch.
"""

from __future__ import annotations

from tp_logprob.strategies.cases import LogprobCase, cases
from tp_logprob.strategies.contracts import (
    LAYOUT_KINDS,
    MASK_KINDS,
    active_masks,
    contracts,
    ignore_indices,
    shard_bounds,
    temperatures,
)
from tp_logprob.strategies.fused import (
    HIDDEN_ROW_KINDS,
    WEIGHT_ROW_KINDS,
    HiddenCase,
    hidden_cases,
)
from tp_logprob.strategies.input_forms import (
    TARGET_FORMS,
    VALUE_FORMS,
    InputForm,
    input_forms,
    laid_out,
)
from tp_logprob.strategies.logits import (
    DTYPE_MAX,
    DTYPE_SMALLEST_SUBNORMAL,
    LOGIT_KINDS,
    SPECIAL_KINDS,
    logits,
    round_to_dtype,
)
from tp_logprob.strategies.order_rows import ORDER_LAYOUTS, order_cases
from tp_logprob.strategies.supports import PARAM_KINDS, REPLAYED_ROW_KINDS, supports
from tp_logprob.strategies.targets import (
    ACTIVE_TARGET_KINDS,
    INACTIVE_TARGET_KINDS,
    shard_edge_columns,
    targets,
)
from tp_logprob.strategies.wide import WIDE_ROW_KINDS, wide_cases
from tp_logprob.strategies.wide_fused import wide_hidden_cases

__all__ = [
    "ACTIVE_TARGET_KINDS",
    "DTYPE_MAX",
    "DTYPE_SMALLEST_SUBNORMAL",
    "HIDDEN_ROW_KINDS",
    "INACTIVE_TARGET_KINDS",
    "LAYOUT_KINDS",
    "LOGIT_KINDS",
    "MASK_KINDS",
    "ORDER_LAYOUTS",
    "PARAM_KINDS",
    "REPLAYED_ROW_KINDS",
    "SPECIAL_KINDS",
    "TARGET_FORMS",
    "VALUE_FORMS",
    "WEIGHT_ROW_KINDS",
    "WIDE_ROW_KINDS",
    "HiddenCase",
    "InputForm",
    "LogprobCase",
    "active_masks",
    "cases",
    "contracts",
    "hidden_cases",
    "ignore_indices",
    "input_forms",
    "laid_out",
    "logits",
    "order_cases",
    "round_to_dtype",
    "shard_bounds",
    "shard_edge_columns",
    "supports",
    "targets",
    "temperatures",
    "wide_cases",
    "wide_hidden_cases",
]
