"""The conformance catalog names real variants, each one claim away from its honest backend."""

from __future__ import annotations

import dataclasses
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from tools.conformance.catalog import COLUMNS, PEERS, PROCESSED_PEERS, REAL_GROUP
from tools.conformance.processed_section import processed_tests

from tp_logprob.capability import LogprobBackendCapability
from tp_logprob.support import SupportMode

ROOT = Path(__file__).resolve().parents[2]
LIBRARIES = (
    *("liger_kernel", "megatron", "trl", "transformers", "vllm", "verl", "ray", "sglang"),
    *("openrlhf", "deepspeed", "flash_attn", "cut_cross_entropy"),
)
CELLS = [(peer, key, cell) for peer in PEERS for key, cell in peer.cells.items()]


def _pair(module: str, attr: str) -> tuple[object, LogprobBackendCapability]:
    return getattr(importlib.import_module(f"tp_logprob.peers.{module}"), attr)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("peer", "key", "cell"), CELLS, ids=[f"{peer.name}-{key}" for peer, key, _ in CELLS]
)
def test_every_cell_names_a_backend_or_says_why_not(peer, key, cell) -> None:  # type: ignore[no-untyped-def]
    assert key in dict(COLUMNS)
    if cell.attr is None:
        assert cell.note and cell.explanation is None
        return
    op, capability = _pair(peer.module, cell.attr)
    assert callable(op) and isinstance(capability, LogprobBackendCapability)
    assert capability.backend_id.split(".")[0] == peer.name
    for explanation in [cell.explanation, cell.crash, *dict(cell.by_property).values()]:
        if explanation is not None and explanation.reproducer is not None:
            assert (ROOT / explanation.reproducer).is_file(), explanation.reproducer


def test_backend_ids_are_unique() -> None:
    """Across the emulated columns; the real-group column runs one of them again."""
    ids = [_pair(p.module, c.attr)[1].backend_id for p, k, c in CELLS if c.attr and k != REAL_GROUP]
    assert len(ids) == len(set(ids))
    for peer in PEERS:
        cell = peer.cells[REAL_GROUP]
        if cell.attr is not None and cell.attr != "library":
            assert cell.attr in {c.attr for k, c in peer.cells.items() if k != REAL_GROUP}


@pytest.mark.parametrize(
    ("module", "attr", "field"),
    [
        ("liger", "assume_padding", "supports_vocab_padding"),
        ("liger_fused", "assume_padding", "supports_vocab_padding"),
        ("liger_fused", "assume_16bit", "dtypes"),
        ("cce", "assume_16bit", "dtypes"),
        ("cce", "assume_batch_invariant", "determinism_scopes"),
        ("megatron", "assume_cross_tp_bitwise", "determinism_scopes"),
        ("megatron", "assume_uneven_shards", "even_shards_only"),
        ("torch_loss_parallel", "assume_inactive_tokens", "mask_modes"),
        ("trl", "assume_16bit", "dtypes"),
        ("verl", "assume_16bit", "dtypes"),
        ("openrlhf", "assume_16bit", "dtypes"),
        ("openrlhf", "assume_inactive_tokens", "mask_modes"),
        ("liger_vocab_parallel", "assume_padding", "supports_vocab_padding"),
        ("liger_ppo", "assume_16bit", "dtypes"),
        ("liger_ppo", "assume_batch_invariant", "determinism_scopes"),
        ("trl_kernel", "assume_padding", "supports_vocab_padding"),
        ("liger_selective", "assume_padding", "supports_vocab_padding"),
        ("openrlhf_actor", "assume_padding", "supports_vocab_padding"),
        ("openrlhf_actor", "assume_inactive_tokens", "mask_modes"),
    ],
)
def test_a_variant_differs_from_its_base_by_one_claim(module: str, attr: str, field: str) -> None:
    _, variant = _pair(module, attr)
    base_attr = (
        "equal_shards" if attr == "assume_uneven_shards" and module == "megatron" else "honest"
    )
    _, base = _pair(module, base_attr)
    if module in ("trl", "verl", "trl_kernel", "openrlhf_actor"):  # variants leave the entropy out
        base = dataclasses.replace(base, exports_entropy=False)
    changed = {
        name
        for name in (f.name for f in dataclasses.fields(LogprobBackendCapability))
        if getattr(variant, name) != getattr(base, name)
    }
    assert changed == {"backend_id", field}


def test_the_adapters_import_no_library_until_called() -> None:
    code = (
        "import sys, tp_logprob\n"
        "assert not any(m.startswith('tp_logprob.peers') for m in sys.modules)\n"
        "import tp_logprob.peers.liger, tp_logprob.peers.megatron, tp_logprob.peers.trl\n"
        "import tp_logprob.peers.torch_loss_parallel, tools.conformance.runner\n"
        "import tp_logprob.peers.vllm_sampler, tp_logprob.peers.liger_vocab_parallel\n"
        "import tp_logprob.peers.verl, tp_logprob.peers.sglang_sampler\n"
        "import tp_logprob.peers.openrlhf, tp_logprob.peers.openrlhf_actor\n"
        "import tp_logprob.peers.trl_kernel, tp_logprob.peers.liger_selective\n"
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {LIBRARIES!r})\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_fused_adapters_import_no_library_until_called() -> None:
    libraries = (*LIBRARIES, "triton")
    code = (
        "import sys, tp_logprob.peers.liger_fused, tp_logprob.peers.cce\n"
        "import tp_logprob.peers.liger_ppo\n"
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {libraries!r})\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.parametrize("peer", PROCESSED_PEERS, ids=[peer.name for peer in PROCESSED_PEERS])
def test_a_processed_peer_serves_a_support_and_backs_each_finding(peer) -> None:  # type: ignore[no-untyped-def]
    op, capability = _pair(peer.module, peer.attr)
    assert callable(op) and capability.backend_id == peer.name
    assert SupportMode.FULL not in capability.support_modes
    assert peer.findings
    for finding in peer.findings:
        script = ROOT / str(finding.explanation.reproducer)
        assert script.is_file(), script
        assert "exits 1 while" in script.read_text()
    names = [peer.name for peer in (*PEERS, *PROCESSED_PEERS)]
    assert len(names) == len(set(names))


def test_a_finding_names_processed_tests_that_exist() -> None:
    tests = set(processed_tests())
    for peer in PROCESSED_PEERS:
        for finding in peer.findings:
            assert set(finding.properties) <= tests, (finding.rule, finding.properties)
            for test in finding.properties:
                assert finding in peer.findings_for(test)
    assert PROCESSED_PEERS[0].findings_for("test_no_such_property") == ()
