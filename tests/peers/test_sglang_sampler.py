"""The SGLang sampler adapter on its findings' rows and on random rows.

Each reproducer row (``docs/repro_sglang_*.py``) pins what SGLang's torch-native
sampler does where it differs from the exact rules of docs/semantics.md,
"Processed logprobs"; the random rows check the glue: the support outputs describe
the support SGLang chose, the logprobs are SGLang's ``support_logprobs``, and rows
far from every boundary agree with the exact rules. Skipped where SGLang is not
installed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tools.conformance.catalog import PROCESSED_PEERS

import tp_logprob as tpl
from tp_logprob.judging.violation import PropertyViolation
from tp_logprob.oracle import exact_support
from tp_logprob.peers._installed import installed_file
from tp_logprob.replay.catalogue import suite_properties
from tp_logprob.strategies import LogprobCase
from tp_logprob.suite.backends import resolve_backends
from tp_logprob.support import SupportSpec

pytest.importorskip("sglang.srt.sampling.sampling_params", reason="SGLang is not installed here")

from tp_logprob.peers import sglang_sampler

INF = math.inf
PEER = next(peer for peer in PROCESSED_PEERS if peer.name == "sglang_sampler")


def _contract(rows: int, vocab: int, support: SupportSpec, **extra: object) -> tpl.LogprobContract:
    sharding = tpl.ShardingSpec(0, 1, ((0, vocab),), vocab, vocab)
    return tpl.LogprobContract(
        "infer", "fp32", tpl.MaskSpec(rows), sharding, tpl.ReductionSpec("run_to_run"),
        support=support, **extra,
    )  # fmt: skip


def _run(logits: list[list[float]], support: SupportSpec, targets: list[int], **extra: object):  # type: ignore[no-untyped-def]
    x = torch.tensor(logits, dtype=torch.float32)
    op, capability = sglang_sampler.honest
    contract = _contract(x.shape[0], x.shape[1], support, **extra)
    assert capability.supports(contract)
    return op(x, torch.tensor(targets), contract)


def test_the_functions_run_are_the_installed_files() -> None:
    definitions = sglang_sampler.installed_definitions()
    for relative, names in sglang_sampler._DEFINITIONS.items():
        path = installed_file("sglang", relative)
        lines = path.read_text().splitlines()
        for name in names:
            code = getattr(definitions[name], "__code__", None)
            if code is not None:  # a function: compiled from that file, at its own line
                assert code.co_filename == str(path), name
                indent = "    " * name.count(".")
                assert lines[code.co_firstlineno - 1].startswith(
                    f"{indent}def {name.rpartition('.')[2]}("
                ), name


def test_top_k_cuts_a_tie_by_position() -> None:
    """docs/repro_sglang_top_k_ties.py: the exact rule keeps four."""
    result = _run([[1.0, 0.0, 0.0, 0.0, -1.0]], SupportSpec(top_k=2), [0])
    assert result.support_size.tolist() == [2]
    assert result.support_threshold.tolist() == [0.0]
    assert result.selected_logp.item() == pytest.approx(-math.log1p(math.exp(-1.0)), rel=1e-6)


def test_top_p_cuts_a_boundary_tie_by_position() -> None:
    """docs/repro_sglang_top_p_ties.py: the exact rule keeps all four."""
    result = _run([[0.0, 0.0, 0.0, 0.0]], SupportSpec(top_p=0.5), [0])
    assert result.support_size.tolist() == [3]
    assert result.support_lse.item() == pytest.approx(math.log(3), rel=1e-6)


def test_top_p_reads_the_full_distribution_after_top_k() -> None:
    """docs/repro_sglang_top_p_joint.py: the exact rules keep one token."""
    z = np.log(np.array([[0.4, 0.3, 0.2, 0.1]], np.float32)).tolist()
    result = _run(z, SupportSpec(top_k=3, top_p=0.42), [1])
    assert result.support_size.tolist() == [2]
    assert result.selected_logp.item() == pytest.approx(math.log(3 / 7), rel=1e-5)


@pytest.mark.parametrize(
    ("row", "top_k", "size", "selected"),
    [([0.0, -104.0], 2, 1, -INF), ([1.0, 0.0, -INF, -INF], 3, 2, -math.log1p(math.e))],
    ids=["underflow", "-inf"],
)
def test_a_token_of_zero_probability_leaves_the_support(
    row: list[float], top_k: int, size: int, selected: float
) -> None:
    """docs/repro_sglang_zero_probability.py: the exact rule keeps every token."""
    result = _run([row], SupportSpec(top_k=top_k), [1])
    assert result.support_size.tolist() == [size]
    assert result.selected_logp.item() == pytest.approx(selected, rel=1e-6)


def test_an_overflowing_row_raises_for_the_batch() -> None:
    """docs/repro_sglang_nonfinite_raises.py: torch.multinomial refuses the NaN row."""
    with pytest.raises(RuntimeError, match="probability tensor contains"):
        _run([[2.6e38, 0.0], [1.0, 0.0]], SupportSpec(top_k=2), [0, 0], temperature=0.6)


def test_a_temperature_below_one_millionth_is_greedy() -> None:
    """docs/repro_sglang_temperature_greedy.py: the support is the argmax alone."""
    result = _run([[1.0, 0.0, 1.0]], SupportSpec(top_k=2), [0], temperature=1e-7)
    assert result.support_size.tolist() == [1]
    assert result.selected_logp.tolist() == [0.0]
    assert result.support_threshold.tolist() == [pytest.approx(1e7)]


def test_the_callers_logits_and_rng_are_untouched() -> None:
    x = torch.randn(4, 30, generator=torch.Generator().manual_seed(3))
    before, state = x.clone(), torch.random.get_rng_state()
    contract = _contract(4, 30, SupportSpec(top_k=5))
    sglang_sampler.honest[0](x, torch.zeros(4, dtype=torch.int64), contract)
    assert torch.equal(x, before) and torch.equal(torch.random.get_rng_state(), state)


RULES = [{"top_k": 7}, {"top_p": 0.8}, {"min_p": 0.05}, {"top_p": 1.0}, {"top_k": 1}]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: ",".join(f"{k}={v}" for k, v in r.items()))
@pytest.mark.parametrize("seed", range(3))
def test_random_rows_follow_the_exact_rules_away_from_boundaries(
    rule: dict[str, float], seed: int
) -> None:
    """One rule at a time: with two, the joint top-p differs from the exact order."""
    rng = np.random.default_rng(seed)
    rows, vocab, temperature = 6, int(rng.integers(8, 40)), float(rng.choice([1.0, 0.7, 1.5]))
    x = (rng.normal(size=(rows, vocab)) * 3).astype(np.float32)
    targets = torch.tensor(rng.integers(0, vocab, rows))
    result = _run(x.tolist(), SupportSpec(**rule), targets.tolist(), temperature=temperature)  # type: ignore[arg-type]
    z = torch.tensor(x) / torch.tensor(temperature, dtype=torch.float32)
    torch.testing.assert_close(result.lse, torch.logsumexp(z, dim=1))
    found = exact_support(x, temperature=temperature, **rule)
    for row in range(rows):
        kept = z[row] >= result.support_threshold[row]
        assert int(kept.sum()) == int(result.support_size[row])
        expected_lse = torch.logsumexp(z[row][kept], dim=0)
        torch.testing.assert_close(result.support_lse[row], expected_lse)
        expected = z[row, targets[row]] - expected_lse if kept[targets[row]] else -INF
        torch.testing.assert_close(result.selected_logp[row], torch.as_tensor(expected))
        if "top_p" in rule and rule["top_p"] < 1:
            p = torch.softmax(z[row].double(), 0)
            above = torch.stack([p[p > q].sum() for q in p])
            if (above - rule["top_p"]).abs().min() < 1e-4:
                continue
        assert torch.equal(kept, torch.as_tensor(found.mask[row])), row


FINDING_ROWS = {
    "docs/repro_sglang_top_k_ties.py": ([[1.0, 0.0, 0.0, 0.0, -1.0]], SupportSpec(top_k=2), {}),
    "docs/repro_sglang_top_p_ties.py": ([[0.0, 0.0, 0.0, 0.0]], SupportSpec(top_p=0.5), {}),
    "docs/repro_sglang_top_p_joint.py": (
        np.log(np.array([[0.4, 0.3, 0.2, 0.1]], np.float32)).tolist(),
        SupportSpec(top_k=3, top_p=0.42),
        {},
    ),
    "docs/repro_sglang_zero_probability.py": ([[0.0, -104.0]], SupportSpec(top_k=2), {}),
    "docs/repro_sglang_nonfinite_raises.py": (
        [[2.6e38, 0.0]],
        SupportSpec(top_k=2),
        {"temperature": 0.6},
    ),
    "docs/repro_sglang_temperature_greedy.py": (
        [[1.0, 0.0]],
        SupportSpec(top_k=2),
        {"temperature": 1e-7},
    ),
}
"""Each finding's reproducer row."""

