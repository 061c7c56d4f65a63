"""The merge forms selected_logp as (t - M) - log S, so huge logits keep their logprob.

``t - LSE`` in fp32 (or even fp64) returns 0.0 for a row of three equal logits
near 3e38, where the exact answer is -log 3: one ulp of LSE swamps it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.helpers.native_cases import LAYOUTS, make_contract
from tp_logprob.emulate import run_tp
from tp_logprob.kernels.native import torch_native_logprob
from tp_logprob.oracle import exact_selected_logprob


def _backends() -> dict[str, object]:
    ops: dict[str, object] = {"torch_native": torch_native_logprob}
    try:
        from tests.helpers.triton_cases import BACKENDS
    except pytest.skip.Exception:
        return ops
    return {**ops, **BACKENDS}


@pytest.mark.parametrize("backend", list(_backends()))
@pytest.mark.parametrize("layout", ["tp1", "tp3-uneven"])
def test_huge_equal_logits_keep_their_logprob(backend: str, layout: str) -> None:
    op = _backends()[backend]
    big = np.float32(3e38)
    logits = np.full((2, 24), -np.inf, dtype=np.float32)
    logits[0, [0, 11, 18]] = big  # three equal maxima on different ranks
    logits[1, [0, 11]] = big
    logits[1, 18] = np.float32(big) - np.float32(2.0**104)  # an ulp-scale gap below
    targets = np.array([11, 18])
    contract = make_contract(LAYOUTS[layout], num_tokens=2)
    result = run_tp(op, torch.from_numpy(logits), torch.from_numpy(targets), contract)[0]
    exact_selected, _ = exact_selected_logprob(logits, targets, real_vocab_size=19)
    got = result.selected_logp.double().numpy()
    assert got[0] == pytest.approx(-math.log(3.0), rel=1e-6)
    np.testing.assert_allclose(got, exact_selected, rtol=1e-6)
