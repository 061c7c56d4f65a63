"""The mask judged on each row's top columns gives the decisions of its whole row.

The check narrows a row to its top-k columns (and the kept ones) before it screens a
mask, judges it under the noise or recomputes the rules' support; these tests hold the
narrow path to the whole-row one on bf16-rounded logits, whose ties sit at the top-k
boundary, and on rows with values one step below that boundary.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tp_logprob.engine_formats import EngineRollout
from tp_logprob.oracle import (
    SupportMargins,
    classify_support,
    exact_processed_logprob,
    exact_support,
    support_margins,
)
from tp_logprob.rollout import support as support_module
from tp_logprob.rollout.borderline import _judge_row, judge_under_noise
from tp_logprob.rollout.check import _recomputed, _Seen
from tp_logprob.rollout.support import kth_largest, screen_masks, screened_columns, top_columns
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
    silent = _Seen(np.full(ROWS, math.nan), np.zeros(ROWS), SupportMargins.zero())
    found = _recomputed(columns, rollout, np.ones(ROWS, dtype=np.bool_), T, V, PARAMS, 7, silent)
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


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("temperature", [0.7, 3.0])
def test_the_recomputed_support_narrows_on_the_tempered_logits(
    seed: int, temperature: float
) -> None:
    """Values one fp32 step below the k-th largest ``x`` can round onto it in ``x / T``,
    which ties them into the rules' support: narrowing on ``x`` would drop them."""
    x, _ = _near_the_floor(seed, temperature)
    support = exact_support(x, real_vocab_size=V, temperature=temperature, **PARAMS).mask
    kth = np.sort(x, axis=1)[:, -K][:, None]
    below = support & (x < kth)  # kept although below the k-th largest x
    tokens = np.where(below.any(axis=1), below.argmax(axis=1), x.argmax(axis=1))
    rollout = EngineRollout(
        engine="test", token_ids=tokens.astype(np.int64), logprobs=None, support=None,
        has_mask=np.zeros(ROWS, dtype=np.bool_),
    )  # fmt: skip
    columns = [torch.from_numpy(x[:, : V // 2]), torch.from_numpy(x[:, V // 2 :])]
    silent = _Seen(np.full(ROWS, math.nan), np.zeros(ROWS), SupportMargins.zero())
    found = _recomputed(
        columns, rollout, np.ones(ROWS, dtype=np.bool_), temperature, V, PARAMS, 7, silent
    )
    value, _, _ = exact_processed_logprob(
        x, tokens, support, real_vocab_size=V, temperature=temperature
    )  # fmt: skip
    assert np.array_equal(found, value, equal_nan=True)
    assert below.any()  # some rows reach the tie the test is about


@pytest.mark.parametrize("params", [{"top_p": 0.55}, {"top_k": 4, "top_p": 0.55}])
def test_the_recomputed_support_is_the_one_under_the_noise_nearest_the_engine(
    params: dict[str, float],
) -> None:
    """Top-p 0.55 keeps the first two of [1.0, 0.9, -5, ...]; a perturbation of 0.1 lets
    the engine's logits keep the first alone (its mass passes 0.55), and the engine's
    logprob of 0 is that support's. Within 0.01 it cannot: the rules' support stays."""
    x = np.array([[1.0, 0.9, -5.0, -5.0, -5.0, -5.0]], dtype=np.float32)
    rollout = EngineRollout(
        engine="test", token_ids=np.array([0]), logprobs=None, support=None,
        has_mask=np.zeros(1, dtype=np.bool_),
    )  # fmt: skip
    assert exact_support(x, **params).mask[0].tolist()[:2] == [True, True]
    columns = [torch.from_numpy(x)]
    margins = support_margins("fp32", 6)

    def recomputed(eps: float) -> float:
        seen = _Seen(np.array([0.0]), np.array([eps]), margins)
        return float(
            _recomputed(columns, rollout, np.ones(1, np.bool_), 1.0, 6, params, 4, seen)[0]
        )

    both = math.log(math.exp(1.0) / (math.exp(1.0) + math.exp(0.9)))
    assert recomputed(0.01) == pytest.approx(both, abs=1e-6)
    assert recomputed(0.1) == 0.0


def _near_the_floor(seed: int, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose k-th largest ``z`` has neighbours one fp32 step below it in ``x`` (which
    ``x / T`` can round onto it), ties, ``-inf`` columns, and masks that keep a column just
    below the floor, drop one at it, or are the rules' support."""
    x, mask = _logits(seed), _masks(_logits(seed), seed)
    rng = np.random.default_rng(seed)
    for row in range(ROWS):
        kth = np.sort(x[row])[-K]
        below = np.flatnonzero(x[row] < kth)
        chosen = rng.choice(below, 4, replace=False)
        x[row, chosen[:2]] = np.nextafter(kth, -np.inf, dtype=np.float32)
        x[row, chosen[2]] = kth
        x[row, chosen[3]] = -np.inf
        if row % 4 == 1:
            mask[row, chosen[0]] = True  # kept just below the floor
        elif row % 4 == 2:
            mask[row, np.flatnonzero(x[row] >= kth)[-1]] = False
    return x, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("temperature", [0.7, 1.0, 3.0])
@pytest.mark.parametrize("params", [PARAMS, {"top_k": K, "min_p": 0.05}, {"top_k": 40}])
def test_the_screened_columns_classify_as_in_the_whole_row(
    seed: int, temperature: float, params: dict
) -> None:
    x, mask = _near_the_floor(seed, temperature)
    margins = support_margins("fp32", V, num_shards=2)
    if seed == 2:  # wide margins: many top-p decisions open
        margins = SupportMargins(0.05, 0.05, margins.arg_rel, 0.05, margins.abs_error, margins.unit)
    whole = classify_support(
        x, margins=margins, real_vocab_size=V, temperature=temperature, **params
    )  # fmt: skip
    row, ids = np.nonzero(mask)
    narrowed = screened_columns(x, row, ids, V, temperature, params["top_k"])
    assert narrowed is not None
    z, columns = narrowed
    c = classify_support(z, margins=margins, real_vocab_size=z.shape[1], row_width=V, **params)
    seen = 0
    for r in range(ROWS):
        picked = columns[r] >= 0
        where = columns[r, picked]
        assert mask[r, where].sum() == mask[r].sum()  # every kept id is among them
        assert c.z[r, picked].tolist() == whole.z[r, where].tolist()
        assert c.certainly_in[r, picked].tolist() == whole.certainly_in[r, where].tolist()
        assert c.certainly_out[r, picked].tolist() == whole.certainly_out[r, where].tolist()
        assert c.certainly_out[r, ~picked].all()  # the -inf padding
        rest = np.ones(V, dtype=np.bool_)
        rest[where] = False
        assert whole.certainly_out[r, rest].all() and not whole.certainly_in[r, rest].any()
        seen += int((~whole.certainly_in[r, where] & ~whole.certainly_out[r, where]).any())
    if seed == 2 and params is PARAMS:  # the wide margins leave top-p decisions open
        assert seen


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("temperature", [0.7, 3.0])
def test_the_masks_are_screened_as_on_the_whole_rows(
    seed: int, temperature: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    x, mask = _near_the_floor(seed, temperature)
    counts = mask.sum(axis=1)
    rollout = EngineRollout(
        engine="test",
        token_ids=np.argmax(mask, axis=1),
        logprobs=None,
        support=SupportSpec(
            kept_offsets=np.concatenate([[0], np.cumsum(counts)]),
            kept_ids=np.concatenate([np.flatnonzero(m) for m in mask]),
        ),
        has_mask=np.ones(ROWS, dtype=np.bool_),
    )
    columns = [torch.from_numpy(x[:, : V // 2]), torch.from_numpy(x[:, V // 2 :])]
    margins = support_margins("fp32", V, num_shards=2)
    found = screen_masks(columns, rollout, margins, V, temperature, PARAMS, 5)
    monkeypatch.setattr(support_module, "screened_columns", lambda *args: None)
    whole = screen_masks(columns, rollout, margins, V, temperature, PARAMS, 5)
    assert found == whole
    assert 0 < len(found) < ROWS or temperature != T  # the rules' masks are at T
    assert any("not an upper set" in d or "which the rules" in d for d in found.values())
