"""A Liger adapter's call leaves the process's warnings filters alone.

Python's warnings filters are the whole process's (before 3.14's context-aware
warnings): a filter a call set for itself would silence a user's thread meanwhile, and
its restore on exit would drop a filter the user set during the call. The Triton
interpreter's numpy warnings (an all-NaN block on a NaN row) reach the caller's own
filters instead. The library is replaced by a stand-in that records the filters it
runs under, so these tests need neither Liger nor Triton.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import tp_logprob as tpl
from tp_logprob.peers import liger, liger_fused, liger_vocab_parallel

VOCAB, SIZE, TOKENS = 8, 4, 3


class _Filters:
    """The warnings filters each library call ran under."""

    def __init__(self) -> None:
        self.seen: list[tuple[object, list[Any]]] = []

    def record(self) -> None:
        self.seen.append((warnings.filters, list(warnings.filters)))

    def assert_untouched(self, calls: int) -> None:
        assert len(self.seen) == calls
        for filters, entries in self.seen:
            assert filters is warnings.filters
            assert entries == list(warnings.filters)


def _contract(**fields: Any) -> tpl.LogprobContract:
    sharding = tpl.ShardingSpec(0, 1, ((0, VOCAB),), VOCAB, VOCAB)
    return tpl.LogprobContract(
        "infer", "fp32", tpl.MaskSpec(TOKENS), sharding, tpl.ReductionSpec("fixed_topology"),
        **fields,
    )  # fmt: skip


def test_liger_ce(monkeypatch: pytest.MonkeyPatch) -> None:
    filters = _Filters()

    class Function:
        @staticmethod
        def apply(logits: torch.Tensor, *_: Any) -> tuple[torch.Tensor]:
            filters.record()
            return (torch.zeros(logits.shape[0]),)

    monkeypatch.setattr(liger, "_liger_function", lambda device: (Function, (0, 8, 5)))
    logits = torch.randn(TOKENS, VOCAB)
    liger.liger_logprob(logits, torch.tensor([0, 1, 2]), _contract())
    filters.assert_untouched(calls=2)


def test_liger_fused(monkeypatch: pytest.MonkeyPatch) -> None:
    filters = _Filters()

    class Function:
        @staticmethod
        def apply(hidden: torch.Tensor, *_: Any) -> tuple[torch.Tensor, None, None, torch.Tensor]:
            filters.record()
            rows = hidden.shape[0]
            return torch.zeros(rows), None, None, torch.zeros(rows, dtype=torch.int64)

    monkeypatch.setattr(liger_fused, "_liger_function", lambda device: (Function, (0, 8, 5)))
    hidden, weight = torch.randn(TOKENS, SIZE), torch.randn(VOCAB, SIZE)
    contract = _contract(input_kind="hidden", hidden_size=SIZE)
    liger_fused.liger_fused_logprob(hidden, torch.tensor([0, 1, 2]), contract, weight=weight)
    filters.assert_untouched(calls=2)


def test_liger_vocab_parallel(monkeypatch: pytest.MonkeyPatch) -> None:
    filters = _Filters()

    def module(logits: torch.Tensor, targets: torch.Tensor, group: Any) -> torch.Tensor:
        filters.record()
        return torch.zeros(logits.shape[0], 1)

    monkeypatch.setattr(liger_vocab_parallel, "_module", lambda ignore_index, mode: module)
    logits = torch.randn(TOKENS, VOCAB)
    liger_vocab_parallel.liger_vocab_parallel_logprob(logits, torch.tensor([0, 1, 2]), _contract())
    filters.assert_untouched(calls=2)
