"""Case-level checks of values: the oracle, the reference, other backends, gradients."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tp_logprob.oracle.reference import reference_error_bounds, reference_selected_logprob
from tp_logprob.oracle.reference_entropy import reference_entropy, reference_entropy_error_bounds
from tp_logprob.properties._checks_fused import check_fused_gradients
from tp_logprob.properties._gradients import check_gradient
from tp_logprob.properties._harness import (
    allowed_error,
    check_close,
    entropy_error,
    exact_entropy_of,
    exact_outputs,
    execute,
    input_error,
)
from tp_logprob.properties._report import SuiteStats
from tp_logprob.strategies import HiddenCase, LogprobCase


def _against_exact(
    prop: str,
    backend: Any,
    case: LogprobCase,
    stats: SuiteStats | None,
    finite_headline: str | None = None,
) -> None:
    selected, lse = exact_outputs(case)
    extra_selected, extra_lse, extra_entropy = input_error(case)
    check_close(
        prop,
        case,
        backend.backend_id,
        execute(backend, case),
        selected,
        lse,
        extra_selected=extra_selected,
        extra_lse=extra_lse,
        extra_entropy=extra_entropy,
        stats=stats,
        finite_headline=finite_headline,
    )


def check_oracle(
    backend: Any, case: LogprobCase, params: Mapping[str, Any], *, stats: SuiteStats | None = None
) -> None:
    """selected_logp and lse within the tolerance table of the correctly rounded values."""
    _against_exact("oracle agreement: output outside the tolerance table", backend, case, stats)


def check_special_values(
    backend: Any, case: LogprobCase, params: Mapping[str, Any], *, stats: SuiteStats | None = None
) -> None:
    """NaN, +inf and all -inf rows give exactly the oracle's NaN/inf pattern."""
    _against_exact(
        "special values: NaN/inf pattern differs from the oracle",
        backend,
        case,
        stats,
        finite_headline="special values: the NaN/inf pattern matches, but a finite output is "
        "outside the tolerance table",
    )


def check_entropy_nan_free(
    backend: Any, case: LogprobCase, params: Mapping[str, Any], *, stats: SuiteStats | None = None
) -> None:
    """Rows full of ``-inf`` logits and garbage padding: entropy and its gradient are finite
    (and within tolerance) wherever the exact values are finite."""
    _against_exact(
        "entropy NaN-freedom: -inf logits or padding broke entropy", backend, case, stats
    )
    if case.contract.role.value == "train":
        check_gradient("entropy NaN-freedom (gradient)", case, backend, stats)


def check_reference(
    backend: Any,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
    prop: str = "reference agreement",
) -> None:
    """Within tolerance of the float64 reference (plus its own bound)."""
    real = case.contract.sharding.real_vocab_size
    temperature = case.contract.temperature
    selected, lse = reference_selected_logprob(
        case.logits,
        case.targets,
        active_mask=case.active,
        real_vocab_size=real,
        temperature=temperature,
    )
    extra_selected, extra_lse = reference_error_bounds(selected, lse, real)
    entropy = reference_entropy(
        case.logits, active_mask=case.active, real_vocab_size=real, temperature=temperature
    )
    # Without lse and row_max the bound takes log S <= min(H, log n): sound with
    # reference (not exact) values.
    extra_entropy = reference_entropy_error_bounds(
        np.where(np.isfinite(entropy), entropy, 0.0), real
    )
    check_close(
        f"{prop}: output outside the tolerance table",
        case,
        backend.backend_id,
        execute(backend, case),
        selected,
        lse,
        expected_name="reference",
        extra_selected=extra_selected,
        extra_lse=extra_lse,
        expected_entropy=entropy,
        extra_entropy=extra_entropy,
        stats=stats,
    )


def check_wide_reference(
    backend: Any, case: LogprobCase, params: Mapping[str, Any], *, stats: SuiteStats | None = None
) -> None:
    """A wide case within tolerance of the float64 reference, entropy included."""
    check_reference(backend, case, params, stats=stats, prop="wide sweep")


def check_claimed_contract(
    backend: Any, case: LogprobCase, params: Mapping[str, Any], *, stats: SuiteStats | None = None
) -> None:
    """A claimed contract kind agrees with the exact oracle and, for train, backprops."""
    selected, lse = exact_outputs(case)
    extra_selected, extra_lse, extra_entropy = input_error(case)
    check_close(
        "capability truthfulness: a claimed contract kind is served wrongly",
        case,
        backend.backend_id,
        execute(backend, case),
        selected,
        lse,
        extra_selected=extra_selected,
        extra_lse=extra_lse,
        extra_entropy=extra_entropy,
        count_ulps=False,
    )
    if case.contract.role.value != "train":
        return
    if isinstance(case, HiddenCase):
        check_fused_gradients(backend, case, params)
    else:
        check_gradient("capability truthfulness (train)", case, backend)


def check_pinned(
    backend: Any, case: LogprobCase, params: Mapping[str, Any], *, stats: SuiteStats | None = None
) -> None:
    """The exact oracle's values (and gradient, for train) on a pinned case."""
    name = params["name"]
    _against_exact(f"pinned case: {name}", backend, case, stats)
    if case.contract.role.value == "train":
        check_gradient(f"pinned case: {name}", case, backend, stats)


def check_gradients(
    backend: Any, case: LogprobCase, params: Mapping[str, Any], *, stats: SuiteStats | None = None
) -> None:
    """Within bound of the exact gradient; exactly 0 on padding and inactive rows."""
    check_gradient("gradients", case, backend, stats)


def check_backends_agree(
    backend: Any,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
    others: Sequence[Any] | None = None,
) -> None:
    """Within both tolerances of every other backend that serves the case's contract.

    ``others`` defaults to the built-in backends of ``backend``'s platform that load.
    """
    if others is None:
        from tp_logprob.properties._backends import resolve_backends

        others = [
            other
            for other in resolve_backends([], backend.platform)
            if other.backend_id != backend.backend_id and other.load_failure() is None
        ]
    serving = [other for other in others if other.capability.supports(case.contract)]
    if not serving:
        return
    mine = execute(backend, case)
    selected, lse = exact_outputs(case)
    selected_error, lse_error = allowed_error(case, selected, lse)
    entropy_bound = (
        entropy_error(case, exact_entropy_of(case), lse) if mine.entropy is not None else 0.0
    )
    for other in serving:
        theirs = execute(other, case)
        check_close(
            f"cross-backend agreement: {backend.backend_id} and {other.backend_id} disagree",
            case,
            backend.backend_id,
            mine,
            theirs.selected,
            lse if theirs.lse is None else theirs.lse,
            expected_name=other.backend_id,
            extra_selected=selected_error,
            extra_lse=lse_error,
            expected_entropy=theirs.entropy,
            extra_entropy=entropy_bound,
            count_ulps=False,
            inactive_zero=False,
        )
