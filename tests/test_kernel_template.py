"""``python -m tp_logprob template``: the shipped example backend, written out for a user
with nothing but the installed package, never over an existing file, and runnable as is."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tp_logprob as tpl
from tp_logprob.__main__ import main
from tp_logprob.kernel_template import template_text
from tp_logprob.suite.backends import resolve_backends
from tp_logprob.testing import assert_logprob_close

SHIPPED = Path(tpl.__file__).parent / "templates" / "my_kernel.py"


def test_the_command_writes_the_shipped_template_and_says_how_to_run_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "mine.py"
    assert main(["template", str(target)]) == 0
    assert target.read_text(encoding="utf-8") == template_text() == SHIPPED.read_text("utf-8")
    assert capsys.readouterr().out == (
        f"wrote {target}; run the property suite on it with:\n"
        f"  pytest --pyargs tp_logprob.properties --tp-logprob-backend={target}:register\n"
    )


def test_an_existing_file_is_never_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "my_kernel.py"
    target.write_text("mine\n", encoding="utf-8")
    assert main(["template", str(target)]) == 2
    assert target.read_text(encoding="utf-8") == "mine\n"
    assert capsys.readouterr().err == (
        f"tp-logprob: {target} exists; not overwritten (name another FILE, or move it away)\n"
    )


def test_the_default_file_is_my_kernel_py(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["template"]) == 0
    assert (tmp_path / "my_kernel.py").read_text(encoding="utf-8") == template_text()


def test_the_written_template_registers_and_computes_exact_logprobs(tmp_path: Path) -> None:
    target = tmp_path / "written_kernel.py"
    assert main(["template", str(target)]) == 0
    (backend,) = resolve_backends([f"{target}:register"], "cpu")
    assert backend.backend_id == "my_kernel"
    assert sys.modules["tp_logprob_user_backend_written_kernel"].__file__ == str(target)
    contract = tpl.LogprobContract(
        role="train",
        dtype="fp32",
        mask=tpl.MaskSpec(num_tokens=3),
        sharding=tpl.ShardingSpec(
            tp_rank=0,
            tp_world_size=1,
            vocab_shard_bounds=((0, 40),),
            real_vocab_size=37,
            padded_vocab_size=40,
        ),
        reduction=tpl.ReductionSpec(determinism_scope="fixed_topology"),
    )
    rng = np.random.default_rng(0)
    logits = torch.tensor(rng.normal(size=(3, 40)) * 3, dtype=torch.float32, requires_grad=True)
    targets = torch.tensor([0, 17, 36])
    selected, lse = backend.op_for(contract)(logits, targets, contract)
    selected.sum().backward()
    assert_logprob_close(selected, logits, targets, lse=lse, grad=logits.grad, real_vocab_size=37)


def test_the_guide_declares_the_capability_the_template_declares() -> None:
    guide = (Path(__file__).resolve().parents[1] / "docs" / "verify-your-kernel.md").read_text()
    section = guide[guide.index("## 3. Declare what it serves") :]
    block = section[section.index("```python\n") + len("```python\n") :]
    assert block[: block.index("```")] in template_text()


GUIDE = Path(__file__).resolve().parents[1] / "docs" / "verify-your-kernel.md"
PLANTED = "live = local_logits.float()"
"""The padding bug section 6 of the guide plants: ``_live`` reads every column."""


def test_the_guide_registers_and_counts_the_template_as_it_is() -> None:
    guide = GUIDE.read_text(encoding="utf-8")
    section = guide[guide.index("## 4. Hand it to the suite") :]
    block = section[section.index("```python\n") + len("```python\n") :]
    assert block[: block.index("```")] in template_text()
    assert f"{len(template_text().splitlines())} lines of torch" in guide


def test_the_guide_s_planted_padding_bug_is_caught(tmp_path: Path) -> None:
    guide = GUIDE.read_text(encoding="utf-8")
    assert f"`_live` reading every column, `{PLANTED}`" in guide
    sliced = "live = local_logits[:, : live_end - start].float()"
    assert template_text().count(sliced) == 1
    target = tmp_path / "planted_kernel.py"
    target.write_text(template_text().replace(sliced, PLANTED), encoding="utf-8")
    (backend,) = resolve_backends([f"{target}:register"], "cpu")
    contract = tpl.LogprobContract(
        role="infer",
        dtype="fp32",
        mask=tpl.MaskSpec(num_tokens=1),
        sharding=tpl.ShardingSpec(
            tp_rank=0,
            tp_world_size=1,
            vocab_shard_bounds=((0, 2),),
            real_vocab_size=1,
            padded_vocab_size=2,
        ),
        reduction=tpl.ReductionSpec(determinism_scope="fixed_topology"),
    )
    logits = torch.tensor([[0.12573, -0.132105]])  # the guide's shrunk row: live, padding
    targets = torch.tensor([0])
    selected, lse = backend.op_for(contract)(logits, targets, contract)
    with pytest.raises(AssertionError, match="outside the tolerance"):
        assert_logprob_close(selected, logits[:, :1], targets, lse=lse)
