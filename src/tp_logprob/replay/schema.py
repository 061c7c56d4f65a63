"""The explicit schema of an artifact's JSON: every key, type and range, checked before use."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tp_logprob.accumulation import AccumulationOrder
from tp_logprob.capability import LogprobBackendCapability
from tp_logprob.errors import LogprobContractError
from tp_logprob.registry import PLATFORMS

__all__ = [
    "MAX_RECORDED_ELEMENTS",
    "OUTPUT_FIELDS",
    "ArtifactError",
    "bits_problems",
    "capability_from_dict",
    "check_document",
]

MAX_ELEMENTS = 1 << 24
"""At most this many elements in one artifact's arrays together."""

_TOP_KEYS = {
    "format",
    "schema_version",
    "name",
    "property",
    "backend",
    "platform",
    "contract",
    "params",
    "arrays",
    "test",
    "hypothesis_seed",
    "environment",
    "failure",
}
_BITS_KEY = "output_bits"  # schema 4: the recorded outputs' bits (tp_logprob.replay.bits)
_FIRST_WITH_BITS = 4
_FORM_KEY = (
    "input_form"  # schema 5: the layout the op was handed (tp_logprob.strategies.input_forms)
)
_FIRST_WITH_FORM = 5
OUTPUT_FIELDS = ("selected_logp", "lse", "entropy", "support_lse", "support_threshold")
"""The fp32 outputs of a :class:`~tp_logprob.result.LogprobResult` whose bits are recorded."""
MAX_RECORDED_ELEMENTS = 1 << 15
"""Bits are recorded for at most this many elements in all (8 hex digits each)."""
_HEX = re.compile(r"[0-9a-f]*")
_DTYPES = ("float32", "int64", "bool")
_NAME = re.compile(r"[0-9a-f]{64}")
_ARRAY_NAME = re.compile(r"[a-z_][a-z0-9_]{0,39}")


class ArtifactError(ValueError):
    """An artifact that is missing, malformed, tampered with or otherwise unsafe to replay."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: refused: {problem}")
        self.path = path
        self.problem = problem


def _is_int(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _is_str(value: object, longest: int = 500) -> bool:
    return isinstance(value, str) and 0 < len(value) <= longest


# Schema-1 mask modes: "per_token" was an explicit mask; "all_active" meant no mask,
# the capability mode of that name today.
_MASK_MODE_NAMES = {"per_token": "explicit_active_mask"}

_CONTRACT_MASK_MODES = ("all_active", "per_token", "explicit_active_mask", "ignore_index")


def capability_from_dict(data: Mapping[str, Any]) -> LogprobBackendCapability:
    """Rebuild a recorded capability; its constructor validates every field."""

    def sizes(key: str) -> frozenset[int] | None:
        return None if data[key] is None else frozenset(data[key])

    return LogprobBackendCapability(
        backend_id=data["backend_id"],
        roles=frozenset(data["roles"]),
        dtypes=frozenset(data["dtypes"]),
        tp_world_sizes=sizes("tp_world_sizes"),
        cp_world_sizes=sizes("cp_world_sizes"),
        supports_vocab_padding=data["supports_vocab_padding"],
        exports_vocab_lse=data["exports_vocab_lse"],
        determinism_scopes=frozenset(data["determinism_scopes"]),
        implementation_kind=data["implementation_kind"],
        # Recorded before temperature and entropy existed: the backend claimed neither.
        supports_temperature=data.get("supports_temperature", False),
        exports_entropy=data.get("exports_entropy", False),
        even_shards_only=data.get("even_shards_only", False),
        consumes_input=data.get("consumes_input", False),
        real_group_only=data.get("real_group_only", False),
        # Recorded before the fused LM head: the backend took logits.
        input_kinds=frozenset(data.get("input_kinds", ["logits"])),
        # Recorded before supports_bias: every fused backend was sent bias contracts.
        supports_bias=data.get("supports_bias", "hidden" in data.get("input_kinds", ())),
        mask_modes=frozenset(_MASK_MODE_NAMES.get(mode, mode) for mode in data["mask_modes"]),
        # Recorded before sampling supports: the backend served the full vocabulary only.
        support_modes=frozenset(data.get("support_modes", ["full"])),
        # Recorded before heterogeneous batches: one set of parameters per batch only.
        supports_row_parameters=data.get("supports_row_parameters", False),
        # Recorded before cross_platform_bitwise: no platform's bits were claimed.
        bitwise_platforms=frozenset(data.get("bitwise_platforms", [])),
        # Recorded before declared orders: any order.
        accumulation_order=AccumulationOrder.from_dict(
            data.get("accumulation_order", {"kind": "any"})
        ),
    )


def _backend_problems(backend: object) -> list[str]:
    if not isinstance(backend, dict) or set(backend) != {"id", "spec", "capability"}:
        return ["backend: expected an object with keys capability, id, spec"]
    problems = []
    if not _is_str(backend["id"], 200):
        problems.append(f"backend.id={backend['id']!r}: expected a short string")
    if not _is_str(backend["spec"]):
        problems.append(f"backend.spec={backend['spec']!r}: expected a string")
    try:
        capability = capability_from_dict(backend["capability"])
    except (KeyError, TypeError, LogprobContractError) as error:
        problems.append(f"backend.capability: {error}")
    else:
        if capability.backend_id != backend["id"]:
            problems.append(
                f"backend.capability.backend_id={capability.backend_id!r} != backend.id"
            )
    return problems


def _contract_problems(contract: object) -> list[str]:
    try:
        rows = contract["mask"]["num_tokens"]  # type: ignore[index]
        padded = contract["sharding"]["padded_vocab_size"]  # type: ignore[index]
        mode = contract["mask"]["mode"]  # type: ignore[index]
    except (KeyError, TypeError):
        return [
            "contract: expected an object with mask.num_tokens, mask.mode and "
            "sharding.padded_vocab_size"
        ]
    problems = []
    if not _is_int(rows, 0, 1 << 20):
        problems.append(f"contract.mask.num_tokens={rows!r}: expected an int in [0, 2^20]")
    if not _is_int(padded, 1, 1 << 24):
        problems.append(f"contract.sharding.padded_vocab_size={padded!r}: expected [1, 2^24]")
    if mode not in _CONTRACT_MASK_MODES:
        problems.append(f"contract.mask.mode={mode!r}: expected one of {_CONTRACT_MASK_MODES}")
    return problems


def _arrays_problems(arrays: object) -> list[str]:
    if not isinstance(arrays, dict):
        return ["arrays: expected an object"]
    problems = []
    total = 0
    for key, entry in arrays.items():
        if not _ARRAY_NAME.fullmatch(key):
            problems.append(f"arrays: bad array name {key!r}")
            continue
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape"}:
            problems.append(f"arrays.{key}: expected an object with keys dtype, shape")
            continue
        shape = entry["shape"]
        if entry["dtype"] not in _DTYPES:
            problems.append(f"arrays.{key}.dtype={entry['dtype']!r}: expected one of {_DTYPES}")
        if not (
            isinstance(shape, list)
            and len(shape) <= 2
            and all(_is_int(s, 0, 1 << 24) for s in shape)
        ):
            problems.append(f"arrays.{key}.shape={shape!r}: expected up to 2 sizes")
            continue
        count = 1
        for size in shape:
            count *= size
        total += count
    missing = {"logits", "targets", "mask"} - set(arrays)
    if missing:
        problems.append(f"arrays: missing {sorted(missing)}")
    if total > MAX_ELEMENTS:
        problems.append(f"arrays: {total} elements in all; at most {MAX_ELEMENTS}")
    return problems


def bits_problems(recorded: object) -> list[str]:
    """Every way a document's ``output_bits`` (null or the :func:`encode_bits` form) is wrong."""
    if recorded is None:
        return []
    if not isinstance(recorded, dict):
        return ["output_bits: expected an object or null"]
    problems = []
    for field, entry in recorded.items():
        where = f"output_bits.{field}"
        if field not in OUTPUT_FIELDS:
            problems.append(f"{where}: not one of {OUTPUT_FIELDS}")
            continue
        if not isinstance(entry, dict) or set(entry) != {"shape", "hex"}:
            problems.append(f"{where}: expected an object with keys hex, shape")
            continue
        shape, text = entry["shape"], entry["hex"]
        sizes = isinstance(shape, list) and len(shape) <= 2
        if not (sizes and all(_is_int(s, 0, MAX_RECORDED_ELEMENTS) for s in shape)):
            problems.append(f"{where}.shape={shape!r}: expected up to 2 sizes")
            continue
        count = _count(shape)
        if not (isinstance(text, str) and len(text) == 8 * count and _HEX.fullmatch(text)):
            problems.append(
                f"{where}.hex: expected {8 * count} lowercase hex digits (shape {shape})"
            )
    return problems


