"""Fused LM-head cases in artifacts: the operands stored, and the checks that rebuild the case.

A :class:`~tp_logprob.strategies.HiddenCase` is stored as the logits case
(``logits``, ``targets``, ``mask``) plus its operands ``hidden [N, H]``,
``weight [padded_vocab_size, H]`` and, when the contract has one,
``bias [padded_vocab_size]`` (float32, values of the contract dtype). The
logits are kept, so every tool that reads a logits case reads this one, and on
load they must equal ``fp32(exact hidden @ weight.T + bias)`` recomputed with
:func:`~tp_logprob.oracle.exact_hidden_logits`: the stored logits are a
checksum of the operands that no float tolerance can blur.

Non-finite operands are allowed only where :func:`~tp_logprob.strategies.hidden_cases`
puts them: NaN in inactive hidden rows; NaN or +-inf in the weight's and bias's
padding rows (``>= real_vocab_size``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.contract import LogprobContract, LogprobInputKind
from tp_logprob.errors import LogprobContractError
from tp_logprob.oracle import exact_hidden_logits
from tp_logprob.replay.schema import ArtifactError
from tp_logprob.strategies import HiddenCase, LogprobCase, round_to_dtype

__all__ = [
    "FUSED_ARRAYS",
    "MAX_EXACT_LOGITS",
    "describe_operands",
    "load_fused_case",
    "operand_arrays",
    "operand_names",
]

FUSED_ARRAYS = ("hidden", "weight", "bias")
MAX_EXACT_LOGITS = 1 << 18
"""At most this many logits are recomputed exactly on load (about 10 us each)."""

FIRST_HIDDEN_SCHEMA = 2
"""The artifact schema version that first stored the fused operands."""

Array = npt.NDArray[Any]


def operand_names(contract: LogprobContract) -> tuple[str, ...]:
    """The operand arrays an artifact of ``contract`` holds: none for logits input."""
    if contract.input_kind is not LogprobInputKind.HIDDEN:
        return ()
    return FUSED_ARRAYS if contract.has_bias else FUSED_ARRAYS[:2]


def operand_arrays(case: LogprobCase) -> dict[str, Array]:
    """``hidden``, ``weight`` and ``bias`` of a fused case (float32); ``{}`` for a logits case."""
    if case.contract.input_kind is not LogprobInputKind.HIDDEN:
        return {}
    if not isinstance(case, HiddenCase):
        raise ValueError(
            f"case={case!r}: input_kind='hidden' but not a HiddenCase; without hidden, weight "
            "and bias it cannot be replayed"
        )
    found = {"hidden": case.hidden, "weight": case.weight, "bias": case.bias}
    return {
        name: np.ascontiguousarray(found[name], dtype=np.float32)
        for name in operand_names(case.contract)
    }


def describe_operands(case: LogprobCase) -> str | None:
    """One line on a fused case's operands and how its logits were made; None for logits input."""
    if not isinstance(case, HiddenCase):
        return None
    shapes = ", ".join(
        f"{name} {list(array.shape)}" for name, array in operand_arrays(case).items()
    )
    return (
        f"{shapes} ({case.contract.dtype.value} values); "
        f"logits = fp32(exact hidden @ weight.T{' + bias' if case.bias is not None else ''})"
    )


