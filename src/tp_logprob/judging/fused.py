"""What the suite knows of a fused LM-head case (``input_kind="hidden"``): the logits-path
view of it, and the exact gradients of ``hidden``, ``weight`` and ``bias`` with their bounds.

The oracle, special-value, determinism and TP-consistency properties take fused
cases as they are (their bounds add :func:`~tp_logprob.judging.measuring.input_error`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.contract import (
    DeterminismScope,
    LogprobContract,
    LogprobDType,
    LogprobInputKind,
    ReductionSpec,
)
from tp_logprob.judging.expected import exact_entropy_of, exact_outputs
from tp_logprob.judging.gradients import entropy_weights, gradient_bound, upstream_weights
from tp_logprob.judging.measuring import ErrorTally, input_error
from tp_logprob.judging.outputs import Floats
from tp_logprob.judging.processed import group_case
from tp_logprob.judging.violation import PropertyInputError, format_value, violation
from tp_logprob.oracle import (
    apply_temperature,
    exact_entropy_grad,
    exact_processed_entropy_grad,
    exact_processed_logprob_grad,
    support_masked_logits,
)
from tp_logprob.oracle.exact import exact_logprob_grad
from tp_logprob.oracle.formats import U32, unit_roundoff
from tp_logprob.row_groups import row_groups
from tp_logprob.strategies import DTYPE_SMALLEST_SUBNORMAL, HiddenCase, LogprobCase

__all__ = ["Bools", "fused_only", "judge_fused_gradients", "logits_contract"]

Bools = npt.NDArray[np.bool_]


def fused_only(case: LogprobCase) -> HiddenCase:
    """``case`` as a :class:`HiddenCase`; a bad artifact otherwise."""
    if not isinstance(case, HiddenCase):
        raise PropertyInputError("this check takes a fused LM-head case (input_kind='hidden')")
    return case


def logits_contract(contract: LogprobContract) -> LogprobContract:
    """The logits-path contract of a fused one: fp32 logits as input, ``fixed_topology``
    (what torch_native serves), everything else the same."""
    return dataclasses.replace(
        contract,
        reduction=ReductionSpec(DeterminismScope.FIXED_TOPOLOGY),
        input_kind=LogprobInputKind.LOGITS,
        hidden_size=None,
        has_bias=False,
        allow_tf32=False,
        dtype=LogprobDType.FP32,
    )


def judge_fused_gradients(
    case: HiddenCase,
    backend_id: str,
    observed: Sequence[Floats],
    stats: ErrorTally | None = None,
    *,
    support: tuple[Bools, Bools] | None = None,
) -> None:
    """``observed`` ``d hidden``, ``d weight`` and (with a bias) ``d bias`` of
    ``sum(w selected_logp + v entropy)`` (:func:`~tp_logprob.judging.gradients.upstream_weights`,
    :func:`~tp_logprob.judging.gradients.entropy_weights`) within their bounds of the exact
    values; exactly 0 on inactive rows and padding rows.

    For a processed op ``support`` is the ``(mask, defined)`` of the support the run used:
    ``G`` is then the exact gradient on it, 0 outside it.
    """
    rows = case.contract.num_tokens
    w = upstream_weights(rows)
    v = entropy_weights(rows) * case.contract.export_entropy
    expected = _expected_grads(case, w, v, support)[: len(observed)]  # no bias: no d bias
    for name, got, (want, bound) in zip(
        ("hidden", "weight", "bias"), observed, expected, strict=False
    ):
        _compare(case, backend_id, name, got, want, bound, stats)


def _expected_grads(
    case: HiddenCase, w: Floats, v: Floats, support: tuple[Bools, Bools] | None = None
) -> list[tuple[Floats, Floats]]:
    """Exact ``(d hidden, d weight, d bias)`` and per-element bounds (module docstring); on
    the support ``(mask, defined)`` when given."""
    contract = case.contract
    real, padded = contract.sharding.real_vocab_size, contract.sharding.padded_vocab_size
    active = case.active
    if contract.heterogeneous:
        g, g_bound = _grouped_logit_grads(case, w, v, support)
    else:
        g, g_bound = _logit_grads(case, w, v, support)
    h = np.where(active[:, None], np.nan_to_num(case.hidden.astype(np.float64)), 0.0)
    wt = case.weight[:real].astype(np.float64)
    size = np.abs(g) + g_bound
    u = unit_roundoff(contract.dtype.value)
    world = contract.sharding.tp_world_size
    tiny = DTYPE_SMALLEST_SUBNORMAL[contract.dtype]
    # A heterogeneous batch runs one call per group of rows: each gives its part of
    # d weight and d bias in the output dtype, and autograd adds the parts in that dtype,
    # one more rounding per group (docs/semantics.md, "Heterogeneous batches").
    parts = len(row_groups(contract)) if contract.heterogeneous else 1
    shared = _gamma(contract.num_tokens) + parts * u
    with np.errstate(invalid="ignore", over="ignore"):
        d_hidden = g @ wt
        hidden_scale = _bound_product(size, np.abs(wt))
        hidden_bound = (
            _bound_product(g_bound, np.abs(wt))
            + (_gamma(real) + (world + 1) * u) * hidden_scale
            + world * tiny
        )
        d_weight = np.zeros((padded, wt.shape[1]))
        d_weight[:real] = g.T @ h
        weight_scale = np.zeros_like(d_weight)
        weight_scale[:real] = _bound_product(size.T, np.abs(h))
        weight_bound = np.zeros_like(d_weight)
        weight_bound[:real] = _bound_product(g_bound.T, np.abs(h))
        weight_bound += shared * weight_scale
        weight_bound[:real] += parts * tiny
        d_bias = np.zeros(padded)
        d_bias[:real] = g.sum(axis=0)
        bias_bound = np.zeros(padded)
        bias_bound[:real] = g_bound.sum(axis=0) + shared * size.sum(axis=0) + parts * tiny
    hidden_bound = np.where(active[:, None], hidden_bound, 0.0)
    return [(d_hidden, hidden_bound), (d_weight, weight_bound), (d_bias, bias_bound)]


def _logit_grads(
    case: HiddenCase, w: Floats, v: Floats, support: tuple[Bools, Bools] | None
) -> tuple[Floats, Floats]:
    """``G = d (w selected_logp + v entropy) / d x`` of the live columns and its bound, for
    a case with one temperature; 0 on inactive rows."""
    contract = case.contract
    real = contract.sharding.real_vocab_size
    padded = contract.sharding.padded_vocab_size
    active = case.active
    x32 = case.logits[:, :real].astype(np.float64)
    plain_contract = dataclasses.replace(logits_contract(contract), support=None)
    g_ent = None
    if support is None:
        plain = LogprobCase(plain_contract, case.logits, case.targets)
        g_sel = exact_logprob_grad(
            x32, case.targets, active_mask=active, temperature=contract.batch_temperature
        )
        if contract.export_entropy:
            g_ent = exact_entropy_grad(
                x32, active_mask=active, temperature=contract.batch_temperature
            )
    else:
        mask, defined = support
        plain = LogprobCase(
            plain_contract,
            support_masked_logits(case.logits, mask, real_vocab_size=real),
            case.targets,
        )
        common: dict[str, Any] = {
            "active_mask": active,
            "temperature": contract.batch_temperature,
            "defined": defined,
        }
        g_sel = exact_processed_logprob_grad(x32, case.targets, mask[:, :real], **common)
        if contract.export_entropy:
            g_ent = exact_processed_entropy_grad(x32, mask[:, :real], **common)
    # The bound on G as if the backend's x were fp32(x) (the logits path's gradient bound) ...
    full_sel = np.zeros((contract.num_tokens, padded))
    full_sel[:, :real] = g_sel
    full_ent = None
    if g_ent is not None:
        full_ent = np.zeros_like(full_sel)
        full_ent[:, :real] = g_ent
    g_bound = gradient_bound(plain, full_sel, full_ent, (w, v))[:, :real]
    # ... plus the effect of its x being off by the dot-product error.
    g_bound = g_bound + _input_error_on_g(case, plain, w, v)
    if support is not None:  # exactly 0 outside S, where the support is defined
        g_bound = np.where(~support[0][:, :real] & support[1][:, None], 0.0, g_bound)
    g = w[:, None] * g_sel + (0.0 if g_ent is None else v[:, None] * g_ent)
    g = np.where(active[:, None], g, 0.0)
    return g, np.where(active[:, None], g_bound, 0.0)


def _grouped_logit_grads(
    case: HiddenCase, w: Floats, v: Floats, support: tuple[Bools, Bools] | None
) -> tuple[Floats, Floats]:
    """:func:`_logit_grads` of a heterogeneous batch, group by group of rows that share
    their parameters (each row's ``G`` depends on its own row alone)."""
    rows, real = case.contract.num_tokens, case.contract.sharding.real_vocab_size
    g, g_bound = np.zeros((rows, real)), np.zeros((rows, real))
    for group in row_groups(case.contract):
        picked = group.rows
        part = fused_only(group_case(case, group))
        kept = None if support is None else (support[0][picked], support[1][picked])
        g[picked], g_bound[picked] = _logit_grads(part, w[picked], v[picked], kept)
    return g, g_bound


def _bound_product(a: Floats, b: Floats) -> Floats:
    """``a @ b`` of two nonnegative bounds, where ``0 * inf`` adds 0: a term whose other
    factor is exactly 0 adds exactly 0 to the backend's finite sum, however loose the bound
    on this factor (a one-column row at T = 1e-30 has an inf bound on ``G`` and a zero
    weight beside it; numpy's product would make the bound NaN)."""
    infinite = np.isinf(a).astype(np.float64) @ (b != 0.0) + (a != 0.0) @ np.isinf(b)
    with np.errstate(invalid="ignore", over="ignore"):
        finite = np.where(np.isinf(a), 0.0, a) @ np.where(np.isinf(b), 0.0, b)
    return np.where(infinite > 0, np.inf, finite)


def _gamma(terms: int) -> float:
    """Higham's ``gamma_k`` for fp32 sums of ``terms`` products (with a little slack)."""
    k = max(terms, 1) + 1
    return 1.01 * k * U32 / (1.0 - k * U32)


def _input_error_on_g(case: HiddenCase, plain: LogprobCase, w: Floats, v: Floats) -> Floats:
    """How far ``G = d out / d x`` moves when every ``z`` moves by at most ``D`` (the row's
    dot-product room ``max_v D_v``): ``p`` by ``p expm1(2D)``, ``c = z - lse + H`` by
    ``(2 + 2 log n) D``; divided by ``T``. ``p``, ``lse`` and ``H`` are ``plain``'s (the
    logits-path view of ``case``, on a processed op's support)."""
    contract = case.contract
    real = contract.sharding.real_vocab_size
    _, shift, _ = (np.asarray(a) for a in input_error(case))  # lse room = max_v D_v
    _, lse = exact_outputs(plain)
    entropy = exact_entropy_of(plain)
    z = apply_temperature(plain.logits[:, :real], contract.temperature_fp32)
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.where(np.isfinite(z), np.exp(z - lse[:, None]), 0.0)
        drift = np.expm1(2.0 * shift)[:, None]
        centred = np.abs(np.where(np.isfinite(z), z - lse[:, None] + entropy[:, None], 0.0))
        moved = ((2.0 + 2.0 * math.log(max(real, 1))) * shift)[:, None]
        term = np.abs(w)[:, None] * p * drift + np.abs(v)[:, None] * (
            p * drift * (centred + moved) + p * moved
        )
        term = term / contract.temperature_fp32 * 1.01
    return np.asarray(np.nan_to_num(term, nan=np.inf), dtype=np.float64)


def _compare(
    case: HiddenCase,
    backend_id: str,
    name: str,
    observed: Floats,
    exact: Floats,
    bound: Floats,
    stats: ErrorTally | None,
) -> None:
    error = np.abs(observed - exact)
    with np.errstate(invalid="ignore"):
        bad = ~(error <= bound) & ~(np.isnan(exact) & np.isnan(observed))
        must_be_zero = bound == 0.0
        bad |= must_be_zero & (observed != 0.0)
    if stats is not None:
        with np.errstate(invalid="ignore", divide="ignore"):
            used = np.where(bound > 0, error / bound, 0.0)
        stats.error(
            backend_id, f"fused gradients ({name})", 0.0, float(np.max(used[~bad], initial=0.0))
        )
    if not bad.any():
        return
    with np.errstate(invalid="ignore"):
        excess = np.nan_to_num(np.where(bad, error - bound, -np.inf), nan=np.inf)
    position = np.unravel_index(int(np.argmax(excess)), bad.shape)
    where = _describe(case, name, position)
    raise violation(
        f"fused gradients: d {name} outside its bound",
        case,
        backend_id,
        [
            ("worst", f"d {name}{list(position)} ({where}); {int(bad.sum())} elements out"),
            ("observed", format_value(observed[position])),
            ("exact", format_value(exact[position])),
            ("error", f"{error[position]:.4g} absolute; bound {bound[position]:.4g}"),
        ],
    )


def _describe(case: HiddenCase, name: str, position: tuple[Any, ...]) -> str:
    real = case.contract.sharding.real_vocab_size
    if name == "hidden":
        row = int(position[0])
        return "inactive row: must be 0" if not case.active[row] else "active row"
    column = int(position[0])
    return "padding row: must be 0" if column >= real else "live row"
