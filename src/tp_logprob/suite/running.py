"""Running one case on a backend at its TP degree, as every property does.

:func:`execute` dispatches by backend id (so the capability gate is exercised),
runs every emulated rank through :func:`~tp_logprob.run_tp` (or
:func:`~tp_logprob.run_tp_hidden` for a fused LM-head case), which also proves the
outputs are replicated, and checks the structure of what came back (a processed
op's ``support_lse``, ``support_size`` and ``support_threshold`` included).
:func:`sub_batch` and :func:`select_rows` cut a case (a replayed support's rows
too) and its outputs to some rows.

On a real process group (the suite under ``torchrun``, see
:mod:`tp_logprob.real_group`), the session binds every backend to the group
(:attr:`~tp_logprob.suite.backends.BackendUnderTest.group`): a case whose TP degree is
the group's runs on it, this process running its own rank only (:func:`run_logits`,
:func:`run_hidden`), and a case of another TP degree still runs on the emulated group.
A gradient then holds only this rank's shard until :func:`gathered_grad` (or
:func:`summed_grad`, for the partial ``d hidden``) brings in the others'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from tp_logprob.comm import DEFAULT_TIMEOUT_S, EmulationUnavailableError
from tp_logprob.contract import LogprobContract, MaskSpec
from tp_logprob.judging.outputs import Floats, Outputs, select_rows
from tp_logprob.judging.violation import violation
from tp_logprob.result import LogprobResult
from tp_logprob.row_groups import contract_rows
from tp_logprob.strategies import HiddenCase, LogprobCase
from tp_logprob.strategies.input_forms import CONTIGUOUS, laid_out, laid_out_leaf
from tp_logprob.suite.backends import BackendUnderTest, RankGroup
from tp_logprob.suite.outcomes import NotApplicable
from tp_logprob.support import SupportMode

__all__ = [
    "GARBAGE_TARGETS",
    "caller_rows",
    "caller_view",
    "execute",
    "expanded_batch",
    "gathered_grad",
    "on_real_group",
    "outputs_of",
    "run_hidden",
    "run_logits",
    "select_rows",
    "shifted_rows",
    "sub_batch",
    "summed_grad",
    "trainer_view",
]


def execute(
    backend: BackendUnderTest,
    case: LogprobCase,
    *,
    logits: Any = None,
    targets: Any = None,
    operands: tuple[Any, Any, Any] | None = None,
) -> Outputs:
    """Run ``case`` on every emulated rank of its contract; check replication and structure.

    ``logits`` and ``targets`` override the tensors made from ``case`` (e.g. logits
    that require grad, or tensors the caller keeps to inspect afterwards). A fused
    LM-head case (``input_kind="hidden"``) runs through
    :func:`~tp_logprob.run_tp_hidden` on its ``(hidden, weight, bias)``, or on
    ``operands`` when given. The tensors made from ``case`` are laid out as its
    ``form`` says (:func:`~tp_logprob.strategies.input_forms.laid_out`); each rank's
    shard is then a slice of that view.
    """
    from tp_logprob.emulate import ReplicationError

    contract = case.contract
    op = backend.op_for(contract)
    form = case.form
    try:
        if targets is None:
            targets = laid_out(case.torch_targets(backend.device), form.targets)
        if isinstance(case, HiddenCase):
            if operands is None:
                hidden, weight, bias = case.torch_inputs(backend.device)
                hidden, weight = laid_out(hidden, form.values), laid_out(weight, form.weight)
            else:
                hidden, weight, bias = operands
            results = run_hidden(backend, op, hidden, weight, targets, contract, bias=bias)
        else:
            if logits is None:
                logits = laid_out(case.torch_logits(backend.device), form.values)
            results = run_logits(backend, op, logits, targets, contract)
    except ReplicationError as error:
        raise violation(
            "replicated outputs: ranks returned different bits",
            case,
            backend.backend_id,
            [("problem", str(error))],
        ) from None
    return outputs_of(results, case, backend.backend_id)


def _group_for(backend: BackendUnderTest, contract: LogprobContract) -> RankGroup | None:
    """The real group if ``contract`` runs on it; None for the emulated group; not applicable when
    the backend cannot run on the emulated group."""
    group = backend.group
    world = contract.sharding.tp_world_size
    if group is not None and world == group.world_size:
        return group
    if backend.capability.real_group_only:
        where = (
            "run the suite under torchrun"
            if group is None
            else f"this check needs TP={world} and the group has {group.world_size} ranks"
        )
        raise NotApplicable(
            f"{backend.backend_id} runs only on a real process group (real_group_only), not "
            f"on the emulated group: {where}"
        )
    return None


@contextmanager
def _emulation(backend: BackendUnderTest) -> Iterator[None]:
    """An op that says it cannot run on the emulated group here does not apply, not fails."""
    try:
        yield
    except EmulationUnavailableError as error:
        raise NotApplicable(
            f"{backend.backend_id} cannot run on the emulated group here: {error}"
        ) from None


def run_logits(
    backend: BackendUnderTest,
    op: Any,
    logits: Any,
    targets: Any,
    contract: LogprobContract,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> list[LogprobResult]:
    """:func:`~tp_logprob.run_tp` for ``backend``'s ``op``, or this rank of the real group.

    On the real group ``timeout`` is the group's own; the results are every rank's
    (this rank's own, the others' copies), checked bit for bit as ``run_tp`` checks.
    """
    from tp_logprob.emulate import run_tp

    group = _group_for(backend, contract)
    if group is None:
        with _emulation(backend):
            return run_tp(op, logits, targets, contract, timeout=timeout)
    bounds = contract.sharding.vocab_shard_bounds

    def call(rank: int, rank_contract: LogprobContract, handle: Any) -> Any:
        start, end = bounds[rank]
        return op(logits[:, start:end], targets, rank_contract, group=handle)

    return list(group.run(call, contract, backend.device))


def run_hidden(
    backend: BackendUnderTest,
    op: Any,
    hidden: Any,
    weight: Any,
    targets: Any,
    contract: LogprobContract,
    *,
    bias: Any = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> list[LogprobResult]:
    """:func:`~tp_logprob.run_tp_hidden` for ``backend``'s ``op``, or this rank of the real
    group (as :func:`run_logits`)."""
    from tp_logprob.emulate import run_tp_hidden

    group = _group_for(backend, contract)
    if group is None:
        with _emulation(backend):
            return run_tp_hidden(op, hidden, weight, targets, contract, bias=bias, timeout=timeout)
    bounds = contract.sharding.vocab_shard_bounds

    def call(rank: int, rank_contract: LogprobContract, handle: Any) -> Any:
        start, end = bounds[rank]
        rows = None if bias is None else bias[start:end]
        return op(hidden, targets, rank_contract, group=handle, weight=weight[start:end], bias=rows)

    return list(group.run(call, contract, backend.device))


def gathered_grad(
    leaf: Any, contract: LogprobContract, backend: BackendUnderTest, *, dim: int = 1
) -> Any:
    """``leaf.grad`` as every rank's backward filled it: on the emulated group the threads
    share ``leaf``; on a real group each rank's shard (along ``dim``) comes from that rank.

    Every rank calls it at the same point (it is a collective on a real group).
    """
    group = backend.group
    if group is None or contract.sharding.tp_world_size != group.world_size:
        return leaf.grad
    return group.assemble(leaf, contract.sharding.vocab_shard_bounds, dim)


def on_real_group(contract: LogprobContract, backend: BackendUnderTest) -> bool:
    """Whether ``contract`` runs on the ranks of a real process group (each its shard)."""
    group = backend.group
    return group is not None and contract.sharding.tp_world_size == group.world_size


def trainer_view(full: Any) -> tuple[Any, Any]:
    """``(leaf, rows)``: a ``[B, T + 1, D]`` leaf that requires grad, holding the ``[N, D]``
    rows ``full`` (logits or hidden states) at positions ``[:, :-1]`` (``B = 2`` for an even
    ``N``, else 1; the last position 0), and ``leaf[:, :-1]`` flattened to ``[N, D]``: the
    shift before the loss, a view for ``B = 1`` and a copy for ``B = 2``, as a trainer hands
    its activations over. :func:`shifted_rows` reads the gradient back."""
    import torch

    rows, width = full.shape
    batch = 2 if rows >= 2 and rows % 2 == 0 else 1
    leaf = full.new_zeros(batch, rows // batch + 1, width)
    with torch.no_grad():
        leaf[:, :-1] = full.reshape(batch, rows // batch, width)
    leaf.requires_grad_(True)
    return leaf, leaf[:, :-1].reshape(rows, width)


def caller_view(full: Any, form: str) -> tuple[Any, Any]:
    """``(leaf, rows)``: the tensor a trainer holds and the ``[N, D]`` view of it it hands
    the op. A contiguous ``form`` is the shift of a ``[B, T + 1, D]`` leaf
    (:func:`trainer_view`); any other is the buffer of that
    :mod:`~tp_logprob.strategies.input_forms` layout (a wider row stride, a column-major
    or offset tensor, ...). :func:`caller_rows` reads the gradient back."""
    if form == CONTIGUOUS:
        return trainer_view(full)
    return laid_out_leaf(full, form)


def caller_rows(grad: Any, rows: Any) -> Any:
    """The ``[N, D]`` gradient at ``rows`` (a :func:`caller_view`) from its leaf's
    ``grad``, or None when an element of the leaf outside ``rows`` has a nonzero one."""
    import torch

    if grad.dim() == 3:
        return shifted_rows(grad)
    geometry = (rows.shape, rows.stride(), rows.storage_offset())
    outside = torch.ones(grad.shape, dtype=torch.bool, device=grad.device)
    outside.as_strided(*geometry).fill_(False)
    if bool((grad[outside] != 0).any()):
        return None
    return grad.as_strided(*geometry)


def shifted_rows(grad: Any) -> Any:
    """The ``[N, D]`` rows of a :func:`trainer_view` leaf's gradient, or None when the
    position the shift drops holds a nonzero gradient (it is no input row)."""
    if bool((grad[:, -1] != 0).any()):
        return None
    return grad[:, :-1].reshape(-1, grad.shape[-1])


def summed_grad(leaf: Any, contract: LogprobContract, backend: BackendUnderTest) -> Any:
    """``leaf.grad`` summed over the ranks (the partial ``d hidden`` of each rank), in rank
    order on a real group; on the emulated group autograd already summed it into ``leaf``."""
    group = backend.group
    if group is None or contract.sharding.tp_world_size != group.world_size:
        return leaf.grad
    return group.sum_partials(leaf)


def outputs_of(results: Any, case: LogprobCase, backend_id: str) -> Outputs:
    """Every rank's ``results`` of ``case`` as :class:`Outputs`, after a structural check."""
    first = results[0]
    problems = _structure_problems(first, case.contract)
    if problems:
        raise violation(
            "output structure: not fp32 [N] tensors as the contract requires",
            case,
            backend_id,
            [("problem", "; ".join(problems))],
        )
    lse = None if first.lse is None else _numpy(first.lse)
    entropy = None if first.entropy is None else _numpy(first.entropy)
    if case.contract.support is None:
        return Outputs(_numpy(first.selected_logp), lse, results, entropy)
    threshold = first.support_threshold
    return Outputs(
        _numpy(first.selected_logp),
        lse,
        results,
        entropy,
        support_lse=_numpy(first.support_lse),
        support_size=np.asarray(first.support_size.detach().cpu().numpy(), dtype=np.int64),
        support_threshold=None if threshold is None else _numpy(threshold),
    )


