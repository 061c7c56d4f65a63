"""The processed-logprob adapters on the reproducer rows and on random rows.

The vLLM adapter is the one that serves the installed release: ``vllm_sampler``
(0.11 to 0.33, ``vllm.v1.sample.sampler``) or ``vllm_sampler_034`` (from 0.34, the
CPU model runner's sampler). Each reproducer row (``docs/repro_vllm_*.py``) pins
what the library does where it differs from the exact rules of docs/semantics.md,
"Processed logprobs"; the random rows check the glue: the support outputs describe
the support the library chose, and rows far from every boundary agree with the
exact rules, computed here with mpmath. Skipped where the library is not installed.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch
from tools.conformance.catalog import PROCESSED_PEERS

import tp_logprob as tpl
from tp_logprob.judging.violation import PropertyViolation
from tp_logprob.replay.catalogue import suite_properties
from tp_logprob.strategies import LogprobCase
from tp_logprob.suite.backends import resolve_backends
from tp_logprob.support import SupportSpec

INF = math.inf

vllm = pytest.importorskip("vllm", reason="vLLM is installed by nox -s conformance only")
try:
    from vllm.exceptions import VLLMValidationError
except ImportError:  # before 0.14 SamplingParams refuses a row with ValueError
    VLLMValidationError = ValueError  # type: ignore[misc,assignment]

from importlib import metadata  # noqa: E402

from tp_logprob.peers import vllm_sampler as vllm_sampler_011  # noqa: E402
from tp_logprob.peers import vllm_sampler_034  # noqa: E402
from tp_logprob.peers._releases import parse_release  # noqa: E402

RELEASE = parse_release(metadata.version("vllm"))
vllm_sampler = vllm_sampler_034 if RELEASE >= (0, 34) else vllm_sampler_011
PEER = next(peer for peer in PROCESSED_PEERS if peer.module == vllm_sampler.__name__.split(".")[-1])
"""The adapter of the installed release and its catalog entry."""


def _contract(rows: int, vocab: int, support: SupportSpec, **extra: object) -> tpl.LogprobContract:
    sharding = tpl.ShardingSpec(0, 1, ((0, vocab),), vocab, vocab)
    return tpl.LogprobContract(
        "infer",
        extra.pop("dtype", "fp32"),
        tpl.MaskSpec(rows),
        sharding,
        tpl.ReductionSpec("run_to_run"),
        support=support,
        **extra,
    )


def _run(logits: list[list[float]], support: SupportSpec, targets=None, **extra):  # type: ignore[no-untyped-def]
    x = torch.tensor(logits, dtype=torch.float32)
    targets = torch.zeros(len(logits), dtype=torch.int64) if targets is None else targets
    op, capability = vllm_sampler.honest
    contract = _contract(x.shape[0], x.shape[1], support, **extra)
    assert capability.supports(contract)
    return op(x, targets, contract)


def test_top_k_keeps_the_whole_tie_as_the_exact_rule_does() -> None:
    result = _run([[1.0, 0.0, 0.0, 0.0, -1.0]], SupportSpec(top_k=2), torch.tensor([3]))
    assert result.support_size.tolist() == [4]
    assert result.support_threshold.tolist() == [0.0]
    exact = -math.log(math.e + 3)
    assert result.selected_logp.item() == pytest.approx(exact, rel=1e-6)


def test_top_p_cuts_a_boundary_tie_by_position() -> None:
    """docs/repro_vllm_top_p_ties.py: the exact rule keeps all four."""
    result = _run([[0.0, 0.0, 0.0, 0.0]], SupportSpec(top_p=0.5))
    assert result.support_size.tolist() == [2]
    assert result.support_lse.item() == pytest.approx(math.log(2), rel=1e-6)
    assert result.support_threshold.tolist() == [0.0]


def test_top_p_fp32_boundary_drops_the_second_token() -> None:
    """docs/repro_vllm_top_p_fp32_boundary.py: the exact rule keeps both."""
    row = [[1.2608230113983154, 1.1623315811157227]]
    result = _run(row, SupportSpec(top_p=0.524603009223938), torch.tensor([1]))
    assert result.support_size.tolist() == [1]
    assert result.selected_logp.tolist() == [-INF]
    assert result.support_threshold.tolist() == [row[0][0]]


def test_min_p_fp32_boundary_keeps_the_second_token() -> None:
    """docs/repro_vllm_min_p_fp32_boundary.py: the exact rule drops it."""
    result = _run([[0.0, -0.6931471824645996]], SupportSpec(min_p=0.5), torch.tensor([1]))
    assert result.support_size.tolist() == [2]
    assert result.selected_logp.item() == pytest.approx(-math.log(3), rel=1e-6)


def test_temperature_below_one_hundredth_is_raised_to_it() -> None:
    """docs/repro_vllm_temperature_floor.py: vLLM divides by 0.01, the contract by 0.005."""
    result = _run([[1.0, 0.0]], SupportSpec(top_k=2), torch.tensor([1]), temperature=0.005)
    assert result.selected_logp.item() == pytest.approx(-100.0, rel=1e-6)
    assert result.lse.item() == pytest.approx(200.0, rel=1e-6)


def test_a_kept_neg_inf_column_is_not_in_the_support() -> None:
    """docs/repro_vllm_neg_inf_support.py: the exact support has four tokens."""
    result = _run([[1.0, 0.0, -INF, -INF]], SupportSpec(top_k=3), torch.tensor([1]))
    assert result.support_size.tolist() == [2]
    assert result.support_threshold.tolist() == [0.0]
    assert result.selected_logp.item() == pytest.approx(-math.log1p(math.e), rel=1e-6)


def test_a_row_without_a_finite_logit_has_an_undefined_support() -> None:
    """docs/semantics.md, "Processed logprobs": NaN, 0 and NaN, beside a defined row."""
    result = _run([[-INF, -INF], [1.0, 0.0]], SupportSpec(top_p=1.0))
    assert result.support_size.tolist() == [0, 2]
    assert math.isnan(result.support_lse[0].item())
    assert math.isnan(result.support_threshold[0].item())
    assert result.support_lse[1].item() == pytest.approx(math.log1p(math.exp(-1)) + 1, rel=1e-6)


def test_processed_logits_are_what_processed_logprobs_mode_returns() -> None:
    """Up to 0.33, the sampler's ``processed_logprobs`` mode returns ``compute_logprobs`` of
    the adapter's processed logits; from 0.34, the sampling mask it returns is their finite
    columns and ``compute_topk_scores`` their ``log_softmax``."""
    x = torch.randn(6, 40, generator=torch.Generator().manual_seed(1)) * 3
    if vllm_sampler is vllm_sampler_011:
        contract = _contract(6, 40, SupportSpec(top_k=9, top_p=0.8, min_p=0.01), temperature=0.7)
        processed = vllm_sampler_011.processed_logits(x, contract)
        metadata = vllm_sampler_011._metadata(vllm_sampler_011.sampling_params(contract), 40)
        sampler = vllm_sampler_011._vllm()["Sampler"](logprobs_mode="processed_logprobs")
        tensors = sampler(x.clone(), metadata).logprobs_tensors
        returned = vllm_sampler_011.in_vocabulary_order(tensors, 40)
        assert torch.equal(sampler.compute_logprobs(processed), returned)
        return
    support = SupportSpec(top_k=[9, None, 3, 40, None, 5], top_p=0.8, min_p=0.01)
    contract = _contract(6, 40, support, temperature=[0.7, 1.0, 0.0, 1.3, 0.5, 0.9])
    step = vllm_sampler_034.processed_step(x, contract)
    for row, kept in enumerate(step.kept):
        assert kept.tolist() == torch.nonzero(torch.isfinite(step.logits[row]))[:, 0].tolist()
    torch.testing.assert_close(step.logprobs, torch.log_softmax(step.logits, dim=1))
    assert len(step.kept[2]) == 40  # the greedy request keeps every token
    assert 0 < len(step.kept[0]) <= 9


def _exact_support(z: np.ndarray, support: SupportSpec) -> tuple[list[int], float]:
    """The exact rules at 50 digits, and the smallest margin of any decision."""
    with mpmath.workdps(50):
        values = [mpmath.mpf(float(v)) for v in z]
        top = max(values)
        kept = list(range(len(values)))
        margin = mpmath.inf
        if support.min_p:
            ratios = {v: mpmath.exp(values[v] - top) for v in kept}
            margin = min(abs(r - support.min_p) for r in ratios.values())
            kept = [v for v in kept if ratios[v] >= support.min_p]
        if support.top_k and support.top_k < len(kept):
            kth = sorted((values[v] for v in kept), reverse=True)[support.top_k - 1]
            kept = [v for v in kept if values[v] >= kth]
        if support.top_p is not None and support.top_p < 1:
            weights = {v: mpmath.exp(values[v] - top) for v in kept}
            bound = support.top_p * mpmath.fsum(weights.values())
            above = {
                v: mpmath.fsum(weights[u] for u in kept if values[u] > values[v]) for v in kept
            }
            margin = min([margin, *(abs(a - bound) / bound for a in above.values())])
            kept = [v for v in kept if above[v] < bound]
        return kept, float(margin)


@pytest.mark.parametrize("seed", range(6))
def test_random_rows_follow_the_exact_rules_away_from_boundaries(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows, vocab = 5, int(rng.integers(2, 30))
    support = SupportSpec(
        top_k=int(rng.integers(1, vocab + 2)),
        top_p=float(rng.choice([0.3, 0.75, 0.95, 1.0])),
        min_p=float(rng.choice([0.0, 0.02, 0.2])),
    )
    x = (rng.normal(size=(rows, vocab)) * 3).astype(np.float32)
    targets = torch.tensor(x.argmax(axis=1))
    temperature = float(rng.choice([1.0, 0.6, 1.7]))
    before = torch.tensor(x)
    logits = before.clone()
    result = vllm_sampler.honest[0](
        logits, targets, _contract(rows, vocab, support, temperature=temperature)
    )
    assert torch.equal(logits, before)
    z = logits / torch.tensor(temperature, dtype=torch.float32)
    torch.testing.assert_close(result.lse, torch.logsumexp(z, dim=1))
    for row in range(rows):
        kept = z[row] >= result.support_threshold[row]
        assert int(kept.sum()) == int(result.support_size[row])
        expected_lse = torch.logsumexp(z[row][kept], dim=0)
        torch.testing.assert_close(result.support_lse[row], expected_lse)
        torch.testing.assert_close(result.selected_logp[row], z[row, targets[row]] - expected_lse)
        exact, margin = _exact_support(z[row].numpy(), support)
        if margin > 1e-4:
            assert sorted(torch.nonzero(kept)[:, 0].tolist()) == exact


FINDING_ROWS = {
    "docs/repro_vllm_top_p_ties.py": ([[0.0, 0.0, 0.0, 0.0]], SupportSpec(top_p=0.5), [0], {}),
    "docs/repro_vllm_top_p_fp32_boundary.py": (
        [[1.2608230113983154, 1.1623315811157227]],
        SupportSpec(top_p=0.524603009223938),
        [1],
        {},
    ),
    "docs/repro_vllm_min_p_fp32_boundary.py": (
        [[0.0, -0.6931471824645996]],
        SupportSpec(min_p=0.5),
        [1],
        {},
    ),
    "docs/repro_vllm_temperature_floor.py": (
        [[1.0, 0.0]],
        SupportSpec(top_k=2),
        [1],
        {"temperature": 0.005},
    ),
    "docs/repro_vllm_034_min_p_boundary.py": (
        [[0.0, -0.6931471824645996]],
        SupportSpec(min_p=0.5),
        [1],
        {},
    ),
    "docs/repro_vllm_034_temperature_floor.py": (
        [[1.0, 0.0]],
        SupportSpec(top_k=2),
        [1],
        {"temperature": 0.005},
    ),
    "docs/repro_vllm_neg_inf_support.py": ([[1.0, 0.0, -INF, -INF]], SupportSpec(top_k=3), [1], {}),
    "docs/repro_vllm_temperature_range.py": (
        [[1.0, 0.0]],
        SupportSpec(top_k=2),
        [1],
        {"temperature": 4.0},
    ),
}
"""Each finding's reproducer row. top_p = 1 beside a top-p request has none: the adapter runs
one contract, so one top_p, per batch, and no property test can meet that finding."""

FINDING_SINCE = {"docs/repro_vllm_temperature_range.py": (0, 24)}
"""The release a finding's row first fails in, where older served releases pass it: before
0.24.0 ``SamplingParams`` takes any temperature >= 0 (no upper bound of 2)."""

SUITE_PROPERTIES = {
    "test_processed_matches_exact_oracle_on_its_support": "processed_oracle",
    "test_processed_run_to_run_and_batch_invariance": "run_to_run",
}
"""The processed tests that draw the sampler's cases (the others skip it) and the suite
property each one checks."""


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("finding", PEER.findings, ids=[f.rule for f in PEER.findings])
def test_a_finding_lists_the_properties_its_row_fails(finding) -> None:  # type: ignore[no-untyped-def]
    """Finding.properties is what the report links a failing property to: pinned here."""
    row = FINDING_ROWS.get(str(finding.explanation.reproducer))
    if row is None:
        assert finding.properties == ()
        return
    logits, support, targets, extra = row
    contract = _contract(len(logits), len(logits[0]), support, export_lse=True, **extra)
    case = LogprobCase(contract, np.array(logits, np.float32), np.array(targets))
    (backend,) = resolve_backends([PEER.spec()], "cpu")
    failing = set()
    for test, prop in SUITE_PROPERTIES.items():
        try:
            suite_properties()[prop].run(backend, case)
        except PropertyViolation:
            failing.add(test)
        except VLLMValidationError:  # the library refuses the row
            failing.add(test)
    since = FINDING_SINCE.get(str(finding.explanation.reproducer), (0,))
    expected = finding.properties if since <= RELEASE else ()
    assert failing == set(expected)


def _mixed_batch() -> tuple[torch.Tensor, torch.Tensor, tpl.LogprobContract]:
    """An engine batch: sampled requests at their own temperature and rules beside greedy
    ones (one of them with rules of its own, which greedy decoding turns off)."""
    x = torch.randn(5, 24, generator=torch.Generator().manual_seed(7)) * 2
    support = SupportSpec(top_k=[3, 4, None, None, 6], top_p=[None, None, 0.8, None, 0.9])
    contract = _contract(5, 24, support, temperature=[0.7, 0.0, 1.3, 0.0, 0.9])
    return x, torch.tensor([0, 5, 2, 7, 1]), contract


def test_a_mixed_batch_gives_each_row_what_its_request_alone_gives() -> None:
    x, targets, contract = _mixed_batch()
    op, capability = vllm_sampler.honest
    assert capability.supports(contract)
    numpy_stream = np.random.get_state()[1].copy()
    mixed = op(x, targets, contract)
    assert np.array_equal(np.random.get_state()[1], numpy_stream)  # unseeded requests' seeds
    for row in range(5):
        top_k, top_p, _ = contract.support.row_rules(row)
        temperature = contract.temperature[row]
        if temperature == 0.0:
            continue  # a greedy request alone is the scalar contract's refused T = 0
        alone = op(
            x[row : row + 1],
            targets[row : row + 1],
            _contract(1, 24, SupportSpec(top_k=top_k, top_p=top_p), temperature=temperature),
        )
        for name in ("selected_logp", "lse", "support_lse", "support_size", "support_threshold"):
            assert torch.equal(getattr(mixed, name)[row : row + 1], getattr(alone, name)), name


def test_a_greedy_row_is_the_raw_logprob_at_temperature_one() -> None:
    """docs/semantics.md, "Heterogeneous batches": vLLM divides a greedy row by 1 and keeps
    every token, whatever rules the request named."""
    x, targets, contract = _mixed_batch()
    result = vllm_sampler.honest[0](x, targets, contract)
    raw = torch.log_softmax(x, dim=1).gather(1, targets[:, None])[:, 0]
    for row in (1, 3):
        assert result.support_size[row].item() == 24
        assert result.selected_logp[row].item() == pytest.approx(raw[row].item(), abs=1e-6)
        assert result.support_lse[row].item() == pytest.approx(result.lse[row].item(), abs=1e-6)


def test_an_all_greedy_batch_takes_the_greedy_branch_and_keeps_every_token() -> None:
    x, targets, _ = _mixed_batch()
    contract = _contract(5, 24, SupportSpec(top_k=[2] * 5), temperature=[0.0] * 5)
    result = vllm_sampler.honest[0](x, targets, contract)
    raw = torch.log_softmax(x, dim=1).gather(1, targets[:, None])[:, 0]
    assert result.support_size.tolist() == [24] * 5
    assert torch.allclose(result.selected_logp, raw, atol=1e-6)
