"""The historical benchmark: its corpus, the per-release adapters' calls, the verdicts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from tools.history.corpus import CORPUS, HistoricalBug, releases
from tools.history.runner import verdict

from tp_logprob.peers._releases import UnservedReleaseError
from tp_logprob.peers.liger import SERVED, liger_arguments

ROOT = Path(__file__).resolve().parents[2]
INF = math.inf


@pytest.mark.parametrize(
    ("release", "count", "weight"),
    [((0, 4, 1), 6, False), ((0, 5, 2), 6, False), ((0, 5, 3), 7, True), ((0, 6, 4), 8, True),
     ((0, 8, 0), 9, True), ((0, 8, 5), 9, True)],
)  # fmt: skip
def test_liger_arguments_follow_each_releases_forward(
    release: tuple[int, ...], count: int, weight: bool
) -> None:
    arguments = liger_arguments(release, -100)
    assert len(arguments) == count
    assert (arguments[0] is None) is weight
    assert arguments[weight : weight + 4] == (-100, 0.0, 0.0, "none")


def test_liger_refuses_releases_before_reduction() -> None:
    with pytest.raises(UnservedReleaseError, match=r"liger-kernel '0\.4\.0' is installed"):
        SERVED.check("0.4.0")


def test_every_runnable_entry_has_a_reproducer_and_its_releases() -> None:
    for bug in CORPUS:
        if bug.unavailable is None:
            assert bug.reproducer is not None and (ROOT / bug.reproducer).is_file(), bug.key
            for version in bug.versions:
                assert f"{bug.distribution}=={version}" in releases()
    assert len(releases()) == len(set(releases()))


_BUG = HistoricalBug("k", "Lib", "lib", "s", "r", "1.0", "1.1", "m:honest", "yes", "repro.py")
_OPEN = HistoricalBug("o", "Lib", "lib", "s", "r", "1.1", None, "m:honest", "yes", "repro.py")


def _results(failing: dict[str, list[str]], codes: dict[str, int], kept: Any = None) -> Any:
    def run(tests: list[str]) -> dict[str, Any]:
        seconds = {"test_a": 1.0, "test_b": 2.0, "test_c": 0.5}  # test_c fails first
        properties = {
            name: {"outcome": "failed" if name in tests else "passed", "headline": "h",
                   "seconds": at, "example": "x"}
            for name, at in seconds.items()
        }  # fmt: skip
        return {"seconds": 1.0, "properties": properties}

    return {
        f"lib=={version}": {
            "adapters": {
                "m:honest": {"fresh": run(tests), "kept": run((kept or failing)[version])}
            },
            "reproducers": {"repro.py": codes[version]},
        }
        for version, tests in failing.items()
    }


def test_found_is_the_first_property_failing_on_the_buggy_release_only() -> None:
    results = _results({"1.0": ["test_a", "test_b"], "1.1": ["test_a"]}, {"1.0": 1, "1.1": 0})
    seen = verdict(_BUG, results)
    assert (seen["verdict"], seen["property"], seen["reproducer_flips"]) == (
        "found",
        "test_b",
        True,
    )
    assert seen["same_with_kept_database"] is True


def test_the_property_that_found_it_is_the_first_to_fail() -> None:
    results = _results({"1.0": ["test_b", "test_c"], "1.1": []}, {"1.0": 1, "1.1": 0})
    seen = verdict(_BUG, results)
    assert (seen["property"], seen["also"]) == ("test_c", ["test_b"])


def test_a_failure_the_fixed_release_shares_is_not_found() -> None:
    results = _results({"1.0": ["test_a"], "1.1": ["test_a"]}, {"1.0": 1, "1.1": 0})
    assert verdict(_BUG, results)["verdict"] == "not found"


def test_a_kept_database_that_changes_the_verdict_is_reported() -> None:
    fresh = {"1.0": ["test_b"], "1.1": []}
    results = _results(fresh, {"1.0": 1, "1.1": 0}, kept={"1.0": [], "1.1": []})
    assert verdict(_BUG, results)["same_with_kept_database"] is False


def test_an_open_bug_is_found_only_with_its_reproducer_failing() -> None:
    assert verdict(_OPEN, _results({"1.1": ["test_c"]}, {"1.1": 1}))["verdict"] == (
        "found, not yet fixed"
    )
    assert verdict(_OPEN, _results({"1.1": ["test_c"]}, {"1.1": 0}))["verdict"] == "not found"


def test_an_unavailable_entry_says_why() -> None:
    bug = HistoricalBug("u", "L", "l", "s", "r", "1", "2", "-", "no", unavailable="why")
    assert verdict(bug, {}) == {"verdict": "not runnable here", "reason": "why"}


def test_a_release_without_results_is_not_run_and_fails_the_report(tmp_path: Path) -> None:
    from tools.history.runner import report

    assert verdict(_BUG, {})["verdict"] == "not run"
    assert report([], tmp_path / "history.md") == 1
    assert "not run: no results for liger-kernel==" in (tmp_path / "history.md").read_text()


def test_a_smoke_report_judges_only_its_entries(tmp_path: Path) -> None:
    import json

    from tools.history.runner import report

    paths = []
    for version, tests, code in (("0.5.8", ["test_a"], 1), ("0.5.9", [], 0)):
        properties = {
            name: {"outcome": "failed" if name in tests else "passed", "headline": "h",
                   "seconds": 1.0, "example": None}
            for name in ("test_a", "test_b")
        }  # fmt: skip
        run = {"seconds": 1.0, "properties": properties}
        result = {
            "release": f"liger-kernel=={version}",
            "adapters": {"tp_logprob.peers.liger:honest": {"fresh": run, "kept": run}},
            "reproducers": {"docs/history/repro_liger_ce_none_grad_output.py": code},
        }
        paths.append(tmp_path / f"{version}.json")
        paths[-1].write_text(json.dumps(result))
    markdown = tmp_path / "history.md"
    assert report(paths, markdown, ["liger_ce_none_grad_output"]) == 0
    assert report(paths, markdown) == 1  # the other Liger entries were not run


@pytest.mark.parametrize("version", ["0.15.0", "0.16.0", "0.17.0", "0.20.0", "1.13.2", "1.14.0"])
def test_trl_grpo_adapter_serves_the_releases_with_the_method(version: str) -> None:
    from tp_logprob.peers.trl_grpo import SERVED as TRL_GRPO

    TRL_GRPO.check(version)


@pytest.mark.parametrize("version", ["0.14.0", "1.15.0", "1.16.0", "main"])
def test_trl_grpo_adapter_refuses_other_releases_by_version(version: str) -> None:
    from tp_logprob.peers.trl_grpo import SERVED as TRL_GRPO

    with pytest.raises(UnservedReleaseError, match=r"serves trl>=0\.15,<1\.15 only.*trl_chunked"):
        TRL_GRPO.check(version)


def test_requirements_follow_the_entries_of_a_release() -> None:
    from tools.history.corpus import requirements

    assert "transformers==4.49.0" in requirements("trl==0.15.2")
    assert requirements("liger-kernel==0.5.8") == ()


def test_every_runnable_entry_names_an_adapter_that_resolves() -> None:
    import importlib

    from tp_logprob.capability import LogprobBackendCapability

    for bug in CORPUS:
        if bug.unavailable is None:
            module, _, attr = bug.adapter.partition(":")
            op, capability = getattr(importlib.import_module(module), attr)
            assert callable(op) and isinstance(capability, LogprobBackendCapability), bug.key


def test_the_vllm_entry_installs_the_same_sampler_imports_for_both_releases() -> None:
    from tools.history.corpus import requirements

    (bug,) = [bug for bug in CORPUS if bug.key == "vllm_processed_logprobs_temperature"]
    assert bug.versions == ("0.10.0", "0.10.2")
    assert requirements("vllm==0.10.0") == requirements("vllm==0.10.2") == bug.requires
    assert all("==" in requirement for requirement in bug.requires)  # that time's releases
    assert "transformers==4.56.1" in bug.requires


@pytest.mark.parametrize(
    ("version", "release"),
    [("0.10.0", (0, 10, 0)), ("0.10.1", (0, 10, 1)), ("0.10.1.1", (0, 10, 1, 1)),
     ("0.10.2", (0, 10, 2))],
)  # fmt: skip
def test_vllm_010_adapter_serves_the_010_releases(version: str, release: tuple[int, ...]) -> None:
    from tp_logprob.peers.vllm_sampler_010 import SERVED as VLLM_010

    assert VLLM_010.check(version) == release


@pytest.mark.parametrize("version", ["0.9.2", "0.11.0", "0.33.0", "main"])
def test_vllm_010_adapter_refuses_other_releases_by_version(version: str) -> None:
    from tp_logprob.peers.vllm_sampler_010 import SERVED as VLLM_010

    with pytest.raises(UnservedReleaseError, match=r"serves vllm>=0\.10,<0\.11 only"):
        VLLM_010.check(version)


def _installed_vllm_010() -> tuple[int, ...]:
    """The installed vllm 0.10 release; skips where vllm is absent or another release."""
    from tp_logprob.peers.vllm_sampler_010 import SERVED as VLLM_010

    pytest.importorskip("vllm", reason="vllm 0.10 is installed by nox -s history only")
    try:
        return VLLM_010.installed()
    except UnservedReleaseError as error:
        pytest.skip(str(error))


def _vllm_contract(rows: int, vocab: int, **extra: Any) -> Any:
    import tp_logprob as tpl

    sharding = tpl.ShardingSpec(0, 1, ((0, vocab),), vocab, vocab)
    mask, reduction = tpl.MaskSpec(rows), tpl.ReductionSpec("run_to_run")
    return tpl.LogprobContract("infer", "fp32", mask, sharding, reduction, **extra)


def test_vllm_010_processed_logprob_is_each_releases_own() -> None:
    import torch

    from tp_logprob.peers.vllm_sampler_010 import honest

    release = _installed_vllm_010()
    op, capability = honest
    x = torch.tensor([[1.0, 0.0, -1.0, 2.0], [0.5, 0.5, 0.0, -3.0]])
    before, targets = x.clone(), torch.tensor([0, 3])
    for temperature in (1.0, 0.5):
        contract = _vllm_contract(2, 4, temperature=temperature)
        assert capability.supports(contract)
        result = op(x, targets, contract)
        z = x / temperature
        torch.testing.assert_close(result.lse, z.logsumexp(dim=1))
        # Before 0.10.2 the "processed" logprob is that of the undivided logits.
        fixed = release >= (0, 10, 2)
        expected = (z if fixed else x).log_softmax(dim=1).gather(1, targets[:, None])[:, 0]
        torch.testing.assert_close(result.selected_logp, expected)
        assert result.support_size is None
    assert torch.equal(x, before)


def test_vllm_010_mixed_batch_divides_a_greedy_row_by_minus_one_from_0102() -> None:
    """One request per row, a greedy one between sampled ones, as 0.10's input batch holds
    them: the greedy row's temperature is -1.0, and 0.10.2 takes its processed logprobs
    after dividing by it (0.11 divides it by 1); before 0.10.2 every processed logprob is
    the undivided row's."""
    import torch

    from tp_logprob.peers.vllm_sampler_010 import honest

    release = _installed_vllm_010()
    op, capability = honest
    x = torch.tensor([[1.0, 0.0, -1.0, 2.0], [0.5, 3.0, 0.0, -3.0], [2.0, -1.0, 0.5, 0.0]])
    targets = torch.tensor([0, 1, 2])
    contract = _vllm_contract(3, 4, temperature=(0.5, 0.0, 1.0))
    assert capability.supports(contract)
    result = op(x, targets, contract)
    divisor = torch.tensor([0.5, 1.0, 1.0])[:, None]  # the semantics: a greedy row at T = 1
    torch.testing.assert_close(result.lse, (x / divisor).logsumexp(dim=1))
    fixed = release >= (0, 10, 2)
    processed = x / torch.tensor([0.5, -1.0, 1.0])[:, None] if fixed else x
    expected = processed.log_softmax(dim=1).gather(1, targets[:, None])[:, 0]
    torch.testing.assert_close(result.selected_logp, expected)
    # An all-greedy batch is never divided.
    greedy = op(x, targets, _vllm_contract(3, 4, temperature=(0.0, 0.0, 0.0)))
    raw = x.log_softmax(dim=1).gather(1, targets[:, None])[:, 0]
    torch.testing.assert_close(greedy.selected_logp, raw)