def load_fused_case(
    path: Path,
    schema_version: int,
    contract: LogprobContract,
    arrays: Mapping[str, Array],
) -> HiddenCase:
    """The fused case of a loaded artifact, or :class:`ArtifactError` naming the bad field."""
    if schema_version < FIRST_HIDDEN_SCHEMA:
        raise ArtifactError(
            path,
            f"contract: input_kind='hidden' in a schema_version={schema_version} artifact; "
            f"the fused operands are stored from version {FIRST_HIDDEN_SCHEMA} on",
        )
    _check_names_and_shapes(path, contract, arrays)
    operands = {name: arrays[name] for name in operand_names(contract)}
    for name, array in operands.items():
        rounded = round_to_dtype(array, contract.dtype)
        differ = ~((rounded == array) | (np.isnan(rounded) & np.isnan(array)))
        if differ.any():
            where = tuple(int(i) for i in np.argwhere(differ)[0])
            raise ArtifactError(
                path,
                f"{name}: values not representable in {contract.dtype.value} "
                f"({name}{list(where)}={float(array[where])!r})",
            )
    _check_non_finite(path, contract, operands)
    rows, padded = contract.num_tokens, contract.sharding.padded_vocab_size
    if rows * padded > MAX_EXACT_LOGITS:
        raise ArtifactError(
            path,
            f"logits: {rows} x {padded} exact dot products to recompute; "
            f"at most {MAX_EXACT_LOGITS}",
        )
    with np.errstate(over="ignore", invalid="ignore"):
        exact = exact_hidden_logits(
            operands["hidden"], operands["weight"], operands.get("bias")
        ).astype(np.float32)
    _check_logits(path, arrays["logits"], exact)
    try:
        return HiddenCase(
            contract,
            arrays["logits"],
            arrays["targets"],
            hidden=operands["hidden"],
            weight=operands["weight"],
            bias=operands.get("bias"),
        )
    except LogprobContractError as error:
        raise ArtifactError(path, f"case: {error}") from None


def _check_names_and_shapes(
    path: Path, contract: LogprobContract, arrays: Mapping[str, Array]
) -> None:
    size = contract.hidden_size
    padded = contract.sharding.padded_vocab_size
    shapes = {
        "hidden": (contract.num_tokens, size),
        "weight": (padded, size),
        "bias": (padded,),
    }
    for name in FUSED_ARRAYS:
        wanted = name in operand_names(contract)
        if name not in arrays:
            if wanted:
                raise ArtifactError(
                    path, f"{name}: missing; a fused LM-head case (input_kind='hidden') needs it"
                )
            continue
        if not wanted:
            raise ArtifactError(path, f"{name}: stored, but the contract has has_bias=False")
        array = arrays[name]
        if array.dtype != np.float32 or array.shape != shapes[name]:
            raise ArtifactError(
                path,
                f"{name}: {array.dtype} {list(array.shape)}, the contract needs float32 "
                f"{list(shapes[name])}",
            )


def _check_non_finite(path: Path, contract: LogprobContract, operands: Mapping[str, Array]) -> None:
    """Non-finite values only where the strategy draws them (see the module docstring)."""
    active = contract.mask.dense()
    hidden = operands["hidden"]
    bad = ~np.isfinite(hidden) & (active[:, None] | ~np.isnan(hidden))
    if bad.any():
        where = [int(i) for i in np.argwhere(bad)[0]]
        raise ArtifactError(
            path,
            f"hidden{where}={float(hidden[tuple(where)])!r}: only inactive rows may hold a "
            "non-finite value, and only NaN",
        )
    real = contract.sharding.real_vocab_size
    for name in ("weight", "bias"):
        if name not in operands:
            continue
        live = operands[name][:real]
        if not np.isfinite(live).all():
            where = [int(i) for i in np.argwhere(~np.isfinite(live))[0]]
            raise ArtifactError(
                path,
                f"{name}{where}={float(live[tuple(where)])!r}: live rows (< real_vocab_size="
                f"{real}) must be finite; only padding rows may hold NaN or inf",
            )


def _check_logits(path: Path, stored: Array, exact: Array) -> None:
    differ = ~((stored == exact) | (np.isnan(stored) & np.isnan(exact)))
    if differ.any():
        where = tuple(int(i) for i in np.argwhere(differ)[0])
        raise ArtifactError(
            path,
            f"logits: {int(differ.sum())} of {differ.size} differ from fp32(exact hidden @ "
            f"weight.T + bias) recomputed from the stored operands (first logits{list(where)}: "
            f"stored {float(stored[where])!r}, recomputed {float(exact[where])!r}); hidden, "
            "weight, bias or logits was changed after the case was drawn",
        )
