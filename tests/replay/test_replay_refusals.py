"""Artifacts are data only: anything tampered, truncated, pickled or off-schema is refused."""

from __future__ import annotations

import io
import json
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.artifacts import write_padding_artifact
from tp_logprob.__main__ import main
from tp_logprob.replay.artifacts import ArtifactError, load_artifact
from tp_logprob.replay.catalogue import suite_properties

SUITE = suite_properties()


class _Payload:
    """Unpickling this would create a file: proof that nothing was unpickled."""

    marker = Path()

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def _edit_json(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        document = json.loads(path.read_text())
        change(document)
        path.write_text(json.dumps(document))

    return edit


def _edit_arrays(
    change: Callable[[dict[str, np.ndarray[Any, Any]]], None],
) -> Callable[[Path], None]:

    def edit(path: Path) -> None:
        npz = path.with_suffix(".npz")
        with np.load(npz, allow_pickle=False) as stored:
            arrays = {key: np.array(stored[key]) for key in stored.files}
        change(arrays)
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        npz.write_bytes(buffer.getvalue())

    return edit


def _set(*keys: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(document: dict[str, Any]) -> None:
        for key in keys[:-1]:
            document = document[key]
        document[keys[-1]] = value

    return change


def _logit_changed(arrays: dict[str, np.ndarray[Any, Any]]) -> None:
    arrays["logits"][0, 0] = 0.75


def _pickled_npz(path: Path) -> None:
    with zipfile.ZipFile(path.with_suffix(".npz"), "a") as archive:
        buffer = io.BytesIO()
        np.save(buffer, np.array([_Payload()], dtype=object), allow_pickle=True)
        archive.writestr("evil.npy", buffer.getvalue())


def _pickled_mask(path: Path) -> None:
    npz = path.with_suffix(".npz")
    with np.load(npz, allow_pickle=False) as stored:
        arrays: dict[str, Any] = {key: np.array(stored[key]) for key in stored.files}
    arrays["mask"] = np.array([_Payload(), True], dtype=object)
    buffer = io.BytesIO()
    np.savez(buffer, allow_pickle=True, **arrays)
    npz.write_bytes(buffer.getvalue())
    _edit_json(_set("arrays", "mask", "dtype", value="object"))(path)


REFUSALS = {
    "logit changed after writing": (_edit_arrays(_logit_changed), "content hash"),
    "mask flipped (digest)": (
        _edit_arrays(lambda a: a.__setitem__("mask", np.array([True, True]))),
        "mask.active_mask_sha256",
    ),
    "extra pickled member": (_pickled_npz, "holds"),
    "pickled object array": (_pickled_mask, "arrays.mask.dtype"),
    "npz replaced by a pickle": (
        lambda p: p.with_suffix(".npz").write_bytes(pickle.dumps(_Payload())),
        "not an .npz",
    ),
    "npz truncated": (
        lambda p: p.with_suffix(".npz").write_bytes(p.with_suffix(".npz").read_bytes()[:200]),
        "unreadable",
    ),
    "npz missing": (lambda p: p.with_suffix(".npz").unlink(), "cannot read"),
    "json truncated": (lambda p: p.write_text(p.read_text()[:100]), "not valid JSON"),
    "NaN constant in json": (
        lambda p: p.write_text(
            p.read_text().replace('"hypothesis_seed": 1234', '"hypothesis_seed": NaN')
        ),
        "non-standard JSON constant",
    ),
    "future schema version": (_edit_json(_set("schema_version", value=6)), "schema_version=6"),
    "unknown top-level key": (
        _edit_json(_set("command", value="rm -rf /")),
        "unexpected ['command']",
    ),
    "unknown property": (_edit_json(_set("property", value="os.system")), "not a replayable"),
    "shape disagrees with contract": (
        _edit_json(_set("contract", "mask", "num_tokens", value=3)),
        "the contract needs",
    ),
    "declared shape disagrees with npz": (
        _edit_json(_set("arrays", "padding", "shape", value=[2, 2])),
        "the JSON declares",
    ),
    "bad capability": (
        _edit_json(_set("backend", "capability", "roles", value=["sudo"])),
        "backend.capability",
    ),
    "param of the wrong kind": (
        _edit_json(_set("params", value={"padding": 1.0})),
        "unknown key 'padding'",
    ),
    "huge num_tokens": (
        _edit_json(_set("contract", "mask", "num_tokens", value=10**12)),
        "num_tokens",
    ),
}


@pytest.mark.parametrize("tamper", list(REFUSALS))
def test_refused(tmp_path: Path, tamper: str) -> None:
    edit, message = REFUSALS[tamper]
    path = write_padding_artifact(tmp_path)
    _Payload.marker = tmp_path / "unpickled"
    edit(path)
    with pytest.raises(ArtifactError, match="refused") as caught:
        load_artifact(path, SUITE)
    assert message in str(caught.value)
    assert not _Payload.marker.exists()


def test_renamed_artifact_is_refused(tmp_path: Path) -> None:
    path = write_padding_artifact(tmp_path)
    renamed = path.with_name("0" * 64 + ".json")
    path.rename(renamed)
    path.with_suffix(".npz").rename(renamed.with_suffix(".npz"))
    with pytest.raises(ArtifactError, match="does not match the file name"):
        load_artifact(renamed, SUITE)


def test_cli_exits_2_on_a_bad_artifact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_padding_artifact(tmp_path)
    _edit_arrays(_logit_changed)(path)
    assert main(["replay", str(path), "--backend", "torch_native", "--platform", "cpu"]) == 2
    assert "BAD" in capsys.readouterr().out
    assert main(["pin", str(path), "--to", str(tmp_path / "pinned")]) == 2
