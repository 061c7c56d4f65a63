"""``assert_logprob_close``: exact values rounded to fp32 pass; one output off fails with a
message that says where, by how much and against what bound."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from tests.testing.helpers import batch, nudged
from tp_logprob.oracle import exact_processed_logprob
from tp_logprob.support import SupportSpec
from tp_logprob.testing import assert_logprob_close

MASK = np.array([True, False, True, True, False, True])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize(
    "options",
    [{}, {"temperature": 0.7}, {"real_vocab_size": 40}, {"active_mask": MASK}],
    ids=["plain", "temperature", "padded", "masked"],
)
def test_exact_outputs_pass(dtype: str, options: dict[str, object]) -> None:
    b = batch(dtype=dtype, **options)
    assert_logprob_close(
        b.selected, b.logits, b.targets, lse=b.lse, entropy=b.entropy, grad=b.grad, **b.options
    )


def test_torch_tensors_pass_as_a_kernel_returns_them() -> None:
    b = batch(dtype="bf16")
    logits = torch.from_numpy(b.logits).to(torch.bfloat16)
    assert_logprob_close(
        torch.from_numpy(b.selected),
        logits,
        torch.from_numpy(b.targets),
        lse=torch.from_numpy(b.lse),
        grad=torch.from_numpy(b.grad).to(torch.bfloat16),
        dtype="bf16",
    )


def test_per_rank_shards_are_joined_along_the_vocabulary() -> None:
    b = batch(width=48)
    shards = [b.logits[:, :20], b.logits[:, 20:32], b.logits[:, 32:]]
    grads = [b.grad[:, :20], b.grad[:, 20:32], b.grad[:, 32:]]
    assert_logprob_close(b.selected, None, b.targets, lse=b.lse, grad=grads, tp_shards=shards)
    with pytest.raises(AssertionError, match=r"bounds=\[\(0, 20\), \(20, 32\), \(32, 48\)\]"):
        assert_logprob_close(nudged(b.selected, 2, 400), None, b.targets, tp_shards=shards)


def test_a_value_a_few_ulps_off_passes_and_a_far_one_fails() -> None:
    b = batch()
    assert_logprob_close(nudged(b.selected, 1, 2), b.logits, b.targets, lse=nudged(b.lse, 1, 2))
    with pytest.raises(AssertionError):
        assert_logprob_close(b.selected, b.logits, b.targets, lse=nudged(b.lse, 1, 400))


def _message(**outputs: object) -> str:
    b = batch()
    given = {"lse": b.lse, "entropy": b.entropy, "grad": b.grad}
    given.update(outputs)
    selected = given.pop("selected_logp", b.selected)
    with pytest.raises(AssertionError) as failure:
        assert_logprob_close(selected, b.logits, b.targets, backend="my_kernel", **given)
    return str(failure.value)


def test_a_selected_logp_failure_names_row_column_values_ulps_and_bound() -> None:
    b = batch()
    text = _message(selected_logp=nudged(b.selected, 4, 300))
    assert text.startswith("assert_logprob_close: output outside the tolerance table")
    assert "backend   my_kernel" in text
    target = int(b.targets[4])
    assert f"selected_logp, row 4 (active), column {target} (target)" in text
    assert f"observed  {float(nudged(b.selected, 4, 300)[4])!r}" in text
    assert "[exact]" in text
    assert re.search(r"error     [\d.]+ ulp .*; tolerance [\d.]+ ulp", text)


def test_an_lse_failure_names_its_row() -> None:
    b = batch()
    text = _message(lse=nudged(b.lse, 2, -500))
    assert "worst     lse, row 2 (active), all live columns; rows out of tolerance: [2]" in text


def test_an_entropy_failure_names_its_row() -> None:
    b = batch()
    text = _message(entropy=nudged(b.entropy, 5, 5000))
    assert "worst     entropy, row 5 (active), all live columns" in text


def test_a_gradient_failure_names_row_and_column() -> None:
    b = batch()
    off = nudged(b.grad, (3, 11), 5000)
    text = _message(grad=off)
    assert text.startswith("assert_logprob_close: gradient outside its bound")
    assert "worst     row 3, column 11 (" in text
    assert f"observed  {float(off[3, 11])!r}" in text
    assert re.search(r"error     [\d.]+ ulp of fp32; bound [\d.e+-]+ absolute \([\d.]+ ulp\)", text)


def test_an_inactive_row_must_be_exactly_zero() -> None:
    b = batch(active_mask=MASK)
    selected = b.selected.copy()
    selected[1] = -0.0
    with pytest.raises(AssertionError, match=r"row 1 \(inactive\).*\n.*\n.*\n.*exactly \+0.0"):
        assert_logprob_close(selected, b.logits, b.targets, active_mask=MASK)


def test_nan_must_meet_nan() -> None:
    b = batch()
    logits = b.logits.copy()
    logits[0, 3] = np.nan
    selected = b.selected.copy()
    selected[0] = np.nan
    assert_logprob_close(selected, logits, b.targets)
    with pytest.raises(AssertionError, match=r"selected_logp, row 0"):
        assert_logprob_close(b.selected, logits, b.targets)


def test_a_replayed_support_judges_selected_on_it_and_lse_on_the_row() -> None:
    b = batch(rows=3, width=16)
    kept = [sorted({int(b.targets[r]), 0, 5, 9}) for r in range(3)]
    support = SupportSpec.from_kept_lists(kept)
    mask = support.dense(16)
    selected, _, lse = exact_processed_logprob(b.logits, b.targets, mask)
    assert_logprob_close(
        selected.astype(np.float32), b.logits, b.targets, lse=lse.astype(np.float32),
        support=support,
    )  # fmt: skip
    with pytest.raises(AssertionError, match=r"exact values on the support") as failure:
        assert_logprob_close(b.selected, b.logits, b.targets, support=support)
    assert "replayed mask: row" in str(failure.value)


def test_row_lists_name_the_first_rows_and_their_count() -> None:
    b = batch(rows=64, width=16)
    with pytest.raises(AssertionError) as failure:
        assert_logprob_close(nudged(b.selected, 40, 400), b.logits, b.targets)
    shapes = next(line for line in str(failure.value).splitlines() if "shapes" in line)
    assert "(active rows [0, 1, 2, 3, 4, 5, 6, 7, ...] (64 rows))" in shapes
    off = np.array(b.selected)
    off[10:50] -= 1.0
    with pytest.raises(AssertionError) as failure:
        assert_logprob_close(off, b.logits, b.targets)
    assert "rows out of tolerance: [10, 11, 12, 13, 14, 15, 16, 17, ...] (40 rows)" in str(
        failure.value
    )
    small = batch(rows=3, width=16)
    with pytest.raises(AssertionError, match=r"\(active rows \[0, 1, 2\]\)"):
        assert_logprob_close(nudged(small.selected, 1, 400), small.logits, small.targets)
