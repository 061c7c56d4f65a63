"""Sampling supports in artifacts: a replayed mask's kept ids stored, and checked on load.

A contract's support is in the artifact's JSON (``LogprobContract.to_dict``):
sampling parameters in full, a replayed mask as its row and id counts and a
sha256 digest. The kept ids themselves go into the ``.npz`` as ``kept_offsets``
(int64 ``[N + 1]``) and ``kept_ids`` (int64, global vocabulary ids), from
artifact schema version 3 on. On load they must rebuild a support whose digest
is the recorded one (:meth:`~tp_logprob.LogprobContract.from_dict` checks it,
with every rule of :class:`~tp_logprob.SupportSpec` and the contract: sorted
unique ids inside the real vocabulary, one row per token, a kept id for every
active token), so a changed id or a changed rule is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.contract import LogprobContract
from tp_logprob.replay.schema import ArtifactError
from tp_logprob.strategies import LogprobCase
from tp_logprob.support import SupportMode

__all__ = ["FIRST_KEPT_SCHEMA", "SUPPORT_ARRAYS", "kept_arrays", "support_arrays", "support_names"]

SUPPORT_ARRAYS = ("kept_offsets", "kept_ids")

FIRST_KEPT_SCHEMA = 3
"""The artifact schema version that first stored a replayed support's kept ids."""

Array = npt.NDArray[Any]


def support_names(contract: LogprobContract) -> tuple[str, ...]:
    """The support arrays an artifact of ``contract`` holds: the kept ids of a replayed mask."""
    if contract.support_mode is SupportMode.REPLAYED_MASK:
        return SUPPORT_ARRAYS
    return ()


def support_arrays(case: LogprobCase) -> dict[str, Array]:
    """``kept_offsets`` and ``kept_ids`` of a replayed support (int64); ``{}`` otherwise."""
    support = case.contract.support
    if support is None or support.mode is not SupportMode.REPLAYED_MASK:
        return {}
    return {
        "kept_offsets": np.ascontiguousarray(support.kept_offsets, dtype=np.int64),
        "kept_ids": np.ascontiguousarray(support.kept_ids, dtype=np.int64),
    }


def kept_arrays(
    path: Path, schema_version: int, data: Mapping[str, Any], arrays: Mapping[str, Array]
) -> tuple[Array, Array] | None:
    """The ``(kept_offsets, kept_ids)`` that :meth:`LogprobContract.from_dict` needs for the
    recorded contract ``data``; :class:`ArtifactError` when they are missing, stray or not
    1-D int64 arrays."""
    section = data.get("support") if isinstance(data, Mapping) else None
    replayed = isinstance(section, Mapping) and section.get("mode") == "replayed_mask"
    present = [name for name in SUPPORT_ARRAYS if name in arrays]
    if not replayed:
        if present:
            raise ArtifactError(
                path, f"{present[0]}: stored, but the contract has no replayed support"
            )
        return None
    if schema_version < FIRST_KEPT_SCHEMA:
        raise ArtifactError(
            path,
            f"contract: a replayed support in a schema_version={schema_version} artifact; its "
            f"kept ids are stored from version {FIRST_KEPT_SCHEMA} on",
        )
    missing = [name for name in SUPPORT_ARRAYS if name not in arrays]
    if missing:
        raise ArtifactError(path, f"{missing[0]}: missing, and the contract's support is replayed")
    for name in SUPPORT_ARRAYS:
        array = arrays[name]
        if array.dtype != np.int64 or array.ndim != 1:
            raise ArtifactError(
                path, f"{name}: {array.dtype} {list(array.shape)}, expected a 1-D int64 array"
            )
    return arrays["kept_offsets"], arrays["kept_ids"]
