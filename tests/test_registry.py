"""Capabilities and capability-gated dispatch."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

import tp_logprob as tpl
from tests.helpers.contracts import make_contract, make_sharding
from tp_logprob.kernels.builtin import TORCH_NATIVE
from tp_logprob.registry import detect_platform


def capability(backend_id: str = "mine", **overrides: Any) -> tpl.LogprobBackendCapability:
    fields: dict[str, Any] = {
        "backend_id": backend_id,
        "roles": {"train", "infer"},
        "dtypes": {"bf16", "fp16", "fp32"},
        "supports_vocab_padding": True,
        "mask_modes": {"explicit_active_mask"},
        "exports_vocab_lse": True,
        "determinism_scopes": {"fixed_topology"},
    }
    fields.update(overrides)
    return tpl.LogprobBackendCapability(**fields)


def op_named(name: str) -> Callable[[], Callable[..., str]]:
    def factory() -> Callable[..., str]:
        return lambda *args, **kwargs: name

    return factory


def tp1_contract(**overrides: Any) -> tpl.LogprobContract:
    sharding = make_sharding(tp_world_size=1, vocab_shard_bounds=((0, 8),))
    return make_contract(sharding=sharding, **overrides)


INVALID_CAPABILITY = [
    pytest.param({"roles": set()}, "roles=set(): must not be empty", id="empty-roles"),
    pytest.param({"dtypes": []}, "dtypes=[]: must not be empty", id="empty-dtypes"),
    pytest.param(
        {"determinism_scopes": ()}, "determinism_scopes=(): must not be empty", id="empty-scopes"
    ),
    pytest.param({"roles": 3}, "roles=3: expected an iterable", id="roles-not-iterable"),
    pytest.param({"roles": "train"}, "roles='train': expected an iterable", id="roles-str"),
    pytest.param({"dtypes": {"fp64"}}, "dtypes item='fp64'", id="bad-dtype"),
    pytest.param({"mask_modes": None}, "mask_modes=None", id="mask-modes-none"),
    pytest.param({"mask_modes": {"dense"}}, "mask_modes item='dense'", id="bad-mask-mode"),
    pytest.param({"tp_world_sizes": {0}}, "tp_world_sizes item=0", id="tp-zero"),
    pytest.param({"tp_world_sizes": {True}}, "tp_world_sizes item=True", id="tp-bool"),
    pytest.param({"tp_world_sizes": set()}, "tp_world_sizes=set(): must not be empty", id="tp-0"),
    pytest.param({"supports_vocab_padding": 1}, "supports_vocab_padding=1", id="padding-int"),
    pytest.param({"exports_vocab_lse": "yes"}, "exports_vocab_lse='yes'", id="lse-str"),
    pytest.param({"implementation_kind": "fast"}, "implementation_kind='fast'", id="kind"),
    pytest.param({"backend_id": "   "}, "backend_id='   ': must not be blank", id="blank-id"),
    pytest.param({"backend_id": 7}, "backend_id=7: expected a str", id="int-id"),
    pytest.param(
        {"determinism_scopes": {"cross_platform_bitwise"}},
        "bitwise_platforms=frozenset(): a cross_platform_bitwise backend names",
        id="platform-scope-without-platforms",
    ),
    pytest.param(
        {"bitwise_platforms": {"cpu"}},
        "bitwise_platforms=['cpu']: only a backend claiming",
        id="platforms-without-scope",
    ),
    pytest.param(
        {"determinism_scopes": {"cross_platform_bitwise"}, "bitwise_platforms": {"tpu"}},
        "bitwise_platforms={'tpu'}: 'tpu' not one of",
        id="unknown-platform",
    ),
    pytest.param(
        {"determinism_scopes": {"cross_platform_bitwise"}, "bitwise_platforms": "cpu"},
        "bitwise_platforms='cpu': expected a set of platforms",
        id="platforms-str",
    ),
]


@pytest.mark.parametrize(("overrides", "message"), INVALID_CAPABILITY)
def test_invalid_capability_names_field(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(tpl.LogprobContractError, match=re.escape(message)):
        capability(**overrides)


@pytest.mark.parametrize("word", ["auto", "AUTO", " Production ", "reference", "Deterministic"])
def test_backend_id_may_not_shadow_a_policy(word: str) -> None:
    with pytest.raises(tpl.LogprobContractError, match="shadows the dispatch policy"):
        capability(word)


def test_backend_id_is_stripped() -> None:
    assert capability("  mine \n").backend_id == "mine"


def test_incompatibilities_lists_every_reason() -> None:
    narrow = capability(
        roles={"infer"},
        dtypes={"fp32"},
        tp_world_sizes={1},
        supports_vocab_padding=False,
        mask_modes={"ignore_index"},
        exports_vocab_lse=False,
    )
    reasons = narrow.incompatibilities(make_contract(reduction=tpl.ReductionSpec()))
    assert len(reasons) == 7, reasons
    joined = "\n".join(reasons)
    for fragment in (
        "role 'train'",
        "dtype 'bf16'",
        "tp_world_size 2",
        "padding",
        "explicit_active_mask",
    ):
        assert fragment in joined
    assert "export_lse" in joined and "cross_tp_bitwise" in joined


def test_temperature_entropy_and_mask_mode_rejections_name_the_field() -> None:
    plain = capability(mask_modes={"ignore_index"})
    contract = make_contract(reduction=tpl.ReductionSpec("fixed_topology"))
    hot = dataclasses.replace(contract, temperature=0.6, export_entropy=True)
    reasons = "\n".join(plain.incompatibilities(hot))
    assert "temperature=0.6 requested but supports_temperature=False" in reasons
    assert "export_entropy requested but exports_entropy=False" in reasons
    assert "inactive tokens, whose targets need not hold ignore_index" in reasons
    able = capability(supports_temperature=True, exports_entropy=True)
    assert able.incompatibilities(hot) == ()
    all_active = dataclasses.replace(contract, mask=tpl.MaskSpec(contract.num_tokens))
    assert plain.incompatibilities(dataclasses.replace(all_active, temperature=1.0)) == ()


def test_cross_tp_bitwise_serves_fixed_topology_but_not_back() -> None:
    strong = capability(determinism_scopes={"cross_tp_bitwise"})
    weak = capability(determinism_scopes={"fixed_topology"})
    fixed = make_contract()
    bitwise = make_contract(reduction=tpl.ReductionSpec("cross_tp_bitwise"))
    assert strong.supports(fixed) and strong.supports(bitwise)
    assert weak.supports(fixed) and not weak.supports(bitwise)


def test_cross_platform_bitwise_is_the_strongest_scope_and_needs_its_platforms() -> None:
    portable = capability(
        determinism_scopes={"cross_platform_bitwise"}, bitwise_platforms={"cpu", "cuda"}
    )
    for scope in tpl.DeterminismScope:
        assert portable.supports(make_contract(reduction=tpl.ReductionSpec(scope))), scope
    across = make_contract(reduction=tpl.ReductionSpec("cross_platform_bitwise"))
    assert not capability(determinism_scopes={"cross_tp_bitwise"}).supports(across)
    assert portable.to_dict()["bitwise_platforms"] == ["cpu", "cuda"]
    registry = tpl.KernelRegistry()
    registry.register_logprob_backend("cuda", op_named("portable"), portable)
    with pytest.raises(tpl.LogprobContractError, match=r"platform='rocm': 'mine' claims"):
        registry.register_logprob_backend("rocm", op_named("portable"), portable)
    assert registry.backends("rocm") == ()


def test_run_to_run_is_the_weakest_scope() -> None:
    loose = capability(determinism_scopes={"run_to_run"})
    for scope, served in (
        ("run_to_run", True),
        ("fixed_topology", False),
        ("cross_tp_bitwise", False),
    ):
        contract = make_contract(reduction=tpl.ReductionSpec(scope))
        assert loose.supports(contract) is served, scope
        assert capability(determinism_scopes={"fixed_topology"}).supports(contract) is (
            scope != "cross_tp_bitwise"
        )
    reasons = loose.incompatibilities(make_contract())
    assert "determinism scope 'fixed_topology' not met by ['run_to_run']" in reasons


def test_all_active_backends_serve_exactly_the_contracts_without_inactive_tokens() -> None:
    no_mask = capability(mask_modes={"all_active"})
    contract = make_contract(reduction=tpl.ReductionSpec("fixed_topology"))
    assert contract.mask.active_token_count < contract.num_tokens
    assert "explicit_active_mask" in "\n".join(no_mask.incompatibilities(contract))
    every = dataclasses.replace(contract, mask=tpl.MaskSpec(contract.num_tokens))
    assert no_mask.supports(every)
    assert no_mask.to_dict()["mask_modes"] == ["all_active"]


def test_fused_triton_backends_claim_run_to_run_only_on_rocm() -> None:
    pytest.importorskip("triton")
    from tp_logprob.kernels.builtin import register_fused_backends

    registry = tpl.KernelRegistry()
    register_fused_backends(registry)
    scopes = {
        (platform, cap.backend_id): {s.value for s in cap.determinism_scopes}
        for platform in ("cuda", "rocm")
        for cap in registry.backends(platform)
    }
    assert scopes[("cuda", "triton_fused")] == {"fixed_topology"}
    assert scopes[("cuda", "triton_fused_exact_sum")] == {"cross_tp_bitwise"}
    assert scopes[("rocm", "triton_fused")] == {"run_to_run"}
    assert scopes[("rocm", "triton_fused_exact_sum")] == {"run_to_run"}
    assert scopes[("rocm", "torch_native_fused")] == {"fixed_topology"}


def test_served_values_answer_per_contract_dimension() -> None:
    assert TORCH_NATIVE.served_values("role") == set(tpl.LogprobRole)
    assert TORCH_NATIVE.served_values("tp_world_size") is None  # any TP degree
    assert TORCH_NATIVE.served_values("temperature") is None
    assert TORCH_NATIVE.served_values("allow_tf32") == {False}
    assert TORCH_NATIVE.served_values("determinism_scope") == {"run_to_run", "fixed_topology"}
    narrow = capability(
        tp_world_sizes={2},
        supports_vocab_padding=False,
        mask_modes={"all_active"},
        even_shards_only=True,
    )
    assert narrow.served_values("tp_world_size") == {2}
    assert narrow.served_values("vocab_padding") == {False}
    assert narrow.served_values("temperature") == {1.0}
    assert narrow.served_values("mask_mode") == {tpl.MaskMode.IGNORE_INDEX}
    assert narrow.served_values("even_layout") == {True}
    assert narrow.serves("tp_world_size", 2) and not narrow.serves("tp_world_size", 4)
    assert narrow.serves("temperature", 1.0) and not narrow.serves("temperature", 0.7)


def test_each_rule_serves_values_of_its_domain_and_explains_the_rest() -> None:
    from tp_logprob.capability import CAPABILITY_RULES

    # train bf16, TP=2 with padding and an inactive token, cross_tp_bitwise
    contract = make_contract(reduction=tpl.ReductionSpec())
    for cap in (TORCH_NATIVE, capability(roles={"infer"}, dtypes={"fp32"}, tp_world_sizes={1})):
        for rule in CAPABILITY_RULES:
            served = rule.served(cap)
            if rule.domain is not None:
                assert served is not None and served <= set(rule.domain), rule.dimension
            refusal = rule.refusal(cap, contract)
            assert (refusal is None) is cap.serves(rule.dimension, rule.value_of(contract))
            assert refusal is None or refusal in cap.incompatibilities(contract)


@pytest.mark.parametrize("dimension", ["roles", "", None])
def test_an_unknown_dimension_names_the_known_ones(dimension: object) -> None:
    with pytest.raises(tpl.LogprobContractError, match=r"dimension=.*expected one of input_kind"):
        TORCH_NATIVE.serves(dimension, "train")  # type: ignore[arg-type]


def test_register_twice_needs_replace() -> None:
    registry = tpl.KernelRegistry()
    registry.register_logprob_backend("cpu", op_named("a"), capability())
    with pytest.raises(tpl.LogprobContractError, match="already registered on platform='cpu'"):
        registry.register_logprob_backend("cpu", op_named("b"), capability())
    registry.register_logprob_backend("cpu", op_named("b"), capability(), replace=True)
    registry.register_logprob_backend("cuda", op_named("c"), capability())
    assert registry.get_logprob_op(tp1_contract(), "mine", platform="cpu").op() == "b"


def test_unknown_platform_and_bad_arguments() -> None:
    registry = tpl.KernelRegistry()
    with pytest.raises(tpl.LogprobContractError, match="platform='tpu'"):
        registry.register_logprob_backend("tpu", op_named("a"), capability())
    with pytest.raises(tpl.LogprobContractError, match="platform='tpu'"):
        registry.backends("tpu")
    with pytest.raises(tpl.LogprobContractError, match="factory=3"):
        registry.register_logprob_backend("cpu", 3, capability())  # type: ignore[arg-type]
    with pytest.raises(tpl.LogprobContractError, match="capability="):
        registry.register_logprob_backend("cpu", op_named("a"), {"id": 1})  # type: ignore[arg-type]
    with pytest.raises(tpl.LogprobContractError, match="contract="):
        registry.get_logprob_op("contract", platform="cpu")  # type: ignore[arg-type]


def test_capabilities_are_per_platform() -> None:
    registry = tpl.KernelRegistry()
    registry.register_logprob_backend("cuda", op_named("gpu"), capability(dtypes={"bf16"}))
    registry.register_logprob_backend("cpu", op_named("cpu"), capability(dtypes={"fp32"}))
    assert registry.get_logprob_op(tp1_contract(), platform="cuda").op() == "gpu"
    with pytest.raises(tpl.LogprobDispatchError, match="dtype 'bf16' not in \\['fp32'\\]"):
        registry.get_logprob_op(tp1_contract(), platform="cpu")
    assert [c.dtypes for c in registry.backends("rocm")] == []


def test_deterministic_is_not_a_backend() -> None:
    with pytest.raises(tpl.LogprobContractError, match=r"ReductionSpec\(determinism_scope"):
        tpl.KernelRegistry().get_logprob_op(tp1_contract(), "deterministic", platform="cpu")


@pytest.mark.parametrize("policy", ["auto", "production", "reference"])
def test_policy_with_tp_needs_preflight(policy: str) -> None:
    registry = tpl.KernelRegistry()
    registry.register_logprob_backend("cpu", op_named("a"), capability())
    with pytest.raises(tpl.LogprobDispatchError, match="preflighted=True"):
        registry.get_logprob_op(make_contract(), policy, platform="cpu")


def test_preflighted_auto_and_explicit_id_dispatch_with_tp() -> None:
    registry = tpl.KernelRegistry()
    registry.register_logprob_backend("cpu", op_named("a"), capability())
    assert registry.get_logprob_op(make_contract(), platform="cpu", preflighted=True).op() == "a"
    assert registry.get_logprob_op(make_contract(), "mine", platform="cpu").op() == "a"


def test_auto_prefers_production_and_records_fallback() -> None:
    registry = tpl.KernelRegistry()
    reference = capability("ref", implementation_kind="reference")
    registry.register_logprob_backend("cpu", op_named("ref"), reference)
    registry.register_logprob_backend("cpu", op_named("fast"), capability("fast", dtypes={"fp32"}))
    result = registry.get_logprob_op(tp1_contract(), platform="cpu")
    assert result.op() == "ref"
    provenance = result.provenance
    assert provenance.fallback is True
    assert provenance.rejected == (("fast", ("dtype 'bf16' not in ['fp32']",)),)
    assert provenance.selected["backend_id"] == "ref"
    assert provenance.contract == tp1_contract().to_dict()
    assert provenance.to_dict()["rejected"][0]["backend_id"] == "fast"
    fits = registry.get_logprob_op(tp1_contract(dtype="fp32"), platform="cpu")
    assert fits.op() == "fast" and not fits.provenance.fallback


def test_policy_exclusions_are_not_fallbacks() -> None:
    registry = tpl.KernelRegistry()
    reference = capability("ref", implementation_kind="reference")
    registry.register_logprob_backend("cpu", op_named("ref"), reference)
    registry.register_logprob_backend("cpu", op_named("fast"), capability("fast"))
    result = registry.get_logprob_op(tp1_contract(), "reference", platform="cpu")
    assert result.op() == "ref"
    assert result.provenance.fallback is False and result.provenance.rejected == ()


def test_production_request_never_reports_reference_backends() -> None:
    registry = tpl.KernelRegistry()
    reference = capability("ref", implementation_kind="reference")
    registry.register_logprob_backend("cpu", op_named("ref"), reference)
    registry.register_logprob_backend("cpu", op_named("f"), capability("f", dtypes={"fp32"}))
    with pytest.raises(tpl.LogprobDispatchError) as error:
        registry.get_logprob_op(tp1_contract(), "production", platform="cpu")
    assert "f:" in str(error.value) and "ref" not in str(error.value)


def test_no_backend_lists_every_candidate_and_reason() -> None:
    registry = tpl.KernelRegistry()
    registry.register_logprob_backend("cpu", op_named("a"), capability("a", dtypes={"fp32"}))
    registry.register_logprob_backend("cpu", op_named("b"), capability("b", roles={"infer"}))
    with pytest.raises(tpl.LogprobDispatchError) as error:
        registry.get_logprob_op(tp1_contract(), platform="cpu")
    message = str(error.value)
    assert "a:\n    - dtype 'bf16' not in ['fp32']" in message
    assert "b:\n    - role 'train' not in ['infer']" in message


def test_unknown_backend_id_names_the_registered_ones() -> None:
    registry = tpl.KernelRegistry()
    registry.register_logprob_backend("cpu", op_named("a"), capability("a"))
    with pytest.raises(tpl.LogprobDispatchError, match=r"'zzz': not registered .*registered: a"):
        registry.get_logprob_op(tp1_contract(), "zzz", platform="cpu")


def test_failing_factory_is_recorded_skipped_and_not_retried() -> None:
    calls = []

    def broken() -> Callable[..., str]:
        calls.append(1)
        raise ImportError("no such kernel")

    registry = tpl.KernelRegistry()
    registry.register_logprob_backend("cpu", broken, capability("broken"))
    registry.register_logprob_backend("cpu", op_named("ok"), capability("ok"))
    for _ in range(3):
        result = registry.get_logprob_op(tp1_contract(), platform="cpu")
        assert result.op() == "ok"
        assert result.provenance.fallback is True
        (rejected,) = result.provenance.rejected
        assert rejected == ("broken", ("factory failed: ImportError: no such kernel",))
    assert len(calls) == 1
    assert registry.failures("cpu") == {"broken": "factory failed: ImportError: no such kernel"}


def test_factory_returning_non_callable_fails() -> None:
    registry = tpl.KernelRegistry()
    registry.register_logprob_backend("cpu", lambda: 42, capability("odd"))
    with pytest.raises(tpl.LogprobDispatchError, match="not callable"):
        registry.get_logprob_op(tp1_contract(), "odd", platform="cpu")


def test_default_registry_holds_torch_native_everywhere() -> None:
    for platform in ("cpu", "cuda", "rocm"):
        assert TORCH_NATIVE in tpl.registry.backends(platform)


def test_detect_platform_on_this_machine() -> None:
    import torch

    expected = "cpu" if not torch.cuda.is_available() else ("rocm" if torch.version.hip else "cuda")
    assert detect_platform() == expected


def test_import_does_not_import_torch_or_triton() -> None:
    code = (
        "import sys, tp_logprob; "
        "assert not {'torch', 'triton'} & set(sys.modules), 'heavy import'; "
        "print(len(tp_logprob.registry.backends('cpu')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) >= 1