def _count(shape: list[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def check_document(
    path: Path,
    document: Mapping[str, Any],
    properties: Mapping[str, Any],
    fmt: str,
    versions: tuple[int, ...],
) -> None:
    """Raise :class:`ArtifactError` listing every way ``document`` breaks the schema.

    Schema 5 added ``input_form``, 4 ``output_bits``; older versions are read without them.
    """
    if document.get("format") != fmt:
        raise ArtifactError(path, f"format={document.get('format')!r}: expected {fmt!r}")
    version = document.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or version not in versions:
        raise ArtifactError(
            path,
            f"schema_version={version!r}: this version reads {', '.join(str(v) for v in versions)}",
        )
    expected = (
        _TOP_KEYS
        | ({_BITS_KEY} if version >= _FIRST_WITH_BITS else set())
        | ({_FORM_KEY} if version >= _FIRST_WITH_FORM else set())
    )
    keys = set(document)
    if keys != expected:
        extra, missing = sorted(keys - expected), sorted(expected - keys)
        raise ArtifactError(path, f"keys: unexpected {extra}, missing {missing}")
    problems = bits_problems(document.get(_BITS_KEY))
    if not (isinstance(document["name"], str) and _NAME.fullmatch(document["name"])):
        problems.append(f"name={document['name']!r}: expected 64 lowercase hex digits")
    if document["property"] not in properties:
        problems.append(
            f"property={document['property']!r}: not a replayable property ({sorted(properties)})"
        )
    if document["platform"] not in PLATFORMS:
        problems.append(f"platform={document['platform']!r}: expected one of {PLATFORMS}")
    problems += _backend_problems(document["backend"])
    problems += _contract_problems(document["contract"])
    problems += _arrays_problems(document["arrays"])
    if not isinstance(document["params"], dict):
        problems.append("params: expected an object")
    if document["test"] is not None and not _is_str(document["test"], 2000):
        problems.append("test: expected a string or null")
    seed = document["hypothesis_seed"]
    if not (seed is None or _is_str(seed, 200) or _is_int(seed, -(2**128), 2**128)):
        problems.append(f"hypothesis_seed={seed!r}: expected an int, a string or null")
    if not isinstance(document["environment"], dict):
        problems.append("environment: expected an object")
    failure = document["failure"]
    if not (
        isinstance(failure, dict)
        and set(failure) == {"type", "summary"}
        and all(isinstance(failure[key], str) for key in failure)
    ):
        problems.append("failure: expected an object with string type and summary")
    if problems:
        raise ArtifactError(path, "; ".join(problems))
