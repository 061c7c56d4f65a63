"""Bad inputs raise LogprobContractError at the op's boundary, before any output exists.

The test draws which bad input to make; its property makes the call and judges it.
Every rank gets the bad input (through ``run_tp``, or each rank of a real process
group its own shard of it), except for a wrong shard width and an active target
outside its row's replayed kept ids, which are handed to a single rank whose peers
never arrive: an op that reached a collective before checking its inputs fails
instead of raising ``LogprobContractError``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tp_logprob.errors import LogprobContractError
from tp_logprob.judging.violation import PropertyInputError, violation
from tp_logprob.strategies import HiddenCase, LogprobCase
from tp_logprob.suite.applicability import (
    LEAVES_INPUTS,
    LOGITS_INPUT,
    REPLAYED_SUPPORT,
    applies_to,
)
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.draws import draw_case, draw_processed_case
from tp_logprob.suite.outcomes import NotApplicable
from tp_logprob.suite.property import suite_property
from tp_logprob.suite.running import execute, run_logits
from tp_logprob.suite.session import Suite
from tp_logprob.suite.summary import SuiteStats
from tp_logprob.support import SupportMode

BAD_INPUT_KINDS = (
    "active target outside the real vocabulary",
    "wrong shard width",
    "wrong logits dtype",
    "wrong targets shape",
    "active target outside its replayed kept ids",
)
"""The bad inputs made; the last needs a contract with a replayed mask
(``test_rejects_targets_outside_replayed_support``)."""


BAD_DTYPES = ("float32", "bfloat16", "float16", "float64")


_PEER_TIMEOUT_S = 2.0


class CollectiveBeforeCheckError(RuntimeError):
    """A backend reached its collective before rejecting a bad input."""


class _LoneRank:
    """One rank's group whose peers are absent: a collective fails at once, not on timeout.

    A backend must reject a bad shard width before any collective, so reaching
    ``all_gather`` is itself the bug, and waiting for the peers would only cost time.
    """

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    def all_gather(self, tensor: Any) -> list[Any]:
        raise CollectiveBeforeCheckError(
            f"rank {self.rank} reached all_gather before rejecting its bad input"
        )


def _need(params: Mapping[str, Any], key: str) -> Any:
    value = params.get(key)
    if value is None:
        raise PropertyInputError(f"params.{key}: required for kind {params['kind']!r}")
    return value


def _skip_a_lone_rank(backend: BackendUnderTest, kind: str) -> None:
    """A bad input handed to one rank runs that rank alone. A ``real_group_only`` backend
    reaches for torch.distributed's group even so, so off a real group the check is skipped
    for it (under torchrun it runs: the op must reject the input before any collective)."""
    if backend.capability.real_group_only and backend.group is None:
        raise NotApplicable(
            f"{backend.backend_id} runs only on a real process group (real_group_only): "
            f"{kind!r} is handed to one rank alone, off the group"
        )


def _bad_call(
    backend: BackendUnderTest, case: LogprobCase, params: Mapping[str, Any]
) -> tuple[Callable[[], Any], Any]:
    """The bad call, not yet made, and the logits tensor it passes."""
    import torch

    kind = params["kind"]
    contract = case.contract
    if kind in ("wrong shard width", BAD_INPUT_KINDS[4]):
        _skip_a_lone_rank(backend, kind)
    op = backend.op_for(contract)
    logits, targets = case.torch_logits(backend.device), case.torch_targets(backend.device)
    if kind == "wrong shard width":
        sharding = contract.sharding
        rank, width = _need(params, "rank"), _need(params, "width")
        # One column too many is a bad width too, even for a shard of the whole vocabulary.
        if not (
            0 <= rank < sharding.tp_world_size and 0 <= width <= sharding.padded_vocab_size + 1
        ):
            raise PropertyInputError(f"params: rank {rank} / width {width} do not fit the case")
        local = torch.zeros((contract.num_tokens, width), dtype=logits.dtype, device=logits.device)
        return _lone_rank_call(op, local, targets, contract, rank), local
    if kind == BAD_INPUT_KINDS[4]:
        return _outside_kept_call(op, case, params, logits)
    if kind == "wrong logits dtype":
        name = _need(params, "dtype")
        if name not in BAD_DTYPES:
            raise PropertyInputError(f"params.dtype={name!r}: expected one of {BAD_DTYPES}")
        logits = logits.to(getattr(torch, name))
    elif kind == "wrong targets shape":
        shape = tuple(_need(params, "targets_shape"))
        if any(size < 0 or size > 4096 for size in shape):
            raise PropertyInputError(f"params.targets_shape={list(shape)}: sizes out of range")
        targets = torch.zeros(shape, dtype=torch.int64, device=logits.device)
    elif kind == BAD_INPUT_KINDS[0]:
        row, target = _need(params, "row"), _need(params, "target")
        if not (0 <= row < contract.num_tokens and -(2**63) <= target < 2**63):
            raise PropertyInputError(f"params: row {row} / target {target} do not fit the case")
        targets = _with_target(case, row, target, logits.device)
    else:
        raise PropertyInputError(f"params.kind={kind!r}: expected one of {BAD_INPUT_KINDS}")
    return lambda: run_logits(
        backend, op, logits, targets, contract, timeout=_PEER_TIMEOUT_S
    ), logits


def _outside_kept_call(
    op: Any, case: LogprobCase, params: Mapping[str, Any], logits: Any
) -> tuple[Callable[[], Any], Any]:
    """One rank's call (its peers never arrive) with an active row's target set to a live id
    its replayed mask does not keep."""

    contract = case.contract
    sharding = contract.sharding
    support = contract.support
    if support is None or support.mode is not SupportMode.REPLAYED_MASK:
        raise PropertyInputError(f"params.kind={params['kind']!r}: needs a replayed mask")
    rank, row, target = _need(params, "rank"), _need(params, "row"), _need(params, "target")
    if not (
        0 <= rank < sharding.tp_world_size
        and 0 <= row < contract.num_tokens
        and bool(case.active[row])
        and 0 <= target < sharding.real_vocab_size
        and target not in support.kept_row(row)
    ):
        raise PropertyInputError(
            f"params: rank {rank} / row {row} / target {target} is not an active row's live "
            "target outside its kept ids"
        )
    targets = _with_target(case, row, target, logits.device)
    start, end = sharding.vocab_shard_bounds[rank]
    if isinstance(case, HiddenCase):
        hidden, weight, bias = case.torch_inputs(logits.device)
        rows = {"weight": weight[start:end], "bias": None if bias is None else bias[start:end]}
        return _lone_rank_call(op, hidden, targets, contract, rank, **rows), hidden
    local = logits[:, start:end].clone()
    return _lone_rank_call(op, local, targets, contract, rank), local


def _with_target(case: LogprobCase, row: int, target: int, device: Any) -> Any:
    """``case``'s targets (a torch tensor on ``device``) with ``row``'s set to ``target``."""
    import torch

    bad = np.array(case.targets)
    bad[row] = target
    return torch.from_numpy(bad).to(device)


def _lone_rank_call(
    op: Any, first: Any, targets: Any, contract: Any, rank: int, **rows: Any
) -> Callable[[], Any]:
    """``op`` called as rank ``rank`` alone (no group at TP 1; else one whose peers never
    arrive), with ``first`` (its logits shard or the hidden states) and the LM-head ``rows``."""
    world = contract.sharding.tp_world_size
    group = None if world == 1 else _LoneRank(rank, world)
    local_contract = contract.with_rank(rank)
    return lambda: op(first, targets, local_contract, group=group, **rows)


_TORCH_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _draw_bad_input(data: Any, case: LogprobCase, kind: str) -> dict[str, Any]:
    """Exactly which bad input of ``kind`` to make, as params of the check."""
    contract = case.contract
    if kind == "wrong shard width":
        sharding = contract.sharding
        rank = data.draw(
            st.integers(0, sharding.tp_world_size - 1), label="rank given the bad width"
        )
        start, end = sharding.vocab_shard_bounds[rank]
        width = data.draw(
            st.sampled_from([w for w in (end - start - 1, end - start + 1) if w >= 0]),
            label="wrong width",
        )
        return {"kind": kind, "rank": rank, "width": width}
    if kind == "wrong logits dtype":
        own = _TORCH_NAMES[contract.dtype.value]
        wrong = data.draw(st.sampled_from([d for d in BAD_DTYPES if d != own]), label="wrong dtype")
        return {"kind": kind, "dtype": wrong}
    if kind == "wrong targets shape":
        rows = contract.num_tokens
        shape = data.draw(
            st.sampled_from([(rows + 1,), (rows, 1), (1, rows), ()]), label="targets shape"
        )
        return {"kind": kind, "targets_shape": list(shape)}
    row = data.draw(st.sampled_from(np.flatnonzero(case.active).tolist()), label="active row")
    real = contract.sharding.real_vocab_size
    target = data.draw(
        st.sampled_from(
            [
                -1,
                real,
                contract.sharding.padded_vocab_size,
                contract.mask.ignore_index,
                2**40,
                -(2**40),
            ]
        ),
        label="bad target",
    )
    return {"kind": kind, "row": row, "target": target}


_BAD_INPUT_PARAMS = {
    "kind": "str",
    "rank": "int",
    "width": "int",
    "dtype": "str",
    "targets_shape": "int_list",
    "row": "int",
    "target": "int",
}


@suite_property("bad_inputs", params=_BAD_INPUT_PARAMS, optional=set(_BAD_INPUT_PARAMS) - {"kind"})
def bad_inputs(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """The bad input raises LogprobContractError, returns nothing and leaves the logits alone."""

    kind = params["kind"]
    call, logits = _bad_call(backend, case, params)
    original = logits.clone()
    try:
        result = call()
    except LogprobContractError:
        if not bool(_same_bits(original, logits).all()):  # NaN payloads compared as bits
            raise violation(
                f"bad inputs: {kind} raised, but only after writing into the logits",
                case,
                backend.backend_id,
                [("observed", "the logits tensor changed during the rejected call")],
            ) from None
        return
    except Exception as error:
        raise violation(
            f"bad inputs: {kind} raised {type(error).__name__}, not LogprobContractError",
            case,
            backend.backend_id,
            [("error", f"{type(error).__name__}: {error}".splitlines()[0])],
        ) from None
    raise violation(
        f"bad inputs: {kind} was accepted",
        case,
        backend.backend_id,
        [("observed", f"returned {type(result).__name__} instead of raising LogprobContractError")],
    )


@applies_to(LOGITS_INPUT)
@given(data=st.data())
def test_rejects_bad_inputs(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """Each bad input raises LogprobContractError, returns nothing and leaves the logits alone."""
    backend = tp_logprob_backend
    case = draw_case(data, backend, tp_logprob_suite)
    kinds = [k for k in BAD_INPUT_KINDS[:4] if k != BAD_INPUT_KINDS[0] or case.active.any()]
    kind = data.draw(st.sampled_from(kinds), label="bad input")
    bad_inputs.run(backend, case, _draw_bad_input(data, case, kind))


@applies_to(REPLAYED_SUPPORT)
@given(data=st.data())
def test_rejects_targets_outside_replayed_support(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """An active target outside its row's replayed kept ids: LogprobContractError on the
    rank that gets it, before any collective (an engine never samples outside its mask)."""
    backend = tp_logprob_backend
    replayed = (SupportMode.REPLAYED_MASK,)
    case = draw_processed_case(data, backend, tp_logprob_suite, modes=replayed)
    contract = case.contract
    assert contract.support is not None
    real = contract.sharding.real_vocab_size
    candidates = [
        row
        for row in np.flatnonzero(case.active).tolist()
        if contract.support.kept_counts()[row] < real
    ]
    if not candidates:
        return  # every active row keeps the whole vocabulary: no target lies outside
    row = data.draw(st.sampled_from(candidates), label="active row")
    outside = np.setdiff1d(np.arange(real), contract.support.kept_row(row)).tolist()
    params = {
        "kind": BAD_INPUT_KINDS[4],
        "rank": data.draw(st.integers(0, contract.sharding.tp_world_size - 1), label="rank"),
        "row": row,
        "target": data.draw(st.sampled_from(outside), label="target outside the kept ids"),
    }
    bad_inputs.run(backend, case, params)


@suite_property("inputs_untouched")
def inputs_untouched(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """The forward (and, for train, the backward) leaves ``local_logits`` and ``targets``
    as they were: the same bits and no in-place version bump, unless the capability
    declares ``consumes_input``. A trainer reuses the logits for entropy or KL."""
    import torch

    if backend.capability.consumes_input:
        return
    logits = case.torch_logits(backend.device)
    train = case.contract.role.value == "train"
    if train:
        logits.requires_grad_(True)
    targets = case.torch_targets(backend.device)
    saved = [
        (name, t, t.detach().clone(), t._version)
        for name, t in (("local_logits", logits), ("targets", targets))
    ]
    outputs = execute(backend, case, logits=logits, targets=targets)
    _compare_inputs(case, backend, saved, "forward")
    if train:
        total = sum(result.selected_logp.float().sum() for result in outputs.results)
        if isinstance(total, torch.Tensor) and total.requires_grad:
            torch.autograd.backward(total)
        _compare_inputs(case, backend, saved, "backward")


def _compare_inputs(
    case: LogprobCase, backend: BackendUnderTest, saved: list[tuple[str, Any, Any, int]], stage: str
) -> None:
    for name, tensor, before, version in saved:
        now = tensor.detach()
        same = _same_bits(before, now)
        if same.all() and tensor._version == version:
            continue
        changed = np.argwhere(~same)
        where = "no value changed" if changed.size == 0 else f"first at {changed[0].tolist()}"
        lines = [
            ("problem", f"{name} written in place during the {stage}: {where}"),
            ("changed", f"{int((~same).sum())} elements; version {version} -> {tensor._version}"),
            ("hint", "copy the input before an in-place kernel, or declare consumes_input=True"),
        ]
        if changed.size:
            index = tuple(changed[0].tolist())
            was, became = before[index].item(), now[index].item()
            lines.insert(1, ("values", f"before {was!r}, after {became!r}"))
        raise violation(
            "inputs untouched: the op modified its inputs in place",
            case,
            backend.backend_id,
            lines,
        )


def _same_bits(before: Any, now: Any) -> Any:
    """Elementwise bit equality (NaN payloads and signed zeros included), as numpy bools."""
    import torch

    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[before.element_size()]
    return (before.contiguous().view(bits) == now.contiguous().view(bits)).cpu().numpy()


@applies_to(LOGITS_INPUT, LEAVES_INPUTS)
@given(data=st.data())
def test_inputs_are_left_untouched(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """local_logits and targets keep their bits and version through forward and backward."""
    backend = tp_logprob_backend
    case = draw_case(data, backend, tp_logprob_suite, special_values=True)
    inputs_untouched.run(backend, case, stats=tp_logprob_suite.stats)
