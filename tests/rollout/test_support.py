"""The mask judged on each row's top columns gives the decisions of its whole row.

The check narrows a row to its top-k columns (and the kept ones) before it judges a
mask under the noise or recomputes the rules' support; these tests hold the narrow
path to the whole-row one on bf16-rounded logits, whose ties sit at the top-k
boundary.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tp_logprob.engine_formats import EngineRollout
from tp_logprob.oracle import (
    exact_processed_logprob,
    exact_support,
    support_margins,
)
from tp_logprob.rollout.borderline import _judge_row, judge_under_noise
from tp_logprob.rollout.check import _recomputed
from tp_logprob.rollout.support import kth_largest, top_columns
from tp_logprob.rollout.trainer import dense_mask
from tp_logprob.support import SupportSpec

ROWS, V, K, T = 24, 300, 6, 0.7
PARAMS = {"top_k": K, "top_p": 0.9}


def _logits(seed: int) -> np.ndarray:
    x = torch.randn(ROWS, V, generator=torch.Generator().manual_seed(seed)) * 3
    return x.bfloat16().float().numpy()  # ties at the top-k boundary


def _masks(x: np.ndarray, seed: int) -> np.ndarray:
    """The rules' support on every third row; on the others top-k masks of a perturbed copy,
    some with an id dropped or one past the k-th added."""
    rng = np.random.default_rng(seed)
    noisy = x + rng.normal(0.0, 0.3, x.shape).astype(np.float32)
    order = np.argsort(-noisy, axis=1, kind="stable")
    mask = np.zeros(x.shape, dtype=np.bool_)
    for row in range(ROWS):
        kept = order[row, : K + int(rng.integers(-1, 3))]
        mask[row, kept] = True
    mask[::3] = exact_support(x[::3], real_vocab_size=V, temperature=T, **PARAMS).mask
    return mask


@pytest.mark.parametrize("k", [1, 6, 40, 150, 300])
def test_the_kth_largest_is_numpys_partition_on_ties_and_minus_inf(k: int) -> None:
    x = np.round(_logits(3) * 2) / 2  # many ties
    x[0, : V - 20] = -np.inf  # a row with fewer finite values than k
    x[1] = -np.inf
    x[2, ::16] = 50.0  # the sampled columns the row's largest
    expected = np.partition(x, V - k, axis=1)[:, V - k]
    assert kth_largest(x, k).tolist() == expected.tolist()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_top_columns_are_the_columns_at_or_above_the_kth_and_the_kept(seed: int) -> None:
    x, mask = _logits(seed), _masks(_logits(seed), seed)
    values, ids = top_columns(x, K, mask)
    for row in range(ROWS):
        kth = np.sort(x[row])[-K]
        expected = np.flatnonzero((x[row] >= kth) | mask[row])
        width = expected.size
        assert ids[row, :width].tolist() == expected.tolist()
        assert (ids[row, width:] == -1).all() and np.isneginf(values[row, width:]).all()
        assert values[row, :width].tolist() == x[row, expected].tolist()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("eps", [0.0, 0.05, 0.4])
def test_the_mask_under_the_noise_is_judged_as_on_the_whole_row(seed: int, eps: float) -> None:
    x, mask = _logits(seed), _masks(_logits(seed), seed)
    margins = support_margins("fp32", V, num_shards=2)
    size = np.full(ROWS, eps)
    size[::4] = 2 * eps  # each row its own noise
    found = judge_under_noise(x, mask, margins, V, T, size, PARAMS)
    whole = [_judge_row(x[r], mask[r], margins, V, T, float(size[r]), PARAMS) for r in range(ROWS)]
    assert found == whole
    assert 0 < sum(found) < ROWS  # both kinds of row are judged


@pytest.mark.parametrize("seed", [0, 1])
def test_the_recomputed_support_on_the_top_columns_gives_the_whole_rows_bits(seed: int) -> None:
    x = _logits(seed)
    mask = _masks(x, seed)
    counts = mask.sum(axis=1)
    ids = np.concatenate([np.flatnonzero(row) for row in mask])
    tokens = np.array([np.flatnonzero(row)[row.sum() // 2] for row in mask], dtype=np.int64)
    tokens[::5] = np.argsort(x[::5], axis=1)[:, 0]  # the lowest id: outside the rules' support
    rollout = EngineRollout(
        engine="test",
        token_ids=tokens,
        logprobs=None,
        support=SupportSpec(kept_offsets=np.concatenate([[0], np.cumsum(counts)]), kept_ids=ids),
        has_mask=np.ones(ROWS, dtype=np.bool_),
    )
    columns = [torch.from_numpy(x[:, : V // 2]), torch.from_numpy(x[:, V // 2 :])]
    found = _recomputed(columns, rollout, np.ones(ROWS, dtype=np.bool_), T, V, PARAMS, 7)
    support = exact_support(x, real_vocab_size=V, temperature=T, **PARAMS).mask
    usable = support[np.arange(ROWS), tokens]
    value, _, _ = exact_processed_logprob(
        x, np.where(usable, tokens, 0), support, active_mask=usable, real_vocab_size=V,
        temperature=T,
    )  # fmt: skip
    expected = np.where(usable, value, math.nan)
    assert np.array_equal(found, expected, equal_nan=True)
    assert np.isnan(found).any() and np.isfinite(found).any()
    assert dense_mask(rollout, np.arange(ROWS), V).tolist() == mask.tolist()