SUITE_PROPERTIES = {
    "test_processed_matches_exact_oracle_on_its_support": "processed_oracle",
    "test_processed_run_to_run_and_batch_invariance": "run_to_run",
}


@pytest.mark.parametrize("finding", PEER.findings, ids=[f.rule for f in PEER.findings])
def test_a_finding_lists_the_properties_its_row_fails(finding) -> None:  # type: ignore[no-untyped-def]
    """Finding.properties is what the report links a failing property to: pinned here."""
    logits, support, extra = FINDING_ROWS[str(finding.explanation.reproducer)]
    contract = _contract(1, len(logits[0]), support, export_lse=True, **extra)
    case = LogprobCase(contract, np.array(logits, np.float32), np.array([1]))
    (backend,) = resolve_backends([PEER.spec()], "cpu")
    failing = set()
    for test, prop in SUITE_PROPERTIES.items():
        try:
            suite_properties()[prop].run(backend, case)
        except PropertyViolation:
            failing.add(test)
        except RuntimeError:  # the library refuses the batch
            failing.add(test)
    assert failing == set(finding.properties)


def _mixed_batch() -> tuple[torch.Tensor, torch.Tensor, tpl.LogprobContract]:
    """An engine batch: sampled requests at their own temperature and rules beside greedy
    ones."""
    x = torch.randn(5, 24, generator=torch.Generator().manual_seed(7)) * 2
    support = SupportSpec(top_k=[3, 4, None, None, 6], top_p=[None, None, 0.8, None, 0.9])
    contract = _contract(5, 24, support, temperature=[0.7, 0.0, 1.3, 0.0, 0.9])
    return x, torch.tensor([0, 5, 2, 7, 1]), contract


