"""``assert_logprob_close``: a kernel's outputs against the exact oracle, judged as the suite does.

The call becomes the suite's case (:mod:`tp_logprob.testing._case`), the exact values
come from the oracle, the bounds from the suite's tolerance table
(:func:`~tp_logprob.judging.bounds.suite_tolerance`: sums in the declared ``order``, by
default any order with an online softmax over blocks of 16 columns or more, then the shard
merge, ``docs/tolerances.md``) and
the verdict from :func:`~tp_logprob.judging.measuring.expect_close` and
:func:`~tp_logprob.judging.gradients.judge_gradient`, so a failure reads like the
suite's and its artifact replays like the suite's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from tp_logprob.accumulation import ANY_ORDER, AccumulationOrder
from tp_logprob.contract import LogprobRole
from tp_logprob.errors import LogprobContractError
from tp_logprob.judging.expected import exact_outputs
from tp_logprob.judging.gradients import Backward, gradient_bound, judge_gradient
from tp_logprob.judging.measuring import expect_close
from tp_logprob.judging.outputs import Outputs
from tp_logprob.judging.processed import (
    BackendSupport,
    expect_processed_close,
    judge_processed_gradient,
)
from tp_logprob.judging.violation import LABEL_WIDTH, PropertyViolation
from tp_logprob.oracle.exact import exact_logprob_grad
from tp_logprob.strategies import LogprobCase
from tp_logprob.suite.backends import BackendSpecError, BackendUnderTest, resolve_backends
from tp_logprob.support import SupportMode, SupportSpec
from tp_logprob.testing._arrays import Floats, gradient, per_row
from tp_logprob.testing._case import build_case, full_logits

NAME = "assert_logprob_close"
REPLAYED_PROPERTIES = ("oracle", "gradients", "processed_oracle", "processed_gradients")
"""The suite properties a failure is recorded under, by name: the catalogue itself
(:mod:`tp_logprob.replay.catalogue`) would import the property modules, which apply
``@given``, refused inside a Hypothesis test (an assert may run in one). tests/testing
checks every name is the suite's."""
_UNNAMED = "(not named; pass backend=)"


def assert_logprob_close(
    selected_logp: Any,
    logits: Any = None,
    targets: Any = None,
    *,
    lse: Any = None,
    entropy: Any = None,
    grad: Any = None,
    dtype: str = "fp32",
    temperature: float = 1.0,
    support: SupportSpec | None = None,
    real_vocab_size: int | None = None,
    active_mask: Any = None,
    tp_shards: Any = None,
    order: AccumulationOrder | None = None,
    backend: str | None = None,
    artifact_dir: str | os.PathLike[str] | None = None,
) -> None:
    """Raise ``AssertionError`` unless every given output is within the tolerance table of
    the exact oracle's value, row by row.

    ``selected_logp``, ``lse`` and ``entropy`` are ``[N]``; ``grad`` is
    ``d sum(selected_logp) / d logits``, ``[N, V]``; ``logits`` are ``[N, V]`` values of
    ``dtype`` (the kernel's input dtype: ``"bf16"``, ``"fp16"`` or ``"fp32"``), or
    ``tp_shards`` the per-rank ``[N, V_r]`` shards in rank order (``logits=None``),
    judged as that TP layout. Torch tensors (any device) or numpy arrays; numpy inputs
    never import torch. ``support`` is the engine's kept set
    (``SupportSpec.from_kept_lists``): ``selected_logp`` and ``entropy`` are then judged
    on it, ``lse`` over the whole row. NaN and infinities must match exactly and inactive
    rows must be exactly ``+0.0``.

    ``order`` is how the kernel sums a row (or, with ``tp_shards``, each rank its shard):
    an :class:`~tp_logprob.AccumulationOrder` such as ``AccumulationOrder.tree()`` (pairwise)
    or ``AccumulationOrder.blocked(1024, within="tree")``; the bound then takes that
    order's path of additions instead of any order's, which at 32k to 152k columns is
    tens to hundreds of times tighter (``docs/tolerances.md``, "Declared orders"). With
    ``tp_shards`` the bound counts the widest shard's columns, not the whole row's. A
    ``support`` is judged under any order.

    The message names the worst row and column, the observed and exact values and the
    error in fp32 ulps against the bound. With ``artifact_dir`` (and ``backend``, the
    registered id or ``module:attr`` the suite's ``--tp-logprob-backend`` takes) a failure
    is also written there as a suite artifact; the message ends with the
    ``python -m tp_logprob replay`` command that reruns it on that backend.

    >>> import numpy as np
    >>> assert_logprob_close(np.array([-0.6931472], np.float32), [[0.0, 0.0]], [1])
    """
    if order is not None and not isinstance(order, AccumulationOrder):
        raise LogprobContractError(
            f"order={order!r}: expected an AccumulationOrder (AccumulationOrder.tree(), ...)"
        )
    full, widths = full_logits(logits, tp_shards)
    if support is not None and getattr(support, "mode", None) is SupportMode.SAMPLING_PARAMS:
        raise LogprobContractError(
            f"support={support!r}: sampling parameters leave borderline tokens to the engine; "
            "judge its kept set with assert_support_admissible and pass that set here as "
            "SupportSpec.from_kept_lists(kept)"
        )
    case = build_case(
        full,
        widths,
        targets,
        dtype=dtype,
        temperature=temperature,
        real_vocab_size=real_vocab_size,
        active_mask=active_mask,
        support=support,
        role=LogprobRole.INFER if grad is None else LogprobRole.TRAIN,
        export_entropy=entropy is not None,
    )
    rows = case.contract.num_tokens
    observed = Outputs(
        per_row(selected_logp, "selected_logp", rows),
        None if lse is None else per_row(lse, "lse", rows),
        None,
        None if entropy is None else per_row(entropy, "entropy", rows),
    )
    observed_grad = (
        None if grad is None else gradient(grad, "grad", full.shape, tp_shards is not None)
    )
    recorder = None if artifact_dir is None else _backend_for_artifacts(backend, artifact_dir)
    backend_id = backend or _UNNAMED
    stage = "forward"
    try:
        _judge_forward(case, backend_id, observed, order or ANY_ORDER, tp_shards is not None)
        stage = "gradient"
        if observed_grad is not None:
            _judge_gradient(case, backend_id, observed, observed_grad)
    except PropertyViolation as failure:
        if recorder is None or artifact_dir is None:
            raise
        prop = _replayed_property(case, stage)
        raise _recorded(failure, prop, case, recorder, Path(artifact_dir)) from None


