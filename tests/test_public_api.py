"""Each public module's ``__all__`` is exactly what it exposes (the documented public names)."""

from __future__ import annotations

import importlib
import types

import pytest

PUBLIC_MODULES = [
    "tp_logprob",
    "tp_logprob.oracle",
    "tp_logprob.rollout",
    "tp_logprob.strategies",
    "tp_logprob.testing",
]

DOCUMENTED_NAMES = {
    "tp_logprob": {
        "LogprobContract", "ShardingSpec", "MaskSpec", "ReductionSpec", "LogprobOutputSpec",
        "LogprobBackendCapability", "LogprobRole", "LogprobDType", "DeterminismScope",
        "MaskMode", "LogprobContractError", "LogprobDispatchError", "even_shard_bounds",
        "KernelRegistry", "registry", "LogprobDispatchResult", "LogprobResult", "comm",
        "run_tp", "preflight",
    },
    "tp_logprob.oracle": {
        "exact_logsumexp", "exact_selected_logprob", "exact_logprob_grad",
        "reference_selected_logprob",
    },
    "tp_logprob.rollout": {"check_rollout", "plot_rollout", "RolloutCheck", "RolloutInputError"},
    "tp_logprob.testing": {
        "assert_logprob_close", "assert_support_admissible", "assert_batch_invariant",
        "assert_bitwise_across_tp",
    },
}  # fmt: skip


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_matches_what_the_module_exposes(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(module.__all__)
    missing = {attr for attr in exported if not hasattr(module, attr)}
    assert not missing, f"{name}.__all__ names missing attributes: {sorted(missing)}"
    public = {
        attr
        for attr, value in vars(module).items()
        if not attr.startswith("_")
        and not isinstance(value, types.ModuleType)
        and getattr(value, "__module__", name).startswith("tp_logprob")
    }
    unlisted = public - exported
    assert not unlisted, f"{name} exposes names not in __all__: {sorted(unlisted)}"
    assert DOCUMENTED_NAMES.get(name, set()) <= exported


def test_contract_methods_named_by_the_design() -> None:
    import tp_logprob as tpl

    for method in ("with_rank", "cross_rank_fingerprint", "to_dict"):
        assert callable(getattr(tpl.LogprobContract, method))
    for method in ("register_logprob_backend", "get_logprob_op", "backends"):
        assert callable(getattr(tpl.KernelRegistry, method))