def _numpy(tensor: Any) -> Floats:
    return np.asarray(tensor.detach().float().cpu().numpy(), dtype=np.float64)


def _structure_problems(result: Any, contract: LogprobContract) -> list[str]:
    rows = contract.num_tokens
    problems = []
    fields = [
        ("selected_logp", result.selected_logp, True, ""),
        ("lse", result.lse, contract.export_lse, "export_lse"),
        ("entropy", result.entropy, contract.export_entropy, "export_entropy"),
    ]
    for name, value, wanted, flag in fields:
        if not wanted:
            if value is not None:
                problems.append(f"{name} should be None ({flag}=False), got {type(value).__name__}")
            continue
        shape = tuple(getattr(value, "shape", ()))
        dtype = str(getattr(value, "dtype", type(value).__name__))
        if shape != (rows,) or dtype != "torch.float32":
            problems.append(f"{name} is {dtype} {list(shape)}, expected torch.float32 [{rows}]")
    if contract.support is not None:
        problems += _support_structure_problems(result, contract)
    return problems


def _support_structure_problems(result: Any, contract: LogprobContract) -> list[str]:
    """A processed op's fp32 ``support_lse``, int64 ``support_size`` and (sampling
    parameters) fp32 ``support_threshold``, ``[N]`` each; no threshold for a replayed mask."""
    rows = contract.num_tokens
    recomputed = contract.support_mode is SupportMode.SAMPLING_PARAMS
    problems = []
    fields = [
        ("support_lse", "torch.float32", True),
        ("support_size", "torch.int64", True),
        ("support_threshold", "torch.float32", recomputed),
    ]
    for name, wanted_dtype, wanted in fields:
        value = getattr(result, name, None)
        if not wanted:
            if value is not None:
                got = type(value).__name__
                problems.append(f"{name} should be None (a replayed mask), got {got}")
            continue
        shape = tuple(getattr(value, "shape", ()))
        dtype = str(getattr(value, "dtype", type(value).__name__))
        if shape != (rows,) or dtype != wanted_dtype:
            problems.append(f"{name} is {dtype} {list(shape)}, expected {wanted_dtype} [{rows}]")
    return problems


