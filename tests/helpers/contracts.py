"""Shared contract makers of the contract, registry and peer adapter tests."""

from __future__ import annotations

from typing import Any

import tp_logprob as tpl


def make_sharding(**overrides: object) -> tpl.ShardingSpec:
    fields: dict[str, object] = {
        "tp_rank": 0,
        "tp_world_size": 2,
        "vocab_shard_bounds": ((0, 5), (5, 8)),
        "real_vocab_size": 7,
        "padded_vocab_size": 8,
    }
    fields.update(overrides)
    return tpl.ShardingSpec(**fields)  # type: ignore[arg-type]


def make_contract(**overrides: object) -> tpl.LogprobContract:
    fields: dict[str, object] = {
        "role": "train",
        "dtype": "bf16",
        "mask": tpl.MaskSpec(num_tokens=3, active_mask=[True, False, True]),
        "sharding": make_sharding(),
        "reduction": tpl.ReductionSpec("fixed_topology"),
    }
    fields.update(overrides)
    return tpl.LogprobContract(**fields)  # type: ignore[arg-type]


def whole_vocabulary_hidden_contract(
    vocab: int, size: int, tokens: int, role: str = "infer", **fields: Any
) -> tpl.LogprobContract:
    """A TP=1 hidden-input contract over the whole vocabulary (``run_to_run``), as the
    library fused LM-head ops take; ``dtype`` and ``mask`` default to fp32 and all rows."""
    return whole_vocabulary_contract(
        vocab, tokens, role, input_kind="hidden", hidden_size=size, **fields
    )


def whole_vocabulary_contract(
    vocab: int, tokens: int, role: str = "infer", **fields: Any
) -> tpl.LogprobContract:
    """A TP=1 contract over the whole vocabulary (``run_to_run``), logits input unless
    ``fields`` say otherwise; ``dtype`` and ``mask`` default to fp32 and all rows."""
    sharding = tpl.ShardingSpec(0, 1, ((0, vocab),), vocab, vocab)
    return tpl.LogprobContract(
        role, fields.pop("dtype", "fp32"), fields.pop("mask", tpl.MaskSpec(tokens)), sharding,
        tpl.ReductionSpec("run_to_run"), **fields,
    )  # fmt: skip
