"""Running one case on a backend at its TP degree, as every property does.

:func:`execute` dispatches by backend id (so the capability gate is exercised),
runs every emulated rank through :func:`~tp_logprob.run_tp` (or
:func:`~tp_logprob.run_tp_hidden` for a fused LM-head case), which also proves the
outputs are replicated, and checks the structure of what came back.
:func:`sub_batch` and :func:`select_rows` cut a case and its outputs to some rows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.contract import LogprobContract, MaskSpec
from tp_logprob.properties.report import violation
from tp_logprob.strategies import HiddenCase, LogprobCase

__all__ = ["Floats", "Outputs", "execute", "select_rows", "sub_batch"]

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Outputs:
    """One run's replicated outputs as float64 copies of the fp32 values.

    ``entropy`` is None unless the contract has ``export_entropy``.
    """

    selected: Floats
    lse: Floats | None
    results: Any  # the per-rank LogprobResults, for gradients
    entropy: Floats | None = None


def execute(
    backend: Any,
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
    ``operands`` when given.
    """
    from tp_logprob.emulate import ReplicationError, run_tp, run_tp_hidden

    contract = case.contract
    op = backend.op_for(contract)
    try:
        if targets is None:
            targets = case.torch_targets(backend.device)
        if isinstance(case, HiddenCase):
            hidden, weight, bias = (
                case.torch_inputs(backend.device) if operands is None else operands
            )
            results = run_tp_hidden(op, hidden, weight, targets, contract, bias=bias)
        else:
            full = case.torch_logits(backend.device) if logits is None else logits
            results = run_tp(op, full, targets, contract)
    except ReplicationError as error:
        raise violation(
            "replicated outputs: ranks returned different bits",
            case,
            backend.backend_id,
            [("problem", str(error))],
        ) from None
    first = results[0]
    problems = _structure_problems(first, contract)
    if problems:
        raise violation(
            "output structure: not fp32 [N] tensors as the contract requires",
            case,
            backend.backend_id,
            [("problem", "; ".join(problems))],
        )
    lse = None if first.lse is None else _numpy(first.lse)
    entropy = None if first.entropy is None else _numpy(first.entropy)
    return Outputs(_numpy(first.selected_logp), lse, results, entropy)


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
    return problems


def select_rows(outputs: Outputs, rows: Any) -> Outputs:
    """The outputs of ``rows`` only (in that order)."""
    lse = None if outputs.lse is None else outputs.lse[rows]
    entropy = None if outputs.entropy is None else outputs.entropy[rows]
    return Outputs(outputs.selected[rows], lse, outputs.results, entropy)


def sub_batch(case: LogprobCase, rows: Any) -> LogprobCase:
    """The case made of ``rows`` only (in that order, repeats allowed)."""
    contract = case.contract
    mask = contract.mask.active_mask
    sub_mask = MaskSpec(
        len(rows), None if mask is None else mask[rows], ignore_index=contract.mask.ignore_index
    )
    sub_contract = dataclasses.replace(contract, mask=sub_mask)
    if isinstance(case, HiddenCase):
        return HiddenCase(
            sub_contract,
            case.logits[rows],
            case.targets[rows],
            hidden=case.hidden[rows],
            weight=case.weight,
            bias=case.bias,
        )
    return LogprobCase(sub_contract, case.logits[rows], case.targets[rows])
