"""Case-level checks only a fused LM head has: its padding rows, exact dot products, the
gradients of ``hidden``, ``weight`` and ``bias``, and the memory it allocates.

The oracle, special values, determinism and TP-consistency checks of the other
modules take fused cases as they are (their bounds add
:func:`~tp_logprob.properties._harness.input_error`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
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
from tp_logprob.oracle import apply_temperature, exact_entropy_grad
from tp_logprob.oracle.exact import exact_logprob_grad
from tp_logprob.properties._gradients import entropy_weights, gradient_bound, upstream_weights
from tp_logprob.properties._harness import (
    allowed_error,
    check_bitwise,
    check_close,
    exact_entropy_of,
    exact_outputs,
    execute,
    input_error,
)
from tp_logprob.properties._params import CheckInputError
from tp_logprob.properties._report import SuiteStats, format_value, violation
from tp_logprob.strategies import DTYPE_SMALLEST_SUBNORMAL, HiddenCase, LogprobCase, round_to_dtype

__all__ = [
    "MEMORY_ROWS",
    "check_fused_exact_products",
    "check_fused_gradients",
    "check_fused_memory",
    "check_fused_padding_rows",
    "fused_only",
    "logits_contract",
]

Floats = npt.NDArray[np.float64]
_U32 = 2.0**-24
_UNIT_ROUNDOFF = {"fp32": 2.0**-24, "bf16": 2.0**-8, "fp16": 2.0**-11}
_GARBAGE = np.array([np.nan, np.inf, -np.inf, 2.0**100, -(2.0**100), 0.0], dtype=np.float32)


def fused_only(case: LogprobCase) -> HiddenCase:
    """``case`` as a :class:`HiddenCase`; a bad artifact otherwise."""
    if not isinstance(case, HiddenCase):
        raise CheckInputError("this check takes a fused LM-head case (input_kind='hidden')")
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


def check_fused_padding_rows(
    backend: Any, case: LogprobCase, params: Mapping[str, Any], *, stats: SuiteStats | None = None
) -> None:
    """Other garbage in the weight's (and bias's) padding rows changes no output bit.

    ``params["seed"]`` picks the new garbage (NaN, +-inf, 2^100, 0) for every element.
    """
    case = fused_only(case)
    real = case.contract.sharding.real_vocab_size
    rng = np.random.default_rng(int(params["seed"]))
    weight = np.array(case.weight)
    weight[real:] = round_to_dtype(rng.choice(_GARBAGE, weight[real:].shape), case.contract.dtype)
    bias = None if case.bias is None else np.array(case.bias)
    if bias is not None:
        bias[real:] = round_to_dtype(rng.choice(_GARBAGE, bias[real:].shape), case.contract.dtype)
    other = case.replace(weight=weight, bias=bias)
    check_bitwise(
        "fused padding rows: other garbage in the weight's padding rows changed an output",
        case,
        backend.backend_id,
        execute(backend, case),
        execute(backend, other),
        labels=("drawn padding rows", "other padding rows"),
    )


def check_fused_exact_products(
    backend: Any, case: LogprobCase, params: Mapping[str, Any], *, stats: SuiteStats | None = None
) -> None:
    """Operands whose fp32 dot products are exact (small integers): the fused backend must
    be as accurate as a logits backend on ``x``, with no dot-product room, and agree with
    torch_native run on those logits within both tolerances."""
    from tp_logprob.properties._backends import BackendUnderTest
    from tp_logprob.registry import registry

    case = fused_only(case)
    dot = case.dot_bound
    exact_x = case.exact_logits
    if not np.array_equal(exact_x, exact_x.astype(np.float32), equal_nan=True) or (
        np.isfinite(dot).all() and float(np.max(np.abs(exact_x), initial=0.0)) >= 2.0**24
    ):
        raise CheckInputError("the case's dot products are not exact in fp32 (not small integers)")
    fused = execute(backend, case)
    selected, lse = exact_outputs(case)
    check_close(
        "fused exact dot products: outside the logits path's tolerance of the oracle",
        case,
        backend.backend_id,
        fused,
        selected,
        lse,
        stats=stats,
    )
    plain = LogprobCase(logits_contract(case.contract), case.logits, case.targets)
    capability = next(c for c in registry.backends("cpu") if c.backend_id == "torch_native")
    native = BackendUnderTest("torch_native", capability, registry, "cpu")
    logits_path = execute(native, plain)
    selected_room, lse_room = allowed_error(plain, selected, lse)
    check_close(
        "fused exact dot products: the fused path and the logits path (torch_native) disagree",
        case,
        backend.backend_id,
        fused,
        logits_path.selected,
        lse if logits_path.lse is None else logits_path.lse,
        expected_name="torch_native on fp32(x)",
        extra_selected=selected_room,
        extra_lse=lse_room,
        expected_entropy=logits_path.entropy,
        extra_entropy=2.0 * _entropy_room(case),
        count_ulps=False,
        inactive_zero=False,
    )


def _entropy_room(case: LogprobCase) -> Floats:
    from tp_logprob.properties._harness import entropy_error

    _, lse = exact_outputs(case)
    return entropy_error(case, exact_entropy_of(case), lse)


def check_fused_gradients(
    backend: Any, case: LogprobCase, params: Mapping[str, Any], *, stats: SuiteStats | None = None
) -> None:
    """``d hidden`` (every rank's partial, summed as the caller's all-reduce does), ``d weight``
    and ``d bias`` of ``sum(w selected_logp + v entropy)`` within their bounds of the exact
    values; exactly 0 on inactive rows and padding rows."""
    import torch

    case = fused_only(case)
    contract = case.contract
    hidden, weight, bias = case.torch_inputs(backend.device)
    leaves = [t.requires_grad_(True) for t in (hidden, weight, bias) if t is not None]
    outputs = execute(backend, case, operands=(hidden, weight, bias))
    rows = contract.num_tokens
    w = upstream_weights(rows)
    v = entropy_weights(rows) * contract.export_entropy
    to_torch = lambda a: torch.from_numpy(a).to(device=hidden.device, dtype=torch.float32)  # noqa: E731
    total = sum(
        (to_torch(w) * r.selected_logp).sum()
        + (0.0 if r.entropy is None else (to_torch(v) * r.entropy).sum())
        for r in outputs.results
    )
    if isinstance(total, torch.Tensor) and total.requires_grad:
        torch.autograd.backward(total)
    observed = [
        np.zeros(t.shape) if t.grad is None else t.grad.detach().double().cpu().numpy()
        for t in leaves
    ]
    expected = _expected_grads(case, w, v)[: len(leaves)]  # no bias: no d bias
    for name, got, (want, bound) in zip(
        ("hidden", "weight", "bias"), observed, expected, strict=False
    ):
        _compare(case, backend.backend_id, name, got, want, bound, stats)


def _expected_grads(case: HiddenCase, w: Floats, v: Floats) -> list[tuple[Floats, Floats]]:
    """Exact ``(d hidden, d weight, d bias)`` and per-element bounds (module docstring)."""
    contract = case.contract
    real, padded = contract.sharding.real_vocab_size, contract.sharding.padded_vocab_size
    active = case.active
    x32 = case.logits[:, :real].astype(np.float64)
    plain = LogprobCase(logits_contract(contract), case.logits, case.targets)
    g_sel = exact_logprob_grad(
        x32, case.targets, active_mask=active, temperature=contract.temperature
    )
    g_ent = None
    if contract.export_entropy:
        g_ent = exact_entropy_grad(x32, active_mask=active, temperature=contract.temperature)
    # The bound on G as if the backend's x were fp32(x) (the logits path's gradient bound) ...
    full_sel = np.zeros((contract.num_tokens, padded))
    full_sel[:, :real] = g_sel
    full_ent = None
    if g_ent is not None:
        full_ent = np.zeros_like(full_sel)
        full_ent[:, :real] = g_ent
    g_bound = gradient_bound(plain, full_sel, full_ent, (w, v))[:, :real]
    # ... plus the effect of its x being off by the dot-product error.
    g_bound = g_bound + _input_error_on_g(case, w, v)
    g = w[:, None] * g_sel + (0.0 if g_ent is None else v[:, None] * g_ent)
    g = np.where(active[:, None], g, 0.0)
    g_bound = np.where(active[:, None], g_bound, 0.0)
    h = np.where(active[:, None], np.nan_to_num(case.hidden.astype(np.float64)), 0.0)
    wt = case.weight[:real].astype(np.float64)
    size = np.abs(g) + g_bound
    u = _UNIT_ROUNDOFF[contract.dtype.value]
    world = contract.sharding.tp_world_size
    tiny = DTYPE_SMALLEST_SUBNORMAL[contract.dtype]
    with np.errstate(invalid="ignore", over="ignore"):
        d_hidden = g @ wt
        hidden_scale = size @ np.abs(wt)
        hidden_bound = (
            g_bound @ np.abs(wt) + (_gamma(real) + (world + 1) * u) * hidden_scale + world * tiny
        )
        d_weight = np.zeros((padded, wt.shape[1]))
        d_weight[:real] = g.T @ h
        weight_scale = np.zeros_like(d_weight)
        weight_scale[:real] = size.T @ np.abs(h)
        weight_bound = np.zeros_like(d_weight)
        weight_bound[:real] = g_bound.T @ np.abs(h)
        weight_bound += (_gamma(contract.num_tokens) + u) * weight_scale
        weight_bound[:real] += tiny
        d_bias = np.zeros(padded)
        d_bias[:real] = g.sum(axis=0)
        bias_bound = np.zeros(padded)
        bias_bound[:real] = (
            g_bound.sum(axis=0) + (_gamma(contract.num_tokens) + u) * size.sum(axis=0) + tiny
        )
    hidden_bound = np.where(active[:, None], hidden_bound, 0.0)
    return [(d_hidden, hidden_bound), (d_weight, weight_bound), (d_bias, bias_bound)]


def _gamma(terms: int) -> float:
    """Higham's ``gamma_k`` for fp32 sums of ``terms`` products (with a little slack)."""
    k = max(terms, 1) + 1
    return 1.01 * k * _U32 / (1.0 - k * _U32)


