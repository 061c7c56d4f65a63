"""``exact_logsumexp`` and ``reference_logsumexp`` on ``[N, V]``: row for row the bits of the
1-D call (as ``torch.logsumexp(dim=-1)`` takes a batch), on the fast path and off it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from tp_logprob.oracle import exact_logsumexp, reference_logsumexp
from tp_logprob.oracle.fast_path import slow_path_only
from tp_logprob.strategies import round_to_dtype

LSE: dict[str, Callable[..., Any]] = {
    "exact": exact_logsumexp,
    "reference": reference_logsumexp,
}


def _rows(width: int, seed: int) -> np.ndarray:
    """Random rows with a NaN row, an all -inf row, a +inf row and a constant row."""
    rng = np.random.default_rng(seed)
    rows = (rng.normal(size=(6, width)) * 4).astype(np.float32)
    rows[1, width // 2] = np.nan
    rows[2, :] = -np.inf
    rows[3, -1] = np.inf
    rows[4, :] = 7.25
    return rows


def _bits(values: Any) -> list[int]:
    return np.asarray(values, dtype=np.float64).view(np.uint64).tolist()


@pytest.mark.parametrize("name", sorted(LSE))
@pytest.mark.parametrize("width", [1, 2, 17, 1000, 9000])
@pytest.mark.parametrize(
    "options",
    [{}, {"temperature": 0.7}, {"real_vocab_size": 1}],
    ids=["plain", "temperature", "padded"],
)
def test_a_batch_has_the_bits_of_its_rows(name: str, width: int, options: dict[str, Any]) -> None:
    lse = LSE[name]
    rows = _rows(width, seed=width)
    batch = lse(rows, **options)
    assert isinstance(batch, np.ndarray) and batch.shape == (rows.shape[0],)
    assert _bits(batch) == _bits([lse(row, **options) for row in rows])


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_wide_rows_on_and_off_the_fast_path(dtype: str) -> None:
    """Wide bf16 rows take the fast path's deduplicated route; the Ziv loop agrees."""
    rows = round_to_dtype(_rows(8192 + 5, seed=3), dtype)
    batch = exact_logsumexp(rows)
    with slow_path_only():
        slow = exact_logsumexp(rows)
    assert _bits(batch) == _bits([exact_logsumexp(row) for row in rows]) == _bits(slow)


def test_a_bfloat16_batch_is_taken_exactly() -> None:
    rows = _rows(300, seed=5).astype(ml_dtypes.bfloat16)
    assert _bits(exact_logsumexp(rows)) == _bits(exact_logsumexp(rows.astype(np.float64)))


def test_an_empty_batch_and_no_live_column() -> None:
    assert exact_logsumexp(np.zeros((0, 4), np.float32)).shape == (0,)
    assert exact_logsumexp(np.zeros((2, 4)), real_vocab_size=0).tolist() == [-np.inf, -np.inf]


@pytest.mark.parametrize("name", sorted(LSE))
@pytest.mark.parametrize("shape", [(), (2, 2, 2)], ids=["scalar", "3-D"])
def test_other_ranks_are_refused_with_the_shape(name: str, shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=r"row must be 1-D \(one row\) or 2-D \[N, V\]"):
        LSE[name](np.zeros(shape))
