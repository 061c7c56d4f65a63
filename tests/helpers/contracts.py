"""Shared contract makers of the contract and registry tests."""

from __future__ import annotations

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