def test_a_mixed_batch_gives_each_sampled_row_what_its_request_alone_gives() -> None:
    x, targets, contract = _mixed_batch()
    op, capability = sglang_sampler.honest
    assert capability.supports(contract)
    mixed = op(x, targets, contract)
    for row in (0, 2, 4):
        top_k, top_p, _ = contract.support.row_rules(row)
        alone = op(
            x[row : row + 1],
            targets[row : row + 1],
            _contract(
                1, 24, SupportSpec(top_k=top_k, top_p=top_p), temperature=contract.temperature[row]
            ),
        )
        for name in ("selected_logp", "lse", "support_lse", "support_size", "support_threshold"):
            assert torch.equal(getattr(mixed, name)[row : row + 1], getattr(alone, name)), name


def test_a_greedy_row_keeps_its_argmax_alone() -> None:
    """SGLang turns a greedy request into T = 1, top_k = 1: its sampling mask keeps the argmax
    alone (logprob 0), where the contract's greedy row keeps every live column."""
    x, _, contract = _mixed_batch()
    argmax = x.argmax(dim=1)
    result = sglang_sampler.honest[0](x, argmax, contract)
    for row in (1, 3):
        assert result.support_size[row].item() == 1
        assert result.selected_logp[row].item() == 0.0
        assert result.support_threshold[row].item() == x[row].max().item()
        assert result.lse[row].item() == pytest.approx(torch.logsumexp(x[row], 0).item())
