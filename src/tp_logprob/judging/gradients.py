"""The backward check: ``d (w selected_logp + v entropy) / d logits`` against the exact oracle.

The bound follows the forward error, in ``z = x / T``: a backend computes
``p_hat = exp(z - lse_hat)`` from an LSE within the table's ``E_lse``, so
``|p_hat - p| <= p (expm1(E_lse) + u (|z - lse| + 8))`` (argument rounding and a few
ulps of exp), ``1 - p_hat`` adds one rounding at the target column. The entropy
term ``-p (z - lse + H)`` adds ``p`` times the error of ``c = z - lse + H``
(``E_lse + E_H`` and two roundings) plus ``|c|`` times the error of ``p``. The
division by ``T`` adds one rounding, and the final cast to the logits dtype at
most one ulp of that dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tp_logprob.contract import LogprobContract
from tp_logprob.judging.expected import exact_entropy_of, exact_outputs
from tp_logprob.judging.measuring import (
    ErrorTally,
    allowed_error,
    entropy_error,
    row_summary,
)
from tp_logprob.judging.outputs import Floats, Outputs
from tp_logprob.judging.violation import format_value, row_list, violation
from tp_logprob.oracle import apply_temperature, exact_entropy_grad
from tp_logprob.oracle.exact import exact_logprob_grad
from tp_logprob.oracle.formats import U32
from tp_logprob.oracle.ulp import ulp_distance, ulp_exponent
from tp_logprob.strategies import DTYPE_MAX, DTYPE_SMALLEST_SUBNORMAL, LogprobCase

__all__ = [
    "Backward",
    "entropy_weights",
    "gradient_bound",
    "judge_exact_gradient",
    "judge_gradient",
    "upstream_weights",
]

_SUBNORMAL_EXP_ERROR = 4.0 * 2.0**-149  # exp within a few ulps where its result is subnormal
_UPSTREAM = np.array([1.0, -2.0, 0.5, 0.0, -0.25, 4.0])
_UPSTREAM_ENTROPY = np.array([-0.5, 0.0, 2.0, 1.0, 0.25, -4.0, -1.0])


def upstream_weights(rows: int) -> Floats:
    """Per-row upstream gradients: signed powers of two and 0, so scaling is exact.

    A backward that ignores the incoming gradient passes a check that always
    backprops ``sum(selected_logp)``; these weights catch it.
    """
    return _UPSTREAM[np.arange(rows) % _UPSTREAM.size]


def entropy_weights(rows: int) -> Floats:
    """Per-row upstream gradients of entropy, a pattern other than :func:`upstream_weights`'."""
    return _UPSTREAM_ENTROPY[np.arange(rows) % _UPSTREAM_ENTROPY.size]


def gradient_bound(
    case: LogprobCase,
    exact: Floats,
    entropy_grad: Floats | None = None,
    weights: tuple[Floats, Floats] | None = None,
) -> Floats:
    """Per-element bound on ``|grad_backend - grad_exact|``; 0 where the gradient must be 0.

    ``exact`` is ``d selected / d x``; ``entropy_grad`` (``d entropy / d x``) adds the
    entropy term. ``weights = (w, v)`` are the per-row upstream gradients of the two
    (default: 1 for selected, 0 for entropy).
    """
    contract = case.contract
    real = contract.sharding.real_vocab_size
    temperature = contract.temperature_fp32
    w, v = weights if weights is not None else (np.ones(len(exact)), np.zeros(len(exact)))
    w, v = np.abs(w)[:, None], np.abs(v)[:, None]
    selected, lse = exact_outputs(case)
    _, lse_error = allowed_error(case, selected, lse)
    z = apply_temperature(case.logits, temperature)
    columns = np.arange(z.shape[1])
    is_target = columns[None, :] == case.targets[:, None]
    # d selected / dz = [v == target] - p; exact is that divided by T.
    probability = np.where(is_target, 1.0 - exact * temperature, -exact * temperature)
    with np.errstate(invalid="ignore", over="ignore"):
        distance = np.where(np.isfinite(z), np.abs(z - lse[:, None]), 0.0)
        relative = np.expm1(lse_error)[:, None] + U32 * (distance + 8.0)
        # p == 0 stays 0 (p_hat underflows too) even where the LSE bound is huge. An fp32
        # p_hat below the normal range errs by a few subnormal ulps, absolutely (0 for a p
        # under 2^-150): the relative bound misses it, and dividing by a small T scales it up
        # (at T = 1e-20, a p of 1e-53 is 0 in fp32 and its gradient 1e-33 is 0 too).
        spread = np.where(
            probability == 0.0,
            0.0,
            np.abs(probability) * relative * 1.01 + _SUBNORMAL_EXP_ERROR,
        )
        # A zero weight zeroes its term even where the term's bound is inf (0 * inf is NaN).
        bound = np.where(w == 0.0, 0.0, w * (spread + np.where(is_target, U32, 0.0)))
        if entropy_grad is not None:
            entropy_term = _entropy_term_bound(case, lse, lse_error, distance, relative)
            bound = bound + np.where(v == 0.0, 0.0, v * entropy_term)
        if temperature != 1.0:
            size = _weighted_size(w, exact, v, entropy_grad)
            bound = bound / temperature * (1.0 + 2.0 * U32) + U32 * np.nan_to_num(size)
        size = _weighted_size(w, exact, v, entropy_grad)
    finite = np.where(np.isfinite(size), size, 0.0)
    cast = np.ldexp(1.0, ulp_exponent(np.abs(finite) + bound, contract.dtype.value))
    bound = bound + cast + DTYPE_SMALLEST_SUBNORMAL[contract.dtype]
    live_active = case.active[:, None] & (columns[None, :] < real)
    return np.where(live_active, bound, 0.0)


