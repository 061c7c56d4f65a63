"""``assert_batch_invariant`` and ``assert_bitwise_across_tp``: the determinism a kernel claims.

Both run the op on one batch more than once and compare fp32 bits (NaN payloads and
signed zeros included), as the suite's ``batch_invariance`` and ``tp_consistency``
properties do (``docs/semantics.md``, "Determinism scopes"). The op is a backend id
(dispatched through the registry), an op of the project's signature
``op(local_logits, targets, contract, group=...)`` (run on the emulated group by
:func:`~tp_logprob.run_tp`), or, for batch invariance only, a plain
``op(logits, targets)``. torch is imported when an assert runs, not before.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.contract import (
    DeterminismScope,
    LogprobRole,
    ReductionSpec,
    ShardingSpec,
    even_shard_bounds,
)
from tp_logprob.errors import LogprobContractError
from tp_logprob.judging.violation import format_value
from tp_logprob.strategies import LogprobCase
from tp_logprob.suite.running import sub_batch
from tp_logprob.testing._arrays import as_numpy, is_tensor
from tp_logprob.testing._case import build_case, full_logits

Named = list[tuple[str, npt.NDArray[Any]]]
_FIELDS = ("selected_logp", "lse", "entropy", "support_lse", "support_size", "support_threshold")


def assert_batch_invariant(
    op: Any,
    logits: Any,
    targets: Any,
    *,
    dtype: str = "fp32",
    temperature: float = 1.0,
    real_vocab_size: int | None = None,
    active_mask: Any = None,
) -> None:
    """Raise ``AssertionError`` unless every row's outputs have the same bits whatever the
    rest of the batch: the batch reversed, doubled, odd rows first, and a few rows alone.

    ``op`` is a backend id, a tp-logprob op or a plain ``op(logits, targets)`` returning a
    tensor or a tuple of them; ``logits`` are ``[N, V]`` (a tensor stays on its device).
    The message names the rearrangement, the output, the rows that differ and their
    positions, and the two values with their bits.
    """
    case = _case(logits, targets, dtype, temperature, real_vocab_size, active_mask)
    contract = dataclasses.replace(
        case.contract, reduction=ReductionSpec(DeterminismScope.FIXED_TOPOLOGY)
    )
    case = case.replace(contract=contract)
    run = _runner(op, logits, plain_ok=True)
    whole = run(case)
    n = contract.num_tokens
    for label, rows in _rearrangements(n):
        again = run(sub_batch(case, rows))
        _compare(
            f"assert_batch_invariant: a row's bits depend on the rest of the batch ({label})",
            op,
            [(name, values[rows]) for name, values in whole],
            again,
            ("in the batch", "rearranged"),
            [("batch", f"rows {_short(rows)} ({label}) against the whole batch of {n}")],
            rows,
        )


def assert_bitwise_across_tp(
    op: Any,
    logits: Any,
    targets: Any,
    *,
    tp_degrees: Sequence[int] = (1, 2, 4),
    dtype: str = "fp32",
    temperature: float = 1.0,
    real_vocab_size: int | None = None,
    active_mask: Any = None,
) -> None:
    """Raise ``AssertionError`` unless the outputs have the same bits for every TP degree in
    ``tp_degrees`` (Megatron's even shards of the vocabulary, on the emulated group).

    ``op`` is a backend id or a tp-logprob op ``op(local_logits, targets, contract,
    group=...)``; its contract asks for ``cross_tp_bitwise``. The message names the two
    layouts, the output, the rows that differ and the two values with their bits.
    """
    degrees = _degrees(tp_degrees)
    case = _case(logits, targets, dtype, temperature, real_vocab_size, active_mask)
    sharding = case.contract.sharding
    real, padded = sharding.real_vocab_size, sharding.padded_vocab_size
    run = _runner(op, logits, plain_ok=False)
    layouts = []
    for degree in degrees:
        bounds = even_shard_bounds(padded, degree)
        contract = dataclasses.replace(
            case.contract,
            sharding=ShardingSpec(0, degree, bounds, real, padded),
            reduction=ReductionSpec(DeterminismScope.CROSS_TP_BITWISE),
        )
        layouts.append((degree, list(bounds), case.replace(contract=contract)))
    first_degree, first_bounds, first_case = layouts[0]
    first = run(first_case)
    rows = list(range(case.contract.num_tokens))
    for degree, layout, other in layouts[1:]:
        _compare(
            f"assert_bitwise_across_tp: layouts tp={first_degree} {first_bounds} and "
            f"tp={degree} {layout} give other bits",
            op,
            first,
            run(other),
            (f"tp={first_degree}", f"tp={degree}"),
            [],
            rows,
        )


def _case(
    logits: Any,
    targets: Any,
    dtype: str,
    temperature: float,
    real_vocab_size: int | None,
    active_mask: Any,
) -> LogprobCase:
    full, widths = full_logits(logits, None)
    return build_case(
        full,
        widths,
        targets,
        dtype=dtype,
        temperature=temperature,
        real_vocab_size=real_vocab_size,
        active_mask=active_mask,
        support=None,
        role=LogprobRole.INFER,
        export_entropy=False,
    )


def _degrees(tp_degrees: Sequence[int]) -> list[int]:
    if isinstance(tp_degrees, (str, bytes)) or not isinstance(tp_degrees, Sequence):
        raise LogprobContractError(f"tp_degrees={tp_degrees!r}: expected a sequence of ints")
    degrees = list(tp_degrees)
    if len(degrees) < 2 or any(
        isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in degrees
    ):
        raise LogprobContractError(
            f"tp_degrees={tp_degrees!r}: expected two or more TP degrees, each an int >= 1"
        )
    return degrees


def _rearrangements(n: int) -> list[tuple[str, list[int]]]:
    """Batches made of the rows of an ``n``-row batch, each with a name for the message."""
    every = list(range(n))
    found = [
        ("the batch reversed", every[::-1]),
        ("the batch twice", every + every),
        ("odd rows first", every[1::2] + every[0::2]),
    ]
    found += [(f"row {row} alone", [row]) for row in sorted({0, n // 2, n - 1}) if n > 1]
    return found


def _runner(op: Any, logits: Any, *, plain_ok: bool) -> Callable[[LogprobCase], Named]:
    """Run ``op`` on a case's logits (on the device and in the dtype of the caller's tensor)."""
    import torch

    from tp_logprob.emulate import run_tp
    from tp_logprob.registry import registry

    device = logits.device if is_tensor(logits) else "cpu"
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if not (isinstance(op, str) or callable(op)):
        raise LogprobContractError(f"op={op!r}: expected a backend id or a callable op")
    plain = not isinstance(op, str) and _required_positional(op) == 2
    if plain and not plain_ok:
        raise LogprobContractError(
            f"op={op!r}: takes (logits, targets); across TP degrees the op needs the "
            "project's signature op(local_logits, targets, contract, group=...)"
        )

    def run(case: LogprobCase) -> Named:
        contract = case.contract
        x = torch.from_numpy(np.array(case.logits)).to(device, torch_dtype[contract.dtype.value])
        t = torch.from_numpy(np.array(case.targets)).to(device)
        if plain:
            return _named(op(x, t))
        chosen = registry.get_logprob_op(contract, op).op if isinstance(op, str) else op
        return _named(run_tp(chosen, x, t, contract)[0])

    return run


def _required_positional(function: Callable[..., Any]) -> int:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return -1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in parameters if p.kind in kinds and p.default is p.empty)


def _named(result: Any) -> Named:
    """An op's outputs as ``(name, numpy array)`` pairs: a LogprobResult by its fields, a
    tuple by position, a lone tensor as ``output``."""
    if all(hasattr(result, name) for name in _FIELDS):
        pairs = [(name, getattr(result, name)) for name in _FIELDS]
    elif isinstance(result, tuple):
        pairs = [(f"output {k}", value) for k, value in enumerate(result)]
    else:
        pairs = [("output", result)]
    return [(name, as_numpy(value, name)) for name, value in pairs if value is not None]


def _compare(
    headline: str,
    op: Any,
    first: Named,
    second: Named,
    labels: tuple[str, str],
    context: list[tuple[str, str]],
    rows: list[int],
) -> None:
    """Raise naming the first output whose bits differ: its rows and positions."""
    if [name for name, _ in first] != [name for name, _ in second]:
        raise AssertionError(
            f"{headline}\n  outputs {[n for n, _ in first]} against {[n for n, _ in second]}"
        )
    for (name, a), (_, b) in zip(first, second, strict=True):
        if a.shape != b.shape:
            raise AssertionError(f"{headline}\n  {name}: shape {a.shape} against {b.shape}")
        differ = _differing(a, b)
        if not differ.size:
            continue
        position = int(differ[0])
        row = rows[position]
        shown = [_value(a[position]), _value(b[position])]
        lines = [
            ("op", _op_name(op)),
            *context,
            ("output", name),
            (
                "differ",
                f"rows {_short([rows[p] for p in differ.tolist()])} at positions "
                f"{_short(differ.tolist())} ({differ.size} of {len(rows)})",
            ),
            (labels[0], f"row {row}: {shown[0]}"),
            (labels[1], f"row {row}: {shown[1]}"),
        ]
        width = max(len(label) for label, _ in lines)
        body = "\n".join(f"  {label.ljust(width)}  {text}" for label, text in lines)
        raise AssertionError(f"{headline}\n{body}")


def _differing(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[np.intp]:
    """Positions (first axis) where ``a`` and ``b`` differ in their fp32 bits (or value)."""
    if a.dtype.kind == "f":
        a, b = a.astype(np.float32).view(np.uint32), b.astype(np.float32).view(np.uint32)
    unequal = (a != b).reshape(a.shape[0], -1)
    return np.flatnonzero(unequal.any(axis=1))


def _value(value: Any) -> str:
    array = np.asarray(value)
    if array.ndim == 0 and array.dtype.kind == "f":
        return format_value(array)
    return np.array2string(array, threshold=8)


def _op_name(op: Any) -> str:
    return op if isinstance(op, str) else getattr(op, "__qualname__", repr(op))


def _short(values: list[int]) -> str:
    return str(values) if len(values) <= 16 else f"{values[:16]} ... ({len(values)} in all)"