def sub_batch(
    case: LogprobCase, rows: Any, *, targets: Any = None, active: Any = None
) -> LogprobCase:
    """The case made of ``rows`` only (in that order, repeats allowed), with new ``targets``
    and ``active`` mask (one per new row) when given.

    A replayed support keeps each chosen row's kept ids. A fused case's exact logits
    and dot-product bounds, when already computed, are carried over row by row
    instead of being computed again. The case's form is kept.
    """
    rows = np.asarray(rows, dtype=np.int64)
    sub_contract = contract_rows(case.contract, rows)
    if active is not None:
        sub_mask = MaskSpec(
            len(rows),
            np.asarray(active, dtype=np.bool_),
            ignore_index=sub_contract.mask.ignore_index,
        )
        sub_contract = dataclasses.replace(sub_contract, mask=sub_mask)
    new_targets = case.targets[rows] if targets is None else np.asarray(targets)
    if isinstance(case, HiddenCase):
        sub = HiddenCase(
            sub_contract,
            case.logits[rows],
            new_targets,
            case.form,
            hidden=case.hidden[rows],
            weight=case.weight,
            bias=case.bias,
        )
        for name in ("exact_logits", "dot_bound"):  # functools.cached_property values
            if name in case.__dict__:
                sub.__dict__[name] = case.__dict__[name][rows]
        return sub
    return LogprobCase(sub_contract, case.logits[rows], new_targets, case.form)