def test_vllm_010_top_k_support_from_the_fixed_release() -> None:
    import torch

    from tp_logprob.peers.vllm_sampler_010 import honest
    from tp_logprob.support import SupportSpec

    release = _installed_vllm_010()
    op, _ = honest
    x = torch.tensor([[1.0, 0.0, -1.0, 2.0]])
    contract = _vllm_contract(1, 4, temperature=0.5, support=SupportSpec(top_k=2))
    result = op(x, torch.tensor([1]), contract)
    if release >= (0, 10, 2):
        assert (result.support_size.tolist(), result.selected_logp.tolist()) == ([2], [-INF])
        kept = (x[:, [0, 3]] / 0.5).logsumexp(dim=1)
        torch.testing.assert_close(result.support_lse, kept)
        assert result.support_threshold.tolist() == [2.0]
    else:  # min-p, top-k and top-p come after the logprobs: every column is kept
        assert result.support_size.tolist() == [4]
        assert math.isfinite(result.selected_logp.item())


def test_vllm_010_support_of_a_row_without_finite_logits_is_undefined() -> None:
    import torch

    from tp_logprob.peers.vllm_sampler_010 import honest
    from tp_logprob.support import SupportSpec

    _installed_vllm_010()
    op, _ = honest
    x = torch.tensor([[-INF, -INF, -INF], [0.0, 1.0, -INF]])
    contract = _vllm_contract(2, 3, support=SupportSpec(top_p=1.0))
    result = op(x, torch.tensor([0, 1]), contract)
    assert result.support_size.tolist() == [0, 2]
    assert math.isnan(result.support_lse[0]) and math.isnan(result.support_threshold[0])
    torch.testing.assert_close(result.support_lse[1], x[1].logsumexp(dim=0))
    assert result.support_threshold[1].item() == 0.0
