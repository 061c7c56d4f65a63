"""Failure artifacts: one failing example as ``<name>.npz`` (arrays) + ``<name>.json`` (the rest).

The name is the sha256 of the case's content, the property and the backend id,
so the same failure found twice (or by two xdist workers at once) is one
artifact, and a tampered one no longer matches its name. Writes go through a
temporary file and an atomic :func:`os.replace`; the ``.json`` is written last.

A fused LM-head case (``input_kind="hidden"``) also stores its operands
``hidden``, ``weight`` and ``bias``; :mod:`tp_logprob.replay.fused` says what is
checked before it is rebuilt. A case whose contract replays a sampling mask stores
its ``kept_offsets`` and ``kept_ids`` (:mod:`tp_logprob.replay.support`); sampling
parameters live in the contract's JSON. Schema version 2 added the operands, 3
the kept ids and 4 the bits of the outputs the backend returned on the case
(``output_bits``, :mod:`tp_logprob.replay.bits`), so a failure recorded on a GPU
replays bit for bit elsewhere; 5 the layout the op was handed (``input_form``,
:mod:`tp_logprob.strategies.input_forms`), which replay rebuilds, strides and offset
included. Version 1 to 4 artifacts still load (without bits before 4, contiguous
before 5).

Artifacts are data only. :func:`load_artifact` refuses anything that does not
fit the schema (sizes, types, ranges, array dtypes and shapes against the
contract, the mask digest, the content hash) with :class:`ArtifactError`; it
never unpickles, and it never imports a module named inside an artifact.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import platform as platform_module
import shlex
import tempfile
import zipfile
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from tp_logprob.contract import LogprobContract, LogprobInputKind
from tp_logprob.errors import LogprobContractError
from tp_logprob.replay.bits import decode_bits, encode_bits, observed_bits
from tp_logprob.replay.fused import (
    FUSED_ARRAYS,
    load_fused_case,
    operand_arrays,
    operand_names,
)
from tp_logprob.replay.schema import ArtifactError, check_document
from tp_logprob.replay.support import SUPPORT_ARRAYS, kept_arrays, support_arrays, support_names
from tp_logprob.strategies import InputForm, LogprobCase, round_to_dtype
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.params import PropertySpec
from tp_logprob.suite.property import SuiteProperty

__all__ = [
    "ARTIFACT_FORMAT",
    "READABLE_SCHEMA_VERSIONS",
    "SCHEMA_VERSION",
    "ArtifactError",
    "FailureArtifact",
    "artifact_paths",
    "atomic_write",
    "command_to_replay",
    "content_name",
    "load_artifact",
    "write_artifact",
]

ARTIFACT_FORMAT = "tp-logprob-failure"
SCHEMA_VERSION = 5
"""Version 5 added the layout the op was handed (``input_form``); 4 the outputs' bits
(``output_bits``); 3 a replayed support's kept ids (``kept_offsets``, ``kept_ids``); 2 the
fused LM head's operands (``hidden``, ``weight``, ``bias``)."""
READABLE_SCHEMA_VERSIONS = (1, 2, 3, 4, 5)
MAX_JSON_BYTES = 1 << 20
MAX_NPZ_BYTES = 256 << 20
_CASE_ARRAYS = ("logits", "targets", "mask")
_PACKAGES = ("tp-logprob", "torch", "triton", "hypothesis", "numpy", "mpmath")


@dataclass(frozen=True)
class FailureArtifact:
    """A loaded, validated artifact: the case, the property, what it drew, and provenance."""

    name: str
    prop: str
    backend_id: str
    backend_spec: str
    capability: dict[str, Any]
    case: LogprobCase
    params: dict[str, Any]
    document: dict[str, Any]
    json_path: Path
    output_bits: dict[str, Any] | None = None  # field -> uint32 bits, as recorded
    platform: str = "cpu"  # where it was recorded

    @property
    def npz_path(self) -> Path:
        return self.json_path.with_suffix(".npz")


def _split_params(
    params: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]]]:
    scalars: dict[str, Any] = {}
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    for key, value in params.items():
        if isinstance(value, np.ndarray):
            arrays[key] = np.ascontiguousarray(value)
        elif isinstance(value, np.generic):
            scalars[key] = value.item()
        elif isinstance(value, tuple):
            scalars[key] = [list(v) if isinstance(v, tuple) else v for v in value]
        else:
            scalars[key] = value
    return scalars, arrays


def _case_arrays(case: LogprobCase) -> dict[str, np.ndarray[Any, Any]]:
    return {
        "logits": np.ascontiguousarray(case.logits, dtype=np.float32),
        "targets": np.ascontiguousarray(case.targets, dtype=np.int64),
        "mask": np.ascontiguousarray(case.active, dtype=np.bool_),
        **operand_arrays(case),
        **support_arrays(case),
    }


