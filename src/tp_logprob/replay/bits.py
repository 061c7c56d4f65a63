"""The output bits an artifact records, and replay's bit-for-bit comparison of them.

An artifact written on one platform (a GPU box, say) stores the bits of every fp32
output its backend returned on the case (``selected_logp``, ``lse``, ``entropy``,
``support_lse``, ``support_threshold``), as the hex of each tensor's little-endian
bytes. Replaying it elsewhere reruns the case and compares bits. The comparison
binds (a difference fails the replay) only where bits are promised: the contract
asks for ``cross_platform_bitwise`` and the backend's capability claims it on both
the recording and the replaying platform (``bitwise_platforms``). Anywhere else the
difference is reported as information: two platforms' vendor ``exp`` and compilers
owe each other nothing bitwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.capability import LogprobBackendCapability
from tp_logprob.contract import DeterminismScope, LogprobContract
from tp_logprob.replay.schema import MAX_RECORDED_ELEMENTS, OUTPUT_FIELDS, bits_problems
from tp_logprob.strategies import LogprobCase
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.running import execute

__all__ = [
    "MAX_RECORDED_ELEMENTS",
    "OUTPUT_FIELDS",
    "BitsComparison",
    "bits_problems",
    "compare_bits",
    "decode_bits",
    "encode_bits",
    "observed_bits",
    "promises_bits",
]

Bits = npt.NDArray[np.uint32]


def observed_bits(backend: BackendUnderTest, case: LogprobCase) -> dict[str, Bits]:
    """Run ``case`` on ``backend`` (every emulated rank) and take rank 0's fp32 output bits."""
    result = execute(backend, case).results[0]
    found: dict[str, Bits] = {}
    for field in OUTPUT_FIELDS:
        value = getattr(result, field, None)
        if value is not None:
            array = np.ascontiguousarray(value.detach().cpu().numpy(), dtype=np.float32)
            found[field] = array.view(np.uint32)
    return found


def encode_bits(bits: Mapping[str, Bits]) -> dict[str, Any] | None:
    """The JSON form: ``{field: {"shape": [...], "hex": ...}}``; None past the size limit."""
    if sum(array.size for array in bits.values()) > MAX_RECORDED_ELEMENTS:
        return None
    return {
        field: {
            "shape": list(array.shape),
            "hex": np.ascontiguousarray(array, dtype="<u4").tobytes().hex(),
        }
        for field, array in sorted(bits.items())
    }


def decode_bits(recorded: Mapping[str, Any]) -> dict[str, Bits]:
    """The uint32 bit patterns of a checked ``output_bits`` object."""
    return {
        field: np.frombuffer(bytes.fromhex(entry["hex"]), dtype="<u4")
        .astype(np.uint32)
        .reshape(entry["shape"])
        for field, entry in recorded.items()
    }


def promises_bits(
    capability: LogprobBackendCapability,
    contract: LogprobContract,
    recorded_on: str,
    replayed_on: str,
) -> bool:
    """Whether ``capability`` owes the same bits on both platforms for ``contract``."""
    asked = contract.reduction.determinism_scope is DeterminismScope.CROSS_PLATFORM_BITWISE
    claimed = DeterminismScope.CROSS_PLATFORM_BITWISE in capability.determinism_scopes
    platforms = {recorded_on, replayed_on}
    return asked and claimed and platforms <= capability.bitwise_platforms


@dataclass(frozen=True)
class BitsComparison:
    """Recorded against replayed bits: whether they are equal, and a line saying how."""

    identical: bool
    detail: str


def compare_bits(
    recorded: Mapping[str, Bits], observed: Mapping[str, Bits], recorded_on: str
) -> BitsComparison:
    """Field by field: the number of differing elements and the first, in hex."""
    differences = []
    for field in sorted(set(recorded) | set(observed)):
        if field not in observed or field not in recorded:
            side = "recorded" if field in recorded else "replayed"
            differences.append(f"{field} only {side}")
            continue
        old, new = recorded[field], observed[field]
        if old.shape != new.shape:
            differences.append(f"{field}: shape {list(old.shape)} recorded, {list(new.shape)} now")
            continue
        differ = np.flatnonzero(old.ravel() != new.ravel())
        if differ.size:
            first = int(differ[0])
            differences.append(
                f"{field}: {differ.size} of {old.size} differ, first at [{first}]: "
                f"0x{int(old.ravel()[first]):08x} recorded, 0x{int(new.ravel()[first]):08x} now"
            )
    if not differences:
        fields = ", ".join(sorted(recorded)) or "no outputs"
        return BitsComparison(True, f"identical to those recorded on {recorded_on} ({fields})")
    return BitsComparison(
        False, f"differ from those recorded on {recorded_on}: " + "; ".join(differences)
    )
