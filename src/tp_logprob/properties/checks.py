"""Every property as a case-level check, so a failure can be replayed outside Hypothesis.

``check(backend, case, params)`` raises :class:`PropertyViolation` when the
property does not hold for ``case``; ``params`` holds what the property drew
besides the case (scalars, short lists, numpy arrays), as declared by its
:class:`PropertySpec`. The pytest properties draw ``(case, params)`` and call
:func:`run_check`, which tags a failure with a :class:`FailureRecord` so the
plugin can write the final (shrunk) example as an artifact.

>>> sorted(PROPERTY_CHECKS)[:3]
['backends_agree', 'bad_inputs', 'batch_invariance']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tp_logprob.contract import LogprobContract
from tp_logprob.properties import (
    _checks_determinism,
    _checks_fused,
    _checks_inputs,
    _checks_metamorphic,
    _checks_values,
)
from tp_logprob.properties._params import ArraySpec, CheckInputError, PropertySpec
from tp_logprob.strategies import LogprobCase

__all__ = [
    "FAILURE_ATTRIBUTE",
    "PROPERTY_CHECKS",
    "FailureRecord",
    "CheckInputError",
    "PropertyCheck",
    "failure_record",
    "run_check",
]

FAILURE_ATTRIBUTE = "tp_logprob_failure"
"""The attribute :func:`run_check` sets on an exception raised by a check."""


@dataclass(frozen=True)
class PropertyCheck:
    """A named check and the declaration of the params it takes."""

    name: str
    function: Callable[..., None]
    spec: PropertySpec = field(default_factory=PropertySpec)

    def __call__(
        self, backend: Any, case: LogprobCase, params: Mapping[str, Any], **context: Any
    ) -> None:
        self.function(backend, case, params, **context)


def _rows(contract: LogprobContract) -> tuple[int | None, ...]:
    return (contract.num_tokens,)


def _padding(contract: LogprobContract) -> tuple[int | None, ...]:
    sharding = contract.sharding
    return (contract.num_tokens, sharding.padded_vocab_size - sharding.real_vocab_size)


def _live(contract: LogprobContract) -> tuple[int | None, ...]:
    return (contract.sharding.real_vocab_size,)


def _any_length(contract: LogprobContract) -> tuple[int | None, ...]:
    return (None,)


_BAD_INPUT_PARAMS = {
    "kind": "str",
    "rank": "int",
    "width": "int",
    "dtype": "str",
    "targets_shape": "int_list",
    "row": "int",
    "target": "int",
}

_CHECKS = (
    PropertyCheck("oracle", _checks_values.check_oracle),
    PropertyCheck("special_values", _checks_values.check_special_values),
    PropertyCheck("reference", _checks_values.check_reference),
    PropertyCheck("wide_reference", _checks_values.check_wide_reference),
    PropertyCheck("claimed_contract", _checks_values.check_claimed_contract),
    PropertyCheck("pinned", _checks_values.check_pinned, PropertySpec({"name": "str"})),
    PropertyCheck("gradients", _checks_values.check_gradients),
    PropertyCheck("backends_agree", _checks_values.check_backends_agree),
    PropertyCheck(
        "padding_ignored",
        _checks_metamorphic.check_padding_ignored,
        PropertySpec(arrays={"padding": ArraySpec("float32", _padding)}),
    ),
    PropertyCheck(
        "inactive_rows",
        _checks_metamorphic.check_inactive_rows,
        PropertySpec(
            {"flipped": "int"},
            optional=frozenset({"flipped"}),
            arrays={"inactive_targets": ArraySpec("int64", _rows)},
        ),
    ),
    PropertyCheck(
        "shift_equivariance",
        _checks_metamorphic.check_shift_equivariance,
        PropertySpec({"shift": "float"}),
    ),
    PropertyCheck(
        "vocabulary_permutation",
        _checks_metamorphic.check_vocabulary_permutation,
        PropertySpec(arrays={"order": ArraySpec("int64", _live)}),
    ),
    PropertyCheck("entropy_nan_free", _checks_values.check_entropy_nan_free),
    PropertyCheck(
        "temperature_power_of_two",
        _checks_metamorphic.check_temperature_power_of_two,
        PropertySpec({"exponent": "int"}),
    ),
    PropertyCheck(
        "neg_inf_columns_ignored",
        _checks_metamorphic.check_neg_inf_columns_ignored,
        PropertySpec({"columns": "int"}),
    ),
    PropertyCheck("replicated", _checks_determinism.check_replicated),
    PropertyCheck("run_to_run", _checks_determinism.check_run_to_run),
    PropertyCheck(
        "batch_invariance",
        _checks_determinism.check_batch_invariance,
        PropertySpec(arrays={"rows": ArraySpec("int64", _any_length)}),
    ),
    PropertyCheck(
        "tp_consistency",
        _checks_determinism.check_tp_consistency,
        PropertySpec({"tp_rank": "int", "vocab_shard_bounds": "bounds"}),
    ),
    PropertyCheck("inputs_untouched", _checks_inputs.check_inputs_untouched),
    PropertyCheck(
        "fused_padding_rows",
        _checks_fused.check_fused_padding_rows,
        PropertySpec({"seed": "int"}),
    ),
    PropertyCheck("fused_exact_products", _checks_fused.check_fused_exact_products),
    PropertyCheck("fused_gradients", _checks_fused.check_fused_gradients),
    PropertyCheck("fused_memory", _checks_fused.check_fused_memory),
    PropertyCheck(
        "bad_inputs",
        _checks_inputs.check_bad_inputs,
        PropertySpec(_BAD_INPUT_PARAMS, optional=frozenset(_BAD_INPUT_PARAMS) - {"kind"}),
    ),
)

PROPERTY_CHECKS: dict[str, PropertyCheck] = {check.name: check for check in _CHECKS}
"""Every replayable property by name. Dispatch soundness draws contracts without
logits, so it has no case to store and is not replayable."""


@dataclass(frozen=True)
class FailureRecord:
    """One failing run of a check: enough to write an artifact that replays it."""

    prop: str
    backend: Any
    case: LogprobCase
    params: dict[str, Any]
    error: BaseException


def run_check(
    name: str,
    backend: Any,
    case: LogprobCase,
    params: Mapping[str, Any] | None = None,
    **context: Any,
) -> None:
    """Run check ``name``; if it raises, tag the exception with a :class:`FailureRecord`.

    Hypothesis re-raises the exceptions of its final (shrunk) runs, so the tags the
    plugin finds on a failed test's exceptions are the minimal failing examples.
    """
    drawn = {
        key: np.array(value) if isinstance(value, np.ndarray) else value
        for key, value in (params or {}).items()
    }
    try:
        PROPERTY_CHECKS[name](backend, case, drawn, **context)
    except Exception as error:
        setattr(error, FAILURE_ATTRIBUTE, FailureRecord(name, backend, case, drawn, error))
        raise


def failure_record(error: BaseException | None) -> list[FailureRecord]:
    """The records on ``error`` and on the exceptions of an exception group inside it."""
    if error is None:
        return []
    found = getattr(error, FAILURE_ATTRIBUTE, None)
    records = [found] if isinstance(found, FailureRecord) else []
    inner = getattr(error, "exceptions", None)
    if isinstance(inner, (list, tuple)):
        records += [record for item in inner for record in failure_record(item)]
    return records
