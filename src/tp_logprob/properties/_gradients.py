"""The backward check: ``d selected_logp / d logits`` against the exact oracle.

The bound follows the forward error: a backend computes
``p_hat = exp(x - lse_hat)`` from an LSE within the table's ``E_lse``, so
``|p_hat - p| <= p (expm1(E_lse) + u (|x - lse| + 8))`` (argument rounding and a few
ulps of exp), ``1 - p_hat`` adds one rounding at the target column, and the final
cast to the logits dtype adds at most one ulp of that dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.oracle.exact import exact_logprob_grad
from tp_logprob.oracle.ulp import ulp_distance, ulp_exponent
from tp_logprob.properties._harness import allowed_error, exact_outputs, execute, row_summary
from tp_logprob.properties._report import SuiteStats, format_value, violation
from tp_logprob.strategies import DTYPE_SMALLEST_SUBNORMAL, LogprobCase

__all__ = ["check_gradient", "gradient_bound", "upstream_weights"]

Floats = npt.NDArray[np.float64]
_U32 = 2.0**-24
_UPSTREAM = np.array([1.0, -2.0, 0.5, 0.0, -0.25, 4.0])


def upstream_weights(rows: int) -> Floats:
    """Per-row upstream gradients: signed powers of two and 0, so scaling is exact.

    A backward that ignores the incoming gradient passes a check that always
    backprops ``sum(selected_logp)``; these weights catch it.
    """
    return _UPSTREAM[np.arange(rows) % _UPSTREAM.size]


def gradient_bound(case: LogprobCase, exact: Floats) -> Floats:
    """Per-element bound on ``|grad_backend - grad_exact|``; 0 where the gradient must be 0."""
    contract = case.contract
    real = contract.sharding.real_vocab_size
    selected, lse = exact_outputs(case)
    _, lse_error = allowed_error(case, selected, lse)
    x = case.logits.astype(np.float64)
    columns = np.arange(x.shape[1])
    is_target = columns[None, :] == case.targets[:, None]
    probability = np.where(is_target, 1.0 - exact, -exact)
    with np.errstate(invalid="ignore", over="ignore"):
        distance = np.where(np.isfinite(x), np.abs(x - lse[:, None]), 0.0)
        relative = np.expm1(lse_error)[:, None] + _U32 * (distance + 8.0)
        # p == 0 stays 0 (p_hat underflows too) even where the LSE bound is huge.
        spread = np.where(probability == 0.0, 0.0, np.abs(probability) * relative * 1.01)
        bound = spread + np.where(is_target, _U32, 0.0)
    finite = np.where(np.isfinite(exact), exact, 0.0)
    cast = np.ldexp(1.0, ulp_exponent(np.abs(finite) + bound, contract.dtype.value))
    bound = bound + cast + DTYPE_SMALLEST_SUBNORMAL[contract.dtype]
    live_active = case.active[:, None] & (columns[None, :] < real)
    return np.where(live_active, bound, 0.0)


def check_gradient(
    prop: str, case: LogprobCase, backend: Any, stats: SuiteStats | None = None
) -> None:
    """Backprop every rank's (replicated) weighted loss, as TP training does; compare.

    The loss is ``sum(w * selected_logp)`` with :func:`upstream_weights`, so the
    expected gradient is ``w[:, None] * exact``.
    """
    import torch

    logits = case.torch_logits(backend.device).requires_grad_(True)
    outputs = execute(backend, case, logits=logits)
    weights = upstream_weights(case.contract.num_tokens)
    upstream = torch.from_numpy(weights).to(device=logits.device, dtype=torch.float32)
    total = sum((upstream * result.selected_logp).sum() for result in outputs.results)
    if isinstance(total, torch.Tensor) and total.requires_grad:
        torch.autograd.backward(total)
    grad = logits.grad
    dtype = str(getattr(grad, "dtype", None))
    if grad is not None and dtype != str(logits.dtype):
        raise violation(
            f"{prop}: gradient dtype",
            case,
            backend.backend_id,
            [("problem", f"{dtype}, expected {logits.dtype}")],
        )
    observed = (
        np.zeros(case.logits.shape)
        if grad is None
        else grad.detach().float().cpu().numpy().astype(np.float64)
    )
    contract = case.contract
    exact = exact_logprob_grad(
        case.logits,
        case.targets,
        active_mask=case.active,
        real_vocab_size=contract.sharding.real_vocab_size,
    )
    unit_bound = gradient_bound(case, exact)
    exact = weights[:, None] * exact
    # Power-of-two weights scale the error exactly, except on the subnormal grid.
    slack = np.where(unit_bound > 0, DTYPE_SMALLEST_SUBNORMAL[contract.dtype], 0.0)
    scale = np.abs(weights)[:, None]
    bound = scale * np.where(scale == 0.0, 0.0, unit_bound) + slack  # 0 * inf is NaN
    error = np.abs(observed - exact)
    ulps = np.asarray(ulp_distance(exact, observed, contract.dtype.value), dtype=np.float64)
    bad = ~(error <= bound)
    if stats is not None:
        with np.errstate(invalid="ignore", divide="ignore"):
            used = np.where(bound > 0, error / bound, 0.0)
        stats.error(backend.backend_id, prop, 0.0, float(np.max(used[~bad], initial=0.0)))
    if bad.any():
        row, column = np.unravel_index(
            int(np.argmax(np.where(bad, error - bound, -np.inf))), bad.shape
        )
        where = _describe_position(case, int(row), int(column))
        raise violation(
            f"{prop}: gradient outside its bound",
            case,
            backend.backend_id,
            [
                ("worst", f"row {row}, column {column} ({where}); {int(bad.sum())} elements out"),
                ("observed", format_value(observed[row, column])),
                ("exact", format_value(exact[row, column])),
                (
                    "error",
                    f"{ulps[row, column]:.4g} ulp of {contract.dtype.value}; bound "
                    f"{bound[row, column]:.4g} absolute",
                ),
                ("row", row_summary(case, int(row))),
            ],
        )
    sums = observed.sum(axis=1)
    over = np.abs(sums) > bound.sum(axis=1)
    if over.any():
        first = int(np.flatnonzero(over)[0])
        raise violation(
            f"{prop}: an active row's gradient does not sum to 0",
            case,
            backend.backend_id,
            [
                ("worst", f"row {first}; rows {np.flatnonzero(over).tolist()}"),
                ("observed", f"sum {sums[first]!r}"),
                ("exact", "0.0"),
                ("error", f"bound {bound.sum(axis=1)[first]:.4g} (sum of the element bounds)"),
            ],
        )


def _describe_position(case: LogprobCase, row: int, column: int) -> str:
    real = case.contract.sharding.real_vocab_size
    if not case.active[row]:
        return "inactive row: must be 0"
    if column >= real:
        return "padding column: must be 0"
    if column == int(case.targets[row]):
        return "target column"
    return "live column"
