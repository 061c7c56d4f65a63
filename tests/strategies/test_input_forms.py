"""Input forms: each builds the view it names, poisons what the view skips, shrinks to
contiguous, survives the suite's case surgery, and comes back from an artifact."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import find

from tests.helpers.artifacts import backend, padding_case
from tp_logprob.replay.artifacts import ArtifactError, load_artifact, write_artifact
from tp_logprob.replay.catalogue import suite_properties
from tp_logprob.replay.runner import Outcome, replay
from tp_logprob.strategies import (
    TARGET_FORMS,
    VALUE_FORMS,
    InputForm,
    LogprobCase,
    input_forms,
    laid_out,
)
from tp_logprob.strategies.input_forms import TARGET_POISON, laid_out_leaf
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.running import execute, sub_batch

SUITE = suite_properties()
LAYOUT_MUTANT = "tests.mutants.layout_bugs:unit_column_stride"

GEOMETRY = {  # [3, 4] values: (strides, storage offset, buffer elements)
    "offset": ((4, 1), 1, 13),
    "row gap": ((7, 1), 1, 21),
    "every other row": ((8, 1), 0, 24),
    "column major": ((1, 3), 0, 12),
    "column step": ((8, 2), 0, 24),
}


@pytest.mark.parametrize("name", VALUE_FORMS[1:])
def test_a_value_form_is_its_view_with_poison_outside(name: str) -> None:
    values = torch.arange(12.0).reshape(3, 4)
    view = laid_out(values, name)
    strides, offset, size = GEOMETRY[name]
    assert (view.stride(), view.storage_offset()) == (strides, offset)
    assert view.untyped_storage().nbytes() == 4 * size
    assert torch.equal(view, values)
    buffer = torch.empty(0).set_(view.untyped_storage()).view(-1)
    assert int(torch.isnan(buffer).sum()) == size - 12


@pytest.mark.parametrize("name", TARGET_FORMS[1:])
def test_a_targets_form_is_its_view_with_poison_outside(name: str) -> None:
    targets = torch.tensor([3, 0, 2])
    view = laid_out(targets, name)
    assert torch.equal(view, targets)
    assert (view.stride(), view.storage_offset()) == (((1,), 1) if name == "offset" else ((2,), 0))
    buffer = torch.empty(0, dtype=torch.int64).set_(view.untyped_storage())
    assert int((buffer == TARGET_POISON).sum()) == (1 if name == "offset" else 3)


def test_contiguous_is_the_tensor_itself() -> None:
    values = torch.ones(2, 3)
    assert laid_out(values, "contiguous") is values


@pytest.mark.parametrize("name", VALUE_FORMS)
def test_a_leaf_gets_its_gradient_only_through_the_view(name: str) -> None:
    values = torch.arange(6.0).reshape(2, 3)
    leaf, view = laid_out_leaf(values, name)
    assert leaf.requires_grad and torch.equal(view, values)
    (view * torch.arange(6.0).reshape(2, 3)).sum().backward()
    assert leaf.grad is not None
    assert float(leaf.grad.sum()) == 15.0 and int((leaf.grad != 0).sum()) == 5


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"values": "transposed"}, "values='transposed'"),
        ({"targets": "row gap"}, "targets='row gap'"),
        ({"weight": "step"}, "weight='step'"),
    ],
)
def test_an_unknown_form_is_refused_naming_the_role(fields: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        InputForm(**fields)


@pytest.mark.parametrize(
    "data", [None, {"values": "contiguous"}, {"values": 1, "targets": "step", "weight": "offset"}]
)
def test_from_dict_refuses_what_to_dict_never_writes(data: Any) -> None:
    with pytest.raises(ValueError, match=r"input_form|values"):
        InputForm.from_dict(data)


def test_forms_shrink_to_contiguous_and_reach_every_layout() -> None:
    assert find(input_forms(fused=True), lambda form: True) == InputForm()
    for name in VALUE_FORMS:
        find(input_forms(fused=True), lambda form, n=name: form.values == n == form.weight)
    for name in TARGET_FORMS:
        find(input_forms(), lambda form, n=name: form.targets == n)
    assert find(input_forms(), lambda form: True).weight == "contiguous"


@pytest.mark.parametrize("targets", TARGET_FORMS)
@pytest.mark.parametrize("values", VALUE_FORMS[1:])
def test_the_op_sees_the_form_and_a_sub_batch_keeps_it(
    values: str, targets: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    form = InputForm(values, targets)
    case = padding_case().replace(form=form)
    seen: list[tuple[Any, ...]] = []
    dispatch = BackendUnderTest.op_for

    def op_for(self: BackendUnderTest, contract: Any) -> Any:
        op = dispatch(self, contract)

        def spy(logits: Any, ids: Any, rank_contract: Any, group: Any = None) -> Any:
            seen.append((logits.stride(), logits.storage_offset(), ids.stride()))
            return op(logits, ids, rank_contract, group=group)

        return spy

    monkeypatch.setattr(BackendUnderTest, "op_for", op_for)
    execute(backend("torch_native"), case)
    full = laid_out(case.torch_logits(), values)
    ids = laid_out(case.torch_targets(), targets).stride()
    shards = [full[:, 0:3], full[:, 3:5]]
    assert sorted(seen) == sorted((s.stride(), s.storage_offset(), ids) for s in shards)
    assert sub_batch(case, [1, 0]).form == form
    assert case != padding_case() and case.replace(form=InputForm()) == padding_case()
    assert "laid out values" in case.describe()


def test_an_artifact_rebuilds_the_form_and_replays_the_layout_bug(tmp_path: Path) -> None:
    case = padding_case().replace(form=InputForm("column major", "step"))
    mutant = backend(LAYOUT_MUTANT)
    path = write_artifact(
        tmp_path, SUITE, prop="oracle", backend=mutant, case=case, params={},
        failure="oracle agreement", seed=1,
    )  # fmt: skip
    document = json.loads(path.read_text())
    assert document["input_form"] == {
        "values": "column major",
        "targets": "step",
        "weight": "contiguous",
    }
    artifact = load_artifact(path, SUITE)
    assert artifact.case.form == case.form and artifact.case == case
    failed = replay(artifact, mutant, SUITE)
    assert failed.outcome is Outcome.FAILED
    assert "layout    values column major, targets step" in failed.detail
    assert replay(artifact, backend("torch_native"), SUITE).outcome is Outcome.PASSED
    contiguous = write_artifact(
        tmp_path / "plain", SUITE, prop="oracle", backend=mutant, case=padding_case(),
        params={}, failure="oracle agreement", seed=1,
    )  # fmt: skip
    assert contiguous.stem != path.stem
    plain = load_artifact(contiguous, SUITE)
    assert replay(plain, mutant, SUITE).outcome is Outcome.PASSED


def test_an_artifact_with_a_changed_form_no_longer_matches_its_name(tmp_path: Path) -> None:
    case = padding_case().replace(form=InputForm("row gap"))
    path = write_artifact(
        tmp_path, SUITE, prop="oracle", backend=backend("torch_native"), case=case, params={},
        failure="x", seed=1,
    )  # fmt: skip
    document = json.loads(path.read_text())
    document["input_form"]["values"] = "offset"
    path.write_text(json.dumps(document))
    with pytest.raises(ArtifactError, match="content hash"):
        load_artifact(path, SUITE)
    document["input_form"]["values"] = "diagonal"
    path.write_text(json.dumps(document))
    with pytest.raises(ArtifactError, match="input_form: values='diagonal'"):
        load_artifact(path, SUITE)


def test_a_case_without_a_form_is_contiguous_and_keeps_its_digest() -> None:
    case = padding_case()
    assert case.form.contiguous and isinstance(case, LogprobCase)
    rebuilt = LogprobCase(case.contract, np.array(case.logits), np.array(case.targets))
    assert rebuilt.digest() == case.digest()


def test_a_schema_4_artifact_loads_as_contiguous(tmp_path: Path) -> None:
    path = write_artifact(
        tmp_path, SUITE, prop="oracle", backend=backend("torch_native"), case=padding_case(),
        params={}, failure="x", seed=1,
    )  # fmt: skip
    document = json.loads(path.read_text())
    document["schema_version"] = 4
    document.pop("input_form")
    path.write_text(json.dumps(document))
    assert load_artifact(path, SUITE).case.form == InputForm()
