"""Argument checking shared by the contract, the support, the engine formats and the registry.

Every check raises :class:`LogprobContractError` with a message that echoes the
argument as ``name=value!r`` so a caller can find the bad field at a glance.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Iterable, Sequence
from enum import Enum
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from tp_logprob.errors import LogprobContractError

E = TypeVar("E", bound=Enum)


def check_int(name: str, value: object, *, min_value: int | None = None) -> int:
    """Return ``value`` as an int; bools, floats and strings are refused.

    numpy integers pass (through ``__index__``); ``True`` never stands for 1.
    """
    if (
        isinstance(value, bool)
        or type(value).__name__ == "bool_"
        or not hasattr(value, "__index__")
    ):
        raise LogprobContractError(f"{name}={value!r}: expected an int, got {type(value).__name__}")
    result = operator.index(value)
    if min_value is not None and result < min_value:
        raise LogprobContractError(f"{name}={result!r}: must be >= {min_value}")
    return result


def check_optional_int(name: str, value: object, *, min_value: int | None = None) -> int | None:
    """Return None, or ``value`` checked as by :func:`check_int`."""
    return None if value is None else check_int(name, value, min_value=min_value)


def check_enum(name: str, value: object, enum: type[E]) -> E:
    """Return ``value`` as a member of ``enum``; accepts the member or its string value."""
    if isinstance(value, enum):
        return value
    if isinstance(value, str):
        for member in enum:
            if member.value == value:
                return member
    choices = ", ".join(repr(member.value) for member in enum)
    raise LogprobContractError(f"{name}={value!r}: expected one of {choices}")


def check_enum_set(name: str, values: object, enum: type[E], *, non_empty: bool) -> frozenset[E]:
    """Return ``values`` as a frozenset of ``enum`` members.

    A bare string is refused even though it is iterable: ``roles="train"`` is a
    common slip for ``roles={"train"}`` and would otherwise be read letter by letter.
    """
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise LogprobContractError(
            f"{name}={values!r}: expected an iterable of {enum.__name__} values"
        )
    members = frozenset(check_enum(f"{name} item", item, enum) for item in values)
    if non_empty and not members:
        raise LogprobContractError(f"{name}={values!r}: must not be empty")
    return members


def check_int_set(name: str, values: object, *, min_value: int) -> frozenset[int] | None:
    """Return ``values`` as a non-empty frozenset of ints, or None (meaning any)."""
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise LogprobContractError(f"{name}={values!r}: expected None or an iterable of ints")
    members = frozenset(check_int(f"{name} item", item, min_value=min_value) for item in values)
    if not members:
        raise LogprobContractError(f"{name}={values!r}: must not be empty (use None for any)")
    return members


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a real bool (numpy bools included)."""
    if isinstance(value, bool):
        return value
    if type(value).__name__ == "bool_":
        return bool(value)
    raise LogprobContractError(f"{name}={value!r}: expected a bool")


def check_instance(name: str, value: object, kind: type[object]) -> None:
    """Refuse ``value`` unless it is an instance of ``kind``."""
    if not isinstance(value, kind):
        raise LogprobContractError(
            f"{name}={value!r}: expected a {kind.__name__}, got {type(value).__name__}"
        )


def check_temperature(value: object) -> float:
    """Return the sampling temperature as a float: finite, ``> 0``, and so after fp32 rounding.

    Kernels divide by ``fp32(T)``, so a value that rounds to 0 or to infinity in
    fp32 is refused as well as 0, negatives, NaN, infinities and bools.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise LogprobContractError(
            f"temperature={value!r}: expected a finite float > 0, got {type(value).__name__}"
        )
    temperature = float(value)
    greedy = "; greedy decoding (T=0) has no logprob to compare" if temperature == 0 else ""
    if not (math.isfinite(temperature) and temperature > 0.0):
        raise LogprobContractError(f"temperature={value!r}: must be a finite float > 0{greedy}")
    with np.errstate(over="ignore"):
        as_fp32 = float(np.float32(temperature))
    if not 0.0 < as_fp32 < math.inf:
        raise LogprobContractError(
            f"temperature={value!r}: rounds to {as_fp32!r} in fp32; kernels divide by fp32(T), "
            "which must be finite and > 0"
        )
    return temperature


def check_row_temperature(name: str, value: object) -> float:
    """One row's temperature in a per-row list: ``0.0`` marks a greedy row (as engines take
    ``temperature=0``), anything else is checked as :func:`check_temperature`."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and value == 0:
        return 0.0
    try:
        return check_temperature(value)
    except LogprobContractError as error:
        message = str(error).removeprefix(f"temperature={value!r}: ")
        raise LogprobContractError(f"{name}={value!r}: {message}") from None


def _first_non_int(values: Sequence[Any]) -> int | None:
    """The position of the first item that is not a real integer (a bool, a float, a string)."""
    for position, item in enumerate(values):
        if isinstance(item, (bool, np.bool_)) or not isinstance(item, numbers.Integral):
            return position
    return None


def check_int_array(name: str, value: object) -> npt.NDArray[np.int64]:
    """A read-only 1-D int64 copy of ``value`` (a sequence, numpy or torch integer array).

    Every item must be an integer: a float (``1.5`` or ``1.0``) or a bool is refused with
    its position, never rounded or read as 0/1.
    """
    if type(value).__module__.startswith("torch"):
        value = value.detach().cpu().numpy()  # type: ignore[attr-defined]
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise LogprobContractError(f"{name}={value!r}: expected a 1-D sequence or array of ints")
    if not isinstance(value, np.ndarray):
        position = _first_non_int(value)
        if position is not None:
            item = value[position]
            raise LogprobContractError(
                f"{name}[{position}]={item!r}: expected an int, got {type(item).__name__}"
            )
    array = np.asarray(value)
    if array.size == 0 and array.ndim == 1:
        array = array.astype(np.int64)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise LogprobContractError(
            f"{name}: expected a 1-D array of ints, got shape {array.shape} dtype {array.dtype}"
        )
    result = np.array(array, dtype=np.int64, copy=True)
    result.flags.writeable = False
    return result
