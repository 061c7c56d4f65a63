"""``assert_logprob_close(order=...)``: a kernel held to the bound of its declared order,
and ``tp_shards`` held to its widest shard."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.order_sums import reduce_rows
from tp_logprob import AccumulationOrder, LogprobContractError
from tp_logprob.oracle import exact_selected_logprob, tolerance
from tp_logprob.strategies import round_to_dtype
from tp_logprob.testing import assert_logprob_close

F32 = np.float32
ROWS, VOCAB, TP = 8, 32064, 2


def _kernel(shards: list[np.ndarray], targets: np.ndarray, padding: int) -> tuple[np.ndarray, ...]:
    """A TP kernel summing each shard by a pairwise tree; ``padding`` zero-valued columns
    per shard wrongly counted in its sum (the bug)."""
    maxima, sums = [], []
    for shard in shards:
        m = shard.max(axis=1)
        total = reduce_rows(np.exp(shard - m[:, None]).astype(F32), "tree")
        sums.append((total + F32(padding) * np.exp(-m).astype(F32)).astype(F32))
        maxima.append(m)
    big_m = np.max(maxima, axis=0)
    total = np.zeros(ROWS, F32)
    for m, s in zip(maxima, sums, strict=True):
        total = (total + (s * np.exp(m - big_m)).astype(F32)).astype(F32)
    lse = (big_m + np.log(total)).astype(F32)
    full = np.concatenate(shards, axis=1)
    return (full[np.arange(ROWS), targets] - lse).astype(F32), lse


@pytest.fixture(scope="module")
def unit_bf16() -> tuple[list[np.ndarray], np.ndarray]:
    rng = np.random.default_rng(7)
    logits = round_to_dtype(rng.standard_normal((ROWS, VOCAB)), "bf16")
    return np.split(logits, TP, axis=1), rng.integers(0, VOCAB, ROWS)


def test_padding_counted_in_the_sum_fails_once_a_tree_is_declared(
    unit_bf16: tuple[list[np.ndarray], np.ndarray],
) -> None:
    shards, targets = unit_bf16
    tree = AccumulationOrder.tree()
    selected, lse = _kernel(shards, targets, padding=0)
    assert_logprob_close(selected, tp_shards=shards, targets=targets, lse=lse, dtype="bf16")
    assert_logprob_close(
        selected, tp_shards=shards, targets=targets, lse=lse, dtype="bf16", order=tree
    )
    selected, lse = _kernel(shards, targets, padding=64)
    with pytest.raises(AssertionError, match=r"bound +assumes the declared order: pairwise"):
        assert_logprob_close(
            selected, tp_shards=shards, targets=targets, lse=lse, dtype="bf16", order=tree
        )


def test_the_message_names_the_any_order() -> None:
    with pytest.raises(AssertionError, match=r"bound +assumes sums in any order \(declare order="):
        assert_logprob_close(np.array([-0.5], F32), [[0.0, 0.0]], [1])


def test_tp_shards_are_held_to_the_widest_shard() -> None:
    rng = np.random.default_rng(3)
    logits = round_to_dtype(rng.standard_normal((1, 32000)), "bf16")
    targets = np.array([5])
    selected, lse = exact_selected_logprob(logits, targets)
    row_max = [float(logits.max())]
    whole = tolerance("bf16", 32000, num_shards=8).lse_bound(lse, row_max=row_max)[0]
    shard = tolerance("bf16", 32000, num_shards=8, max_shard_size=4000).lse_bound(
        lse, row_max=row_max
    )[0]
    assert shard * 4 < whole
    off = F32(lse[0] + (shard + whole) / 2)
    shards = np.split(logits, 8, axis=1)
    kwargs = {"targets": targets, "lse": np.array([off]), "dtype": "bf16"}
    assert_logprob_close(selected.astype(F32), logits, **kwargs)
    with pytest.raises(AssertionError, match=r"lse, row 0"):
        assert_logprob_close(selected.astype(F32), tp_shards=shards, **kwargs)


def test_a_bad_order_is_refused() -> None:
    with pytest.raises(LogprobContractError, match=r"order='tree': expected an AccumulationOrder"):
        assert_logprob_close(np.array([-0.6931472], F32), [[0.0, 0.0]], [1], order="tree")