def _judge_forward(
    case: LogprobCase,
    backend_id: str,
    observed: Outputs,
    order: AccumulationOrder,
    shard_partials: bool,
) -> None:
    if case.contract.support is None:
        selected, lse = exact_outputs(case)
        expect_close(
            f"{NAME}: output outside the tolerance table of the exact oracle",
            case,
            backend_id,
            observed,
            selected,
            lse,
            count_ulps=False,
            order=order,
            shard_partials=shard_partials,
        )
        return
    expect_processed_close(
        f"{NAME}: output outside the tolerance table of the exact values on the support",
        case,
        backend_id,
        observed,
        _kept(case),
        count_ulps=False,
    )


def _judge_gradient(case: LogprobCase, backend_id: str, observed: Outputs, grad: Floats) -> None:
    rows = case.contract.num_tokens
    run = Backward(observed, grad, np.ones(rows), np.zeros(rows))
    if case.contract.support is not None:
        judge_processed_gradient(NAME, case, backend_id, run, _kept(case))
        return
    exact = exact_logprob_grad(
        case.logits,
        case.targets,
        active_mask=case.active,
        real_vocab_size=case.contract.sharding.real_vocab_size,
        temperature=case.contract.batch_temperature,
    )
    judge_gradient(NAME, case, backend_id, run, exact, None, gradient_bound(case, exact))


def _kept(case: LogprobCase) -> BackendSupport:
    support = case.contract.support
    assert support is not None  # the callers' branch
    padded = case.contract.sharding.padded_vocab_size
    return BackendSupport(support.dense(padded), np.ones(case.contract.num_tokens, np.bool_))


def _replayed_property(case: LogprobCase, stage: str) -> str:
    """The suite property that reruns this check on a backend."""
    processed = case.contract.support is not None
    if stage == "forward":
        return "processed_oracle" if processed else "oracle"
    return "processed_gradients" if processed else "gradients"


def _backend_for_artifacts(
    backend: str | None, artifact_dir: str | os.PathLike[str]
) -> BackendUnderTest:
    """The backend ``backend`` names, resolved before any work (replay needs its id)."""
    from tp_logprob.registry import detect_platform

    if not isinstance(backend, str) or not backend.strip():
        raise LogprobContractError(
            f"artifact_dir={os.fspath(artifact_dir)!r} needs backend=: the registered id (or "
            "module:attr) replay reruns the case on"
        )
    try:
        return resolve_backends([backend], detect_platform())[0]
    except BackendSpecError as error:
        raise LogprobContractError(str(error).replace("--tp-logprob-backend", "backend")) from None


def _recorded(
    failure: PropertyViolation,
    prop: str,
    case: LogprobCase,
    backend: BackendUnderTest,
    folder: Path,
) -> PropertyViolation:
    """``failure`` written as a suite artifact, with where it is and the command that replays it."""
    from tp_logprob.replay.artifacts import command_to_replay, write_artifact

    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    path = write_artifact(
        folder,
        REPLAYED_PROPERTIES,
        prop=prop,
        backend=backend,
        case=case,
        params={},
        failure=failure,
        test=current.rsplit(" ", 1)[0] or None,
    )
    lines = [
        ("artifact", f"{path} (property {prop!r})"),
        ("replay", command_to_replay(path, backend.spec)),
    ]
    tail = "\n".join(f"  {label.ljust(LABEL_WIDTH)}  {text}" for label, text in lines)
    return PropertyViolation(failure.prop, f"{failure.report}\n{tail}")