def _input_error_on_g(case: HiddenCase, w: Floats, v: Floats) -> Floats:
    """How far ``G = d out / d x`` moves when every ``z`` moves by at most ``D`` (the row's
    dot-product room ``max_v D_v``): ``p`` by ``p expm1(2D)``, ``c = z - lse + H`` by
    ``(2 + 2 log n) D``; divided by ``T``."""
    contract = case.contract
    real = contract.sharding.real_vocab_size
    _, shift, _ = (np.asarray(a) for a in input_error(case))  # lse room = max_v D_v
    _, lse = exact_outputs(case)
    entropy = exact_entropy_of(case)
    z = apply_temperature(case.logits[:, :real], contract.temperature_fp32)
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
    stats: SuiteStats | None,
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


MEMORY_ROWS = 384
_PARTIAL_WIDTH = 8
"""Rows of the memory check's batch: a backend that processes rows in chunks of fewer
rows never holds an fp32 tensor as wide as a shard with all of them."""


def check_fused_memory(
    backend: Any, case: LogprobCase, params: Mapping[str, Any], *, stats: SuiteStats | None = None
) -> None:
    """The case's rows repeated to :data:`MEMORY_ROWS` rows: no fp32 tensor that the op
    allocates (forward, and backward for train; every aten op, every rank's thread) is
    ``[MEMORY_ROWS, w]`` or taller for ``w`` a shard's live or padded width.

    Seen through :func:`~tp_logprob.properties._allocations.track_allocations`: outputs of
    aten ops, not memory inside a kernel (a BLAS workspace). Widths up to 8 (per-row
    partials hold 3-4 fp32 fields) and the hidden size (``d hidden`` is ``[N, H]`` fp32)
    are not watched; the property draws vocabularies wide enough to have other widths.
    """
    import torch

    from tp_logprob.emulate import run_tp_hidden
    from tp_logprob.properties._allocations import track_allocations
    from tp_logprob.properties._harness import sub_batch

    case = fused_only(case)
    big = fused_only(sub_batch(case, np.arange(MEMORY_ROWS) % case.contract.num_tokens))
    contract = big.contract
    sharding = contract.sharding
    widths = {end - start for start, end in sharding.vocab_shard_bounds}
    widths |= {
        end - start for start, end in map(sharding.live_bounds, range(sharding.tp_world_size))
    }
    # [N, k] fp32 for k <= 8 are per-row partials (3-4 fields); [N, H] is d hidden.
    widths = {w for w in widths if w > _PARTIAL_WIDTH and w != contract.hidden_size}
    if not widths:
        return
    op = backend.op_for(contract)
    hidden, weight, bias = big.torch_inputs(backend.device)
    train = contract.role.value == "train"
    for tensor in (hidden, weight, bias):
        if tensor is not None and train:
            tensor.requires_grad_(True)
    targets = big.torch_targets(backend.device)
    with track_allocations() as seen:
        results = run_tp_hidden(seen.wrap(op), hidden, weight, targets, contract, bias=bias)
        if train:
            total = sum(result.selected_logp.float().sum() for result in results)
            if isinstance(total, torch.Tensor) and total.requires_grad:
                total.backward()
    largest = seen.largest_2d(torch.float32, widths)
    if largest is not None and largest.shape[0] >= MEMORY_ROWS:
        raise violation(
            "fused memory: an fp32 tensor as wide as a shard holds every row (the logits)",
            big,
            backend.backend_id,
            [
                (
                    "worst",
                    f"{largest.op} allocated float32 {list(largest.shape)} "
                    f"({largest.nbytes} bytes) on thread {largest.thread}",
                ),
                (
                    "rows",
                    f"N={MEMORY_ROWS} (the case's rows repeated); shard widths {sorted(widths)}",
                ),
                (
                    "peak",
                    f"{seen.peak_live_bytes} bytes live at once ({'train' if train else 'infer'})",
                ),
            ],
        )
