"""The versions of a contract document, and the upgrade of an older one to the current.

:meth:`LogprobContract.to_dict` writes schema :data:`CONTRACT_SCHEMA_VERSION`;
:meth:`LogprobContract.from_dict` reads a document of any readable schema by upgrading
it here first, one version at a time, so the contract itself reads one schema only.
This module knows the documents, not the contract's classes: it imports nothing of the
package but its errors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tp_logprob.errors import LogprobContractError

__all__ = ["CONTRACT_SCHEMA_VERSION", "READABLE_SCHEMAS", "upgrade"]

CONTRACT_SCHEMA_VERSION = 5
"""Version 5 allows per-row values (lists) for ``temperature`` and the support's
``top_k``, ``top_p`` and ``min_p`` (a heterogeneous engine batch); version 4 added the
sampling support (``support``); version 3 the input kind (``input_kind``,
``hidden_size``, ``has_bias``, ``allow_tf32``); version 2 ``temperature``,
``export_entropy`` and the RL-Kernel mask vocabulary. Version 1 to 4 documents still
load (as logits-input contracts over the full vocabulary before 4, with one
temperature and one set of sampling parameters per batch before 5)."""

READABLE_SCHEMAS = (1, 2, 3, 4, 5)


def _from_1(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 had no temperature nor entropy, and named the mask digest ``sha256``."""
    mask = {**data["mask"], "active_mask_sha256": data["mask"]["sha256"]}
    return {**data, "mask": mask, "temperature": 1.0, "export_entropy": False}


def _from_2(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 2 had logits input only."""
    logits = {"kind": "logits", "hidden_size": None, "has_bias": False, "allow_tf32": False}
    return {**data, "input": logits}


def _from_3(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 3 had no sampling support."""
    return {**data, "support": None}


def _from_4(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 4 held one temperature and one value per sampling rule, which schema 5 reads
    unchanged (a list there is one value per row)."""
    return data


_UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {
    1: _from_1,
    2: _from_2,
    3: _from_3,
    4: _from_4,
}
"""The step from each schema to the next."""


def upgrade(data: Mapping[str, Any]) -> dict[str, Any]:
    """The document in schema :data:`CONTRACT_SCHEMA_VERSION`; the given one is not changed.

    Raises :class:`LogprobContractError` for a schema that is not readable, and
    ``KeyError`` for a section an older schema requires and the document lacks.
    """
    schema = data["schema"]
    if schema not in READABLE_SCHEMAS:
        raise LogprobContractError(f"schema={schema!r}: expected one of {list(READABLE_SCHEMAS)}")
    document = dict(data)
    for version in range(schema, CONTRACT_SCHEMA_VERSION):
        document = _UPGRADES[version](document)
    document["schema"] = CONTRACT_SCHEMA_VERSION
    return document