def _weighted_size(w: Floats, exact: Floats, v: Floats, entropy_grad: Floats | None) -> Floats:
    """``|w| |exact| + |v| |entropy_grad|``, with a zero weight contributing 0 even beside NaN."""
    size = np.where(w == 0.0, 0.0, w * np.abs(exact))
    if entropy_grad is not None:
        size = size + np.where(v == 0.0, 0.0, v * np.abs(entropy_grad))
    return np.asarray(size, dtype=np.float64)


def _entropy_term_bound(
    case: LogprobCase, lse: Floats, lse_error: Floats, distance: Floats, relative: Floats
) -> Floats:
    """Bound on the error of ``p (z - lse + H)`` in z space (see the module docstring)."""
    entropy = exact_entropy_of(case)
    entropy_error_bound = entropy_error(case, entropy, lse)
    z = apply_temperature(case.logits, case.contract.temperature_fp32)
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.where(np.isfinite(z), np.exp(z - lse[:, None]), 0.0)
        centred = np.abs(np.where(np.isfinite(z), z - lse[:, None], 0.0) + entropy[:, None])
        spread_c = (lse_error + entropy_error_bound)[:, None] + U32 * (
            distance + centred + np.abs(entropy)[:, None]
        )
        term = p * ((1.0 + relative) * spread_c + relative * centred + 2.0 * U32 * centred)
        # A subnormal p_hat carries an absolute error of a few fp32 subnormal ulps, which
        # |c| amplifies: the relative bound above does not cover it.
        term = term + _SUBNORMAL_EXP_ERROR * centred
    # Unknown (NaN) where relative is inf and |c| is 0: no bound, as for the selected term.
    return np.where(p == 0.0, 0.0, np.nan_to_num(term * 1.01, nan=np.inf))


@dataclass(frozen=True)
class Backward:
    """One forward and backward of ``sum(w selected_logp + v entropy)`` over every rank."""

    outputs: Outputs
    gradient: Floats  # d loss / d logits, float64 copy ([N, padded])
    weights: Floats  # w, per row
    entropy_weights: Floats  # v, per row (0 without export_entropy)


def judge_exact_gradient(
    prop: str,
    case: LogprobCase,
    backend_id: str,
    run: Backward,
    stats: ErrorTally | None = None,
) -> None:
    """:func:`judge_gradient` of ``run`` against the exact oracle's gradient of
    ``sum(w selected_logp + v entropy)``, within :func:`gradient_bound`."""
    contract = case.contract
    real = contract.sharding.real_vocab_size
    exact = exact_logprob_grad(
        case.logits,
        case.targets,
        active_mask=case.active,
        real_vocab_size=real,
        temperature=contract.batch_temperature,
    )
    entropy_grad = None
    if contract.export_entropy:
        entropy_grad = exact_entropy_grad(
            case.logits,
            active_mask=case.active,
            real_vocab_size=real,
            temperature=contract.batch_temperature,
        )
    bound = gradient_bound(case, exact, entropy_grad, (run.weights, run.entropy_weights))
    judge_gradient(prop, case, backend_id, run, exact, entropy_grad, bound, stats)