def content_name(
    prop: str,
    backend_id: str,
    contract: Mapping[str, Any],
    scalars: Mapping[str, Any],
    arrays: Mapping[str, np.ndarray[Any, Any]],
    form: InputForm | None = None,
) -> str:
    """sha256 of the canonical content: property, backend id, contract, params, array bytes
    and a non-contiguous input form.

    ``contract`` is the recorded ``LogprobContract.to_dict()``, hashed as written, so
    artifacts from an older contract schema keep their names, as do contiguous cases.
    """
    header = {
        "format": ARTIFACT_FORMAT,
        "property": prop,
        "backend_id": backend_id,
        "contract": dict(contract),
        "params": {key: scalars[key] for key in sorted(scalars) if scalars[key] is not None},
    }
    if form is not None and not form.contiguous:
        header["input_form"] = form.to_dict()
    hasher = hashlib.sha256(json.dumps(header, sort_keys=True, separators=(",", ":")).encode())
    for key in sorted(arrays):
        array = np.ascontiguousarray(arrays[key])
        hasher.update(f"\0{key}:{array.dtype.str}:{list(array.shape)}\0".encode())
        hasher.update(array.tobytes())
    return hasher.hexdigest()


def _environment() -> dict[str, Any]:
    packages: dict[str, str | None] = {}
    for package in _PACKAGES:
        try:
            packages[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            packages[package] = None
    return {
        "python": platform_module.python_version(),
        "machine": platform_module.platform(),
        "packages": packages,
    }


def command_to_replay(path: str | os.PathLike[str], backend_spec: str) -> str:
    """The command that replays the artifact at ``path``, to paste as it is: a backend
    given as ``module:attr`` (or ``path/to/file.py:attr``) is named with ``--backend``,
    since replay never imports a module an artifact names."""
    command = ["python", "-m", "tp_logprob", "replay", str(path)]
    if ":" in backend_spec:
        command += ["--backend", backend_spec]
    return shlex.join(command)


def write_artifact(
    directory: str | os.PathLike[str],
    properties: Collection[str],
    *,
    prop: str,
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    failure: BaseException | str,
    seed: int | str | None = None,
    test: str | None = None,
    output_bits: Mapping[str, Any] | None = None,
) -> Path:
    """Write one failing example of property ``prop`` (one of ``properties``: the catalogue, or
    the names a caller may record); return the ``.json`` path (the existing one if already
    written).

    ``output_bits`` (field -> uint32 bits) are the outputs ``backend`` returned on
    ``case``; by default the case is run once more to take them
    (:func:`~tp_logprob.replay.bits.observed_bits`), and none are recorded if that raises.
    """
    if prop not in properties:
        raise ValueError(f"prop={prop!r}: not a replayable property ({sorted(properties)})")
    scalars, extra = _split_params(params)
    reserved = _CASE_ARRAYS + FUSED_ARRAYS + SUPPORT_ARRAYS
    if set(extra) & set(reserved):
        raise ValueError(f"params: array names {sorted(extra)} collide with {reserved}")
    arrays = {**_case_arrays(case), **extra}
    name = content_name(
        prop, backend.backend_id, case.contract.to_dict(), scalars, arrays, case.form
    )
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    json_path = folder / f"{name}.json"
    if json_path.exists():
        return json_path  # same name, same content: keep the first
    message = str(failure) if isinstance(failure, str) else _failure_text(failure)
    bits = _recorded_bits(backend, case) if output_bits is None else dict(output_bits)
    document = {
        "format": ARTIFACT_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "name": name,
        "property": prop,
        "backend": {
            "id": backend.backend_id,
            "spec": backend.spec,
            "capability": backend.capability.to_dict(),
        },
        "platform": backend.platform,
        "contract": case.contract.to_dict(),
        "params": scalars,
        "arrays": {
            key: {"dtype": array.dtype.name, "shape": list(array.shape)}
            for key, array in sorted(arrays.items())
        },
        "test": test,
        "hypothesis_seed": seed,
        "environment": _environment(),
        "failure": {
            "type": "str" if isinstance(failure, str) else type(failure).__name__,
            "summary": message[:20_000],
        },
        "output_bits": None if bits is None else encode_bits(bits),
        "input_form": case.form.to_dict(),
    }
    buffer = io.BytesIO()
    np.savez(buffer, allow_pickle=False, **arrays)
    atomic_write(folder / f"{name}.npz", buffer.getvalue())
    text = json.dumps(document, indent=2, sort_keys=True, allow_nan=False) + "\n"
    atomic_write(json_path, text.encode())
    return json_path


def _recorded_bits(backend: BackendUnderTest, case: LogprobCase) -> dict[str, Any] | None:
    """The outputs' bits of one more run, or None where the run cannot give them."""
    if backend.capability.real_group_only:
        return None  # runs on a real group only: nothing to rerun here
    try:  # on the emulated group, as replay runs it (not the real group's other ranks)
        return observed_bits(dataclasses.replace(backend, group=None), case)
    except Exception:  # the failure may be that the op raises: then there are no bits
        return None


def _failure_text(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if not text.strip() or "\n" not in text else text


def atomic_write(path: Path, data: bytes) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def artifact_paths(path: str | os.PathLike[str]) -> list[Path]:
    """The ``.json`` files ``path`` names: itself (``.json``, ``.npz``, a stem) or a folder's."""
    target = Path(path)
    if target.is_dir():
        return sorted(p for p in target.glob("*.json") if not p.name.startswith("."))
    if target.suffix in (".json", ".npz"):
        return [target.with_suffix(".json")]
    return [target.with_name(target.name + ".json")]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        size = path.stat().st_size
    except OSError as error:
        raise ArtifactError(path, f"cannot read: {error.strerror or error}") from None
    if size > MAX_JSON_BYTES:
        raise ArtifactError(path, f"{size} bytes; an artifact's JSON is at most {MAX_JSON_BYTES}")

    def no_constants(token: str) -> Any:
        raise ValueError(f"non-standard JSON constant {token}")

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        if len(keys) != len(set(keys)):
            raise ValueError(f"duplicate keys in an object: {sorted(keys)}")
        return dict(pairs)

    try:
        document = json.loads(
            path.read_bytes().decode("utf-8"),
            parse_constant=no_constants,
            object_pairs_hook=unique_keys,
        )
    except (UnicodeDecodeError, ValueError) as error:
        raise ArtifactError(path, f"not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise ArtifactError(path, "not a JSON object")
    return document


def _expected_nbytes(dtype: np.dtype[Any], shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def _read_npz(
    path: Path, declared: Mapping[str, Mapping[str, Any]]
) -> dict[str, np.ndarray[Any, Any]]:
    """The arrays of ``path``, each exactly as ``declared`` (dtype, shape), without pickle."""
    try:
        size = path.stat().st_size
        with path.open("rb") as file:
            magic = file.read(4)
    except OSError as error:
        raise ArtifactError(path, f"cannot read: {error.strerror or error}") from None
    if size > MAX_NPZ_BYTES:
        raise ArtifactError(path, f"{size} bytes; an artifact's arrays are at most {MAX_NPZ_BYTES}")
    if magic != b"PK\x03\x04":
        raise ArtifactError(path, "not an .npz (zip) file; pickles and other formats are refused")
    wanted = {f"{key}.npy": key for key in declared}
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    try:
        with zipfile.ZipFile(path) as archive:
            members = {info.filename: info for info in archive.infolist()}
            if set(members) != set(wanted):
                raise ArtifactError(
                    path, f"holds {sorted(members)}, the JSON declares {sorted(wanted)}"
                )
            for member, key in wanted.items():
                dtype = np.dtype(declared[key]["dtype"])
                shape = tuple(declared[key]["shape"])
                limit = _expected_nbytes(dtype, shape) + 4096  # the .npy header
                if members[member].file_size > limit:
                    raise ArtifactError(path, f"{member}: larger than its declared shape allows")
                with archive.open(member) as stream:
                    array = np.lib.format.read_array(
                        io.BytesIO(stream.read(limit + 1)), allow_pickle=False
                    )
                if array.dtype != dtype or array.shape != shape:
                    raise ArtifactError(
                        path,
                        f"{key}: {array.dtype} {list(array.shape)}, the JSON declares "
                        f"{dtype} {list(shape)}",
                    )
                arrays[key] = array
    except ArtifactError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as error:
        raise ArtifactError(path, f"unreadable arrays: {error}") from None
    return arrays


def load_artifact(
    path: str | os.PathLike[str], properties: Mapping[str, SuiteProperty]
) -> FailureArtifact:
    """Load and validate one artifact (its ``.json`` or ``.npz`` path, or the stem) of one of
    ``properties``, against that property's declared params.

    Raises :class:`ArtifactError` saying what is wrong; nothing in the artifact runs.
    """
    json_path = artifact_paths(path)[0]
    document = _read_json(json_path)
    check_document(json_path, document, properties, ARTIFACT_FORMAT, READABLE_SCHEMA_VERSIONS)
    if document["name"] != json_path.stem:
        raise ArtifactError(
            json_path, f"name={document['name']!r} does not match the file name {json_path.stem!r}"
        )
    arrays = _read_npz(json_path.with_suffix(".npz"), document["arrays"])
    contract = _contract(json_path, document, arrays)
    case = _case(json_path, document["schema_version"], contract, arrays)
    case = case.replace(form=_form(json_path, document))
    prop = document["property"]
    spec: PropertySpec = properties[prop].spec
    scalars = document["params"]
    problems = spec.param_problems(scalars)
    stored = _CASE_ARRAYS + operand_names(contract) + support_names(contract)
    extras = {key: value for key, value in arrays.items() if key not in stored}
    if set(extras) != set(spec.arrays):
        problems.append(f"arrays: {sorted(extras)}, property {prop!r} takes {sorted(spec.arrays)}")
    else:
        problems += [
            spec.arrays[key].problem(key, value, contract)
            for key, value in extras.items()
            if spec.arrays[key].problem(key, value, contract)
        ]
    if problems:
        raise ArtifactError(json_path, "; ".join(problems))
    backend = document["backend"]
    name = content_name(prop, backend["id"], document["contract"], scalars, arrays, case.form)
    if name != document["name"]:
        raise ArtifactError(
            json_path,
            f"content hash {name[:16]}... does not match the name {document['name'][:16]}...: "
            "the artifact was changed or corrupted after it was written",
        )
    return FailureArtifact(
        name=name,
        prop=prop,
        backend_id=backend["id"],
        backend_spec=backend["spec"],
        capability=backend["capability"],
        case=case,
        params={**scalars, **extras},
        document=document,
        json_path=json_path,
        output_bits=None
        if document.get("output_bits") is None
        else decode_bits(document["output_bits"]),
        platform=document["platform"],
    )


def _form(path: Path, document: Mapping[str, Any]) -> InputForm:
    """The layout the op was handed (contiguous before schema 5)."""
    if "input_form" not in document:
        return InputForm()
    try:
        return InputForm.from_dict(document["input_form"])
    except (ValueError, TypeError) as error:
        raise ArtifactError(path, f"input_form: {error}") from None


def _case(
    path: Path,
    schema_version: int,
    contract: LogprobContract,
    arrays: Mapping[str, np.ndarray[Any, Any]],
) -> LogprobCase:
    """The case: a fused one from its operands, else logits of the contract dtype."""
    if contract.input_kind is LogprobInputKind.HIDDEN:
        return load_fused_case(path, schema_version, contract, arrays)
    stray = sorted(set(FUSED_ARRAYS) & set(arrays))
    if stray:
        raise ArtifactError(
            path,
            f"{stray[0]}: a fused LM-head operand, but the contract has "
            f"input_kind={contract.input_kind.value!r}",
        )
    try:
        case = LogprobCase(contract, arrays["logits"], arrays["targets"])
    except LogprobContractError as error:
        raise ArtifactError(path, f"case: {error}") from None
    # A fused case's logits are fp32 of exact dot products, not dtype values: not checked here.
    exact = round_to_dtype(case.logits, contract.dtype)
    if not np.array_equal(exact, case.logits, equal_nan=True):
        raise ArtifactError(path, f"logits: values not representable in {contract.dtype}")
    return case


def _contract(
    path: Path, document: Mapping[str, Any], arrays: Mapping[str, np.ndarray[Any, Any]]
) -> LogprobContract:
    data = document["contract"]
    mask = arrays["mask"]
    rows = data["mask"]["num_tokens"]
    for key, dtype, shape in (
        ("logits", np.float32, (rows, data["sharding"]["padded_vocab_size"])),
        ("targets", np.int64, (rows,)),
        ("mask", np.bool_, (rows,)),
    ):
        if arrays[key].dtype != dtype or arrays[key].shape != shape:
            raise ArtifactError(
                path,
                f"{key}: {arrays[key].dtype} {list(arrays[key].shape)}, the contract needs "
                f"{np.dtype(dtype)} {list(shape)}",
            )
    # Schema 1 said whether a mask was given through its mode; schema 2 says it directly.
    per_token = data["mask"].get("explicit", data["mask"]["mode"] == "per_token")
    if not per_token and not mask.all():
        raise ArtifactError(path, "mask: the contract has no mask but the array has inactive rows")
    kept = kept_arrays(path, document["schema_version"], data, arrays)
    try:
        return LogprobContract.from_dict(data, mask if per_token else None, kept)
    except LogprobContractError as error:
        raise ArtifactError(path, f"contract: {error}") from None
