"""The trainer's input forms the gradient checks hand a backend: the shifted slice of a
``[B, T + 1, D]`` leaf, flattened, or a strided layout of a buffer, with the gradient
read back on that leaf."""

from __future__ import annotations

import pytest
import torch

from tp_logprob.strategies import VALUE_FORMS
from tp_logprob.suite.running import caller_rows, caller_view, shifted_rows, trainer_view


@pytest.mark.parametrize(("rows", "batch", "view"), [(6, 2, False), (5, 1, True), (0, 1, True)])
def test_the_rows_sit_at_the_shifted_positions_of_a_3d_leaf(
    rows: int, batch: int, view: bool
) -> None:
    full = torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3)
    leaf, handed = trainer_view(full)
    assert leaf.shape == (batch, rows // batch + 1, 3) and leaf.is_leaf and leaf.requires_grad
    assert torch.equal(handed, full) and torch.equal(leaf[:, -1], torch.zeros(batch, 3))
    assert (handed._base is leaf) is view  # B = 1: a view of the leaf; B = 2: a copy


def test_the_gradient_reaches_the_leaf_through_the_view() -> None:
    full = torch.randn(6, 4)
    leaf, handed = trainer_view(full)
    (handed * torch.arange(4.0)).sum().backward()
    assert leaf.grad is not None
    rows = shifted_rows(leaf.grad)
    assert rows is not None and torch.equal(rows, torch.arange(4.0).expand(6, 4))


def test_a_gradient_on_the_dropped_position_is_refused() -> None:
    grad = torch.zeros(2, 4, 3)
    grad[1, -1, 0] = 1e-30
    assert shifted_rows(grad) is None


@pytest.mark.parametrize("form", VALUE_FORMS)
def test_a_callers_view_hands_the_rows_and_reads_their_gradient_back(form: str) -> None:
    full = torch.randn(4, 3)
    leaf, handed = caller_view(full, form)
    assert leaf.is_leaf and leaf.requires_grad and torch.equal(handed, full)
    assert leaf.dim() == (3 if form == "contiguous" else handed.dim() if form != "offset" else 1)
    (handed * torch.arange(3.0)).sum().backward()
    assert leaf.grad is not None
    rows = caller_rows(leaf.grad, handed)
    assert rows is not None and torch.equal(rows, torch.arange(3.0).expand(4, 3))


@pytest.mark.parametrize("form", [f for f in VALUE_FORMS[1:] if f != "column major"])
def test_a_gradient_outside_a_layouts_view_is_refused(form: str) -> None:
    """Every layout but column-major (whose view is its whole buffer) skips elements."""
    leaf, handed = caller_view(torch.randn(4, 3), form)
    grad = torch.zeros_like(leaf)
    outside = torch.ones_like(leaf, dtype=torch.bool)
    outside.as_strided(handed.shape, handed.stride(), handed.storage_offset()).fill_(False)
    grad[outside.nonzero()[0].tolist()] = 1e-30
    assert caller_rows(grad, handed) is None
