"""torch_native on a replayed mask reads the kept columns alone (``replayed_partial``) when
the full ``lse`` is not exported: bitwise the dense partial of ``z`` masked to ``-inf``, and
the op's outputs bitwise those it gives with the full ``lse`` (the dense path)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import tp_logprob as tpl
from tests.helpers.native_cases import LAYOUTS, PADDED, REAL, assert_same_bits
from tests.helpers.support_cases import support_contract
from tp_logprob.kernels.dtypes import TORCH_DTYPES
from tp_logprob.kernels.native import torch_native_logprob
from tp_logprob.kernels.partials import live_logits, sparse_tree_sum, tree_sum
from tp_logprob.kernels.processed import processed_partial, replayed_partial
from tp_logprob.kernels.support_mask import ReplayedSupport

SPECIALS = (float("nan"), float("inf"), float("-inf"))


def _case(
    seed: int, *, sampled: bool = False
) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, str, float]:
    """Logits (special values inside and outside the masks, a padding tail of NaN), a random
    mask per row (some empty, some full), targets inside it (``sampled``: every active one,
    as the op requires), outside it, or inactive, a dtype and a temperature."""
    rng = np.random.default_rng(seed)
    rows = int(rng.integers(1, 9))
    dtype = str(rng.choice(["fp32", "bf16", "fp16"]))
    scale = float(rng.choice([0.5, 4.0, 60.0]))
    logits = torch.from_numpy(rng.normal(0.0, scale, (rows, PADDED)).astype(np.float32))
    special = rng.random((rows, PADDED)) < rng.choice([0.0, 0.05])
    logits[torch.from_numpy(special)] = torch.tensor(
        rng.choice(SPECIALS, int(special.sum())), dtype=torch.float32
    )
    logits[:, REAL:] = float("nan")
    density = rng.random(rows)[:, None] * rng.choice([0.2, 1.0])
    keep = rng.random((rows, REAL)) < density
    keep[rng.random(rows) < 0.1] = True
    targets = torch.from_numpy(rng.integers(0, REAL, rows))
    # An active row needs a kept id; an inactive one may keep none.
    for row in np.flatnonzero(keep.any(axis=1) & (sampled | (rng.random(rows) < 0.5))):
        targets[row] = int(rng.choice(np.flatnonzero(keep[row])))
    targets[torch.from_numpy(~keep.any(axis=1) | (rng.random(rows) < 0.2))] = -100
    temperature = float(rng.choice([1.0, 0.7, 1.3]))
    return logits.to(TORCH_DTYPES[tpl.LogprobDType(dtype)]), targets, keep, dtype, temperature


@pytest.mark.parametrize("width", [1, 2, 3, 5, 64, 100, 1000, 4097])
def test_the_sparse_tree_is_the_dense_tree(width: int) -> None:
    rng = np.random.default_rng(width)
    for density in (0.0, 0.01, 0.3, 1.0):
        dense = torch.zeros(5, width)
        keep = torch.from_numpy(rng.random((5, width)) < density)
        dense[keep] = torch.from_numpy(np.exp(rng.normal(0, 8, int(keep.sum()))).astype(np.float32))
        rows, places = keep.nonzero(as_tuple=True)
        got = sparse_tree_sum(rows, places, dense[rows, places], 5, width)
        assert_same_bits(got, tree_sum(dense), f"width {width} density {density}")


@pytest.mark.parametrize("entropy", [False, True])
@pytest.mark.parametrize("layout", ["tp1", "tp3-uneven", "tp4-width1-padding", "tp8-mixed"])
@pytest.mark.parametrize("seed", range(12))
def test_the_kept_columns_give_the_dense_partial(seed: int, layout: str, entropy: bool) -> None:
    logits, targets, keep, dtype, temperature = _case(seed)
    mask = np.zeros((len(logits), PADDED), dtype=np.bool_)
    mask[:, :REAL] = keep
    support = tpl.SupportSpec.from_mask(mask)
    contract = support_contract(
        LAYOUTS[layout], support, num_tokens=len(logits), temperature=temperature,
        entropy=entropy, dtype=dtype, export_lse=False, active_mask=(targets >= 0).tolist(),
    )  # fmt: skip
    for rank, (begin, end) in enumerate(LAYOUTS[layout]):
        ranked = contract.with_rank(rank)
        local = logits[:, begin:end]
        replayed = ReplayedSupport(ranked, local.device)
        kept = replayed.keep()
        dense = processed_partial(live_logits(local, ranked), targets, ranked, kept)
        sparse = replayed_partial(local, targets, ranked, replayed, kept)
        for field in range(dense.shape[1]):
            assert_same_bits(sparse[:, field], dense[:, field], f"rank {rank} field {field}")


@pytest.mark.parametrize("layout", ["tp1", "tp3-uneven", "tp8-mixed"])
@pytest.mark.parametrize("seed", range(6))
def test_the_outputs_are_those_of_the_dense_path(seed: int, layout: str) -> None:
    """With the full ``lse`` exported the op takes the dense path: the other outputs agree
    bit for bit, and the gradient too."""
    logits, targets, keep, dtype, temperature = _case(100 + seed, sampled=True)
    mask = np.zeros((len(logits), PADDED), dtype=np.bool_)
    mask[:, :REAL] = keep
    contract = support_contract(
        LAYOUTS[layout], tpl.SupportSpec.from_mask(mask), num_tokens=len(logits),
        temperature=temperature, entropy=True, dtype=dtype, role="train", export_lse=False,
        active_mask=(targets >= 0).tolist(),
    )  # fmt: skip
    found = {}
    for export in (False, True):
        leaf = logits.clone().requires_grad_(True)
        result = tpl.run_tp(
            torch_native_logprob, leaf, targets, dataclasses.replace(contract, export_lse=export)
        )[0]
        weights = torch.where(torch.isfinite(result.selected_logp), 1.0, 0.0)
        loss = (result.selected_logp.nan_to_num(0.0) * weights).sum()
        loss = loss + result.entropy.nan_to_num(0.0, 0.0, 0.0).sum()
        loss.backward()
        found[export] = (result, leaf.grad)
    sparse, dense = found[False], found[True]
    for name in ("selected_logp", "entropy", "support_lse", "support_size"):
        assert_same_bits(getattr(sparse[0], name), getattr(dense[0], name), name)
    assert_same_bits(sparse[1].flatten(), dense[1].flatten(), "gradient")
