"""Run a case on a backend and judge what came back: the steps most properties take.

Each ``expect_*`` runs ``case`` through :func:`~tp_logprob.suite.running.execute` (with
logits, or a fused head's operands, that require grad for a gradient) and hands the
outputs to the judging (:mod:`tp_logprob.judging`), which raises a
:class:`~tp_logprob.judging.violation.PropertyViolation` when they are out of bounds.
The judging runs nothing itself, so the asserts of :mod:`tp_logprob.testing` judge a
kernel's own outputs the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.judging.fused import Bools, fused_only, judge_fused_gradients
from tp_logprob.judging.gradients import (
    Backward,
    entropy_weights,
    judge_exact_gradient,
    upstream_weights,
)
from tp_logprob.judging.measuring import judge_exact, judge_reference
from tp_logprob.judging.outputs import Outputs
from tp_logprob.judging.processed import (
    backend_support,
    judge_processed,
    judge_processed_backward,
)
from tp_logprob.judging.violation import violation
from tp_logprob.strategies import HiddenCase, LogprobCase
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.running import (
    caller_rows,
    caller_view,
    execute,
    gathered_grad,
    on_real_group,
    summed_grad,
)
from tp_logprob.suite.summary import SuiteStats

__all__ = [
    "backward",
    "expect_exact",
    "expect_exact_and_gradient",
    "expect_fused_gradients",
    "expect_gradient",
    "expect_processed_exact",
    "expect_processed_gradient",
    "expect_reference",
]


def expect_exact(
    prop: str,
    backend: BackendUnderTest,
    case: LogprobCase,
    stats: SuiteStats | None = None,
    *,
    finite_headline: str | None = None,
    count_ulps: bool = True,
    outputs: Outputs | None = None,
) -> None:
    """Run ``case`` and judge it against the exact oracle, with a fused head's room, under
    the bound of the backend's declared accumulation order
    (:func:`~tp_logprob.judging.measuring.judge_exact`).

    ``outputs``: those of a run of ``case`` already made (the forward a gradient flows
    through), judged instead of running it again.
    """
    judge_exact(
        prop,
        case,
        backend.backend_id,
        execute(backend, case) if outputs is None else outputs,
        stats,
        finite_headline=finite_headline,
        count_ulps=count_ulps,
        order=backend.capability.accumulation_order,
    )


def expect_reference(
    prop: str, backend: BackendUnderTest, case: LogprobCase, stats: SuiteStats | None = None
) -> None:
    """Run ``case`` and judge it against the float64 reference plus its own bound."""
    judge_reference(prop, case, backend.backend_id, execute(backend, case), stats)


def expect_exact_and_gradient(
    prop: str,
    gradient_prop: str,
    backend: BackendUnderTest,
    case: LogprobCase,
    stats: SuiteStats | None = None,
    *,
    count_ulps: bool = True,
) -> None:
    """The outputs within tolerance of the exact oracle (``prop``) and, for a ``train``
    case, the gradient within its bound (``gradient_prop``), from one forward: a train
    case's outputs are judged on the forward the gradient flows through, as a trainer
    runs it, rather than on a second forward without grad."""
    if case.contract.role.value != "train":
        expect_exact(prop, backend, case, stats, count_ulps=count_ulps)
        return
    run = backward(gradient_prop, case, backend)
    expect_exact(prop, backend, case, stats, count_ulps=count_ulps, outputs=run.outputs)
    expect_gradient(gradient_prop, case, backend, stats, run=run)


def expect_gradient(
    prop: str,
    case: LogprobCase,
    backend: BackendUnderTest,
    stats: SuiteStats | None = None,
    *,
    run: Backward | None = None,
) -> None:
    """Backprop every rank's (replicated) weighted loss, as TP training does; compare.

    The loss is ``sum(w * selected_logp)`` with
    :func:`~tp_logprob.judging.gradients.upstream_weights`, so the expected gradient is
    ``w[:, None] * exact``. ``run``: that backward, already made.
    """
    if run is None:
        run = backward(prop, case, backend)
    judge_exact_gradient(prop, case, backend.backend_id, run, stats)


def backward(prop: str, case: LogprobCase, backend: BackendUnderTest) -> Backward:
    """Run ``case`` with logits that require grad and backprop every rank's weighted loss
    (:func:`~tp_logprob.judging.gradients.upstream_weights`,
    :func:`~tp_logprob.judging.gradients.entropy_weights`); a gradient in another dtype than
    the logits' is a violation.

    On the emulated group the logits come as a trainer holds them
    (:func:`~tp_logprob.suite.running.caller_view`: the shifted slice of a
    ``[B, T + 1, V]`` leaf, flattened, or the case's non-contiguous layout of a buffer), so
    the gradient must reach that leaf through the view, and nothing may land on what the
    view skips."""
    import torch

    contract = case.contract
    full = case.torch_logits(backend.device)
    real_group = on_real_group(contract, backend)
    if real_group:
        leaf = logits = full.requires_grad_(True)
    else:
        leaf, logits = caller_view(full, case.form.values)
    outputs = execute(backend, case, logits=logits)
    weights = upstream_weights(contract.num_tokens)
    entropy_w = entropy_weights(contract.num_tokens) * contract.export_entropy
    upstream = torch.from_numpy(weights).to(device=leaf.device, dtype=torch.float32)
    upstream_h = torch.from_numpy(entropy_w).to(device=leaf.device, dtype=torch.float32)
    total = sum(
        (upstream * result.selected_logp).sum()
        + (0.0 if result.entropy is None else (upstream_h * result.entropy).sum())
        for result in outputs.results
    )
    if isinstance(total, torch.Tensor) and total.requires_grad:
        torch.autograd.backward(total)
    own = leaf.grad  # on a real process group, this rank's shard only
    dtype = str(getattr(own, "dtype", None))
    if own is not None and dtype != str(leaf.dtype):
        raise violation(
            f"{prop}: gradient dtype",
            case,
            backend.backend_id,
            [("problem", f"{dtype}, expected {leaf.dtype}")],
        )
    if real_group:
        grad = gathered_grad(leaf, contract, backend)
    else:
        grad = None if own is None else _shifted_back(prop, case, backend.backend_id, own, logits)
    observed = (
        np.zeros(case.logits.shape)
        if grad is None
        else grad.detach().float().cpu().numpy().astype(np.float64)
    )
    return Backward(outputs, observed, weights, entropy_w)


def _shifted_back(prop: str, case: LogprobCase, backend_id: str, grad: Any, handed: Any) -> Any:
    """The ``[N, D]`` gradient of the rows ``handed`` over from a trainer leaf's; what the
    view skips (the position the shift drops, a layout's gaps) must hold 0."""
    rows = caller_rows(grad, handed)
    if rows is None:
        skipped = (
            "the trainer's leaf [:, -1] (not an input row)"
            if grad.dim() == 3
            else f"an element of the {case.form.describe()} buffer outside the view"
        )
        raise violation(
            f"{prop}: gradient on an element the view skips",
            case,
            backend_id,
            [("problem", f"{skipped} has a nonzero gradient")],
        )
    return rows


def expect_fused_gradients(
    backend: BackendUnderTest,
    case: LogprobCase,
    stats: SuiteStats | None = None,
    *,
    support_of: Callable[[Outputs], tuple[Bools, Bools]] | None = None,
) -> None:
    """Backprop ``sum(w selected_logp + v entropy)`` through a fused case and judge ``d
    hidden`` (every rank's partial, summed as the caller's all-reduce does), ``d weight``
    and ``d bias`` (:func:`~tp_logprob.judging.fused.judge_fused_gradients`).

    For a processed op ``support_of(outputs)`` gives the ``(mask, defined)`` of the support
    the run used: ``G`` is then the exact gradient on it, 0 outside it.
    """
    import torch

    case = fused_only(case)
    contract = case.contract
    hidden, weight, bias = case.torch_inputs(backend.device)
    # On the emulated group hidden comes as a trainer holds it (the shifted [B, T + 1, H]).
    real_group = on_real_group(contract, backend)
    leaf, rows_in = (hidden, hidden) if real_group else caller_view(hidden, case.form.values)
    for tensor in (leaf, weight, bias):
        if tensor is not None:
            tensor.requires_grad_(True)
    outputs = execute(backend, case, operands=(rows_in, weight, bias))
    rows = contract.num_tokens
    w = upstream_weights(rows)
    v = entropy_weights(rows) * contract.export_entropy

    def to_torch(a: npt.NDArray[np.float64]) -> torch.Tensor:
        return torch.from_numpy(a).to(device=hidden.device, dtype=torch.float32)

    total = sum(
        (to_torch(w) * r.selected_logp).sum()
        + (0.0 if r.entropy is None else (to_torch(v) * r.entropy).sum())
        for r in outputs.results
    )
    if isinstance(total, torch.Tensor) and total.requires_grad:
        torch.autograd.backward(total)
    # On a real process group each rank holds its partial d hidden and its own weight rows.
    if real_group:
        d_hidden = summed_grad(hidden, contract, backend)
    else:
        d_hidden = (
            None
            if leaf.grad is None
            else _shifted_back("fused gradients", case, backend.backend_id, leaf.grad, rows_in)
        )
    grads = [d_hidden, gathered_grad(weight, contract, backend, dim=0)]
    if bias is not None:
        grads.append(gathered_grad(bias, contract, backend, dim=0))
    shapes = [hidden.shape, weight.shape, *([] if bias is None else [bias.shape])]
    observed = [
        np.zeros(shape) if grad is None else grad.detach().double().cpu().numpy()
        for shape, grad in zip(shapes, grads, strict=True)
    ]
    support = None if support_of is None else support_of(outputs)
    judge_fused_gradients(case, backend.backend_id, observed, stats, support=support)


def expect_processed_exact(
    prop: str,
    backend: BackendUnderTest,
    case: LogprobCase,
    stats: SuiteStats | None = None,
    *,
    count_ulps: bool = True,
) -> Outputs:
    """Run ``case``; its support must be admissible and every output exact on it within the
    tolerance table. The outputs."""
    outputs = execute(backend, case)
    judge_processed(prop, case, backend.backend_id, outputs, stats, count_ulps=count_ulps)
    return outputs


def expect_processed_gradient(
    prop: str, case: LogprobCase, backend: BackendUnderTest, stats: SuiteStats | None = None
) -> None:
    """The gradient of ``w selected_logp + v entropy`` on the backend's support: exactly 0 on
    every column outside ``S`` (the target's too), and within the gradient bounds of the
    exact one on ``S`` (:func:`~tp_logprob.judging.gradients.gradient_bound` on the
    problem whose columns outside ``S`` are ``-inf``); a fused backend's ``d hidden``,
    ``d weight`` and ``d bias`` from it."""
    if isinstance(case, HiddenCase):

        def support_of(outputs: Outputs) -> tuple[Bools, Bools]:
            found = backend_support(case, outputs)
            return found.mask, found.defined

        expect_fused_gradients(backend, case, stats, support_of=support_of)
        return
    run = backward(prop, case, backend)
    judge_processed_backward(prop, case, backend.backend_id, run, stats)