def judge_gradient(
    prop: str,
    case: LogprobCase,
    backend_id: str,
    run: Backward,
    exact: Floats,
    entropy_grad: Floats | None,
    bound: Floats,
    stats: ErrorTally | None = None,
    *,
    notes: Callable[[int], list[tuple[str, str]]] | None = None,
) -> None:
    """Raise unless ``run``'s gradient is within ``bound`` (:func:`gradient_bound`) of
    ``w exact + v entropy_grad`` element by element, and each row's sum within the sum of
    its bounds of the exact row's sum (0 for the raw op). ``notes(row)`` adds lines to the
    report of a row."""
    contract = case.contract
    weights, entropy_w, observed = run.weights, run.entropy_weights, run.gradient
    with np.errstate(invalid="ignore"):
        exact = weights[:, None] * exact
        if entropy_grad is not None:
            exact = exact + entropy_w[:, None] * entropy_grad
    # Power-of-two weights scale the error exactly, except on the subnormal grid.
    bound = bound + np.where(bound > 0, DTYPE_SMALLEST_SUBNORMAL[contract.dtype], 0.0)
    error = np.abs(observed - exact)
    ulps = np.asarray(ulp_distance(exact, observed, contract.dtype.value), dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        # Large T^-1 can push a gradient past the logits dtype's range: an infinity is
        # then within bound when the bound reaches past the dtype's maximum on its side.
        reach = np.where(observed > 0, exact + bound, -(exact - bound))
        overflow = np.isinf(observed) & (reach >= DTYPE_MAX[contract.dtype])
    bad = ~(error <= bound) & ~(np.isnan(exact) & np.isnan(observed)) & ~overflow
    if stats is not None:
        with np.errstate(invalid="ignore", divide="ignore"):
            used = np.where(bound > 0, error / bound, 0.0)
        stats.error(backend_id, prop, 0.0, float(np.max(used[~bad], initial=0.0)))
    extra = (lambda row: []) if notes is None else notes
    if bad.any():
        with np.errstate(invalid="ignore"):
            excess = np.nan_to_num(np.where(bad, error - bound, -np.inf), nan=np.inf)
        row, column = np.unravel_index(int(np.argmax(excess)), bad.shape)
        where = _describe_position(case, int(row), int(column))
        raise violation(
            f"{prop}: gradient outside its bound",
            case,
            backend_id,
            [
                ("worst", f"row {row}, column {column} ({where}); {int(bad.sum())} elements out"),
                ("observed", format_value(observed[row, column])),
                ("exact", format_value(exact[row, column])),
                (
                    "error",
                    f"{ulps[row, column]:.4g} ulp of {contract.dtype.value}; bound "
                    f"{bound[row, column]:.4g} absolute "
                    f"({_bound_ulps(exact[row, column], bound[row, column], contract):.4g} ulp)",
                ),
                ("row", row_summary(case, int(row))),
                *extra(int(row)),
            ],
        )
    finite_rows = np.all(np.isfinite(observed), axis=1)  # NaN and overflow: judged above
    # Sums of huge finite values (or bounds) may overflow to inf: an infinite bound
    # admits any sum, and the elements were judged one by one above.
    with np.errstate(invalid="ignore", over="ignore"):
        sums = np.where(np.asarray(finite_rows)[:, None], observed, 0.0).sum(axis=1)
        exact_sums = np.where(finite_rows & np.all(np.isfinite(exact), axis=1), exact.sum(1), 0.0)
        over = np.abs(sums - exact_sums) > bound.sum(axis=1)
    if over.any():
        first = int(np.flatnonzero(over)[0])
        raise violation(
            f"{prop}: an active row's gradient does not sum to its exact sum",
            case,
            backend_id,
            [
                ("worst", f"row {first}; rows {row_list(np.flatnonzero(over))}"),
                ("observed", f"sum {sums[first]!r}"),
                ("exact", f"sum {exact_sums[first]!r}"),
                ("error", f"bound {bound.sum(axis=1)[first]:.4g} (sum of the element bounds)"),
                *extra(first),
            ],
        )


def _bound_ulps(exact: float, bound: float, contract: LogprobContract) -> float:
    """``bound`` in ulps of the logits dtype at ``exact``, as the error is measured."""
    return float(bound / np.ldexp(1.0, ulp_exponent(exact, contract.dtype.value)))


def _describe_position(case: LogprobCase, row: int, column: int) -> str:
    real = case.contract.sharding.real_vocab_size
    if not case.active[row]:
        return "inactive row: must be 0"
    if column >= real:
        return "padding column: must be 0"
    if column == int(case.targets[row]):
        return "target column"
    return "live column"