GARBAGE_TARGETS = (-1, -100, 2**31 - 1, 2**40, -(2**40))
"""Targets an inactive row may hold: the op must never read them."""


def expanded_batch(case: LogprobCase, length: int, seed: int) -> LogprobCase:
    """A ``length``-row batch made of ``case``'s rows, every row its own problem.

    Row ``i`` copies a random row of ``case`` (its activity included) and takes
    its own target: the copied row's, or a random live column (an inactive row, a
    garbage target from :data:`GARBAGE_TARGETS`). In a logits case half the copies
    also permute their live columns (the target follows), so no two rows need
    agree and a kernel that reads another row's logits or target is caught; padding
    columns stay where they are. All of it follows from ``seed``.
    """
    rng = np.random.default_rng(seed)
    contract = case.contract
    real = contract.sharding.real_vocab_size
    source = rng.integers(0, contract.num_tokens, length)
    active = case.active[source]
    targets = np.where(
        rng.random(length) < 0.5, case.targets[source], rng.integers(0, real, length)
    )
    targets = np.where(active, targets, rng.choice(GARBAGE_TARGETS, length))
    expanded = sub_batch(case, source, targets=targets, active=active)
    if isinstance(case, HiddenCase):
        return expanded
    logits = np.array(expanded.logits)
    for row in np.flatnonzero(rng.random(length) < 0.5):
        order = rng.permutation(real)  # new column j holds old column order[j]
        logits[row, :real] = logits[row, order]
        if active[row]:
            targets[row] = int(np.argsort(order)[targets[row]])
    return expanded.replace(logits=logits, targets=targets)
