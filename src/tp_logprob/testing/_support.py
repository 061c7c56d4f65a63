"""``assert_support_admissible``: an engine's or trainer's kept set under top-k / top-p / min-p.

Min-p and top-p compare masses, and any fp32 computation of them may keep or drop a
token within its rounding error of a boundary. The set is judged as the suite judges
a backend's support (:func:`~tp_logprob.judging.processed.support_margins_of`,
:func:`~tp_logprob.oracle.classify_support`, :func:`~tp_logprob.oracle.admissible_support`):
every certainly-in token kept, no certainly-out token kept, an upper set of ``z``
closed under ties. A failure names the borderline tokens of the row, the ones a
correct fp32 engine may decide either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.contract import LogprobRole
from tp_logprob.errors import LogprobContractError
from tp_logprob.judging.processed import support_margins_of
from tp_logprob.judging.violation import LABEL_WIDTH, PropertyViolation
from tp_logprob.oracle import SupportClassification, admissible_support, classify_support
from tp_logprob.support import SupportSpec
from tp_logprob.testing._arrays import as_numpy, is_tensor
from tp_logprob.testing._case import build_case, full_logits

NAME = "assert_support_admissible"
_SHOWN = 8


def assert_support_admissible(
    kept: Any,
    logits: Any = None,
    *,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    temperature: float = 1.0,
    dtype: str = "fp32",
    real_vocab_size: int | None = None,
    active_mask: Any = None,
    tp_shards: Any = None,
) -> None:
    """Raise ``AssertionError`` unless ``kept`` is a support an fp32 engine within its error
    bound may have sampled from, on every active row.

    ``kept`` is a bool ``[N, V]`` mask (True = kept) or one list of kept token ids per
    row; ``logits`` the ``[N, V]`` logits the rules read (or ``tp_shards``, per rank),
    before temperature. A single row may come as it is: ``[V]`` logits (or ``[V_r]``
    shards) with a ``[V]`` mask or one list of kept ids. The rules are vLLM's order
    (min-p, top-k, top-p, ties at a boundary all kept) on ``z = fp32(x) / fp32(temperature)``.
    The message lists what is wrong (each naming the row, the token and its ``z``) and the
    row's borderline tokens.

    >>> assert_support_admissible([1, 2], [0.0, 2.0, 3.0], top_k=2)
    """
    if _is_one_row(logits, tp_shards):
        kept, logits, tp_shards = _as_batch_of_one(kept, logits, tp_shards)
    full, widths = full_logits(logits, tp_shards)
    rules = SupportSpec(top_k=top_k, top_p=top_p, min_p=min_p)
    case = build_case(
        full,
        widths,
        np.zeros(full.shape[0], dtype=np.int64),
        dtype=dtype,
        temperature=temperature,
        real_vocab_size=real_vocab_size,
        active_mask=active_mask,
        support=rules,
        role=LogprobRole.INFER,
        export_entropy=False,
    )
    mask = _kept_mask(kept, full.shape)
    contract = case.contract
    top_k, top_p, min_p = rules.batch_rules()
    classification = classify_support(
        case.logits,
        margins=support_margins_of(contract),
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        real_vocab_size=contract.sharding.real_vocab_size,
        temperature=contract.batch_temperature,
    )
    problems = admissible_support(classification, mask, active_mask=case.active)
    if not problems:
        return
    rows = np.arange(contract.num_tokens)
    row = next(
        int(r)
        for r in rows
        if admissible_support(classification, mask, active_mask=case.active & (rows == r))
    )
    lines = [
        ("logits", f"{list(full.shape)} {contract.dtype.value}, T={contract.batch_temperature!r}"),
        *(("problem", problem) for problem in problems[:5]),
        *_row_lines(classification, mask, row),
    ]
    report = "\n".join(f"  {label.ljust(LABEL_WIDTH)}  {text}" for label, text in lines)
    raise PropertyViolation(f"{NAME}: the kept set is not admissible under {rules.rules()}", report)


def _ndim(value: Any) -> int:
    """How many dimensions an array, a tensor or nested lists have (without converting);
    ragged lists (one list of kept ids per row) count as 2-D."""
    if hasattr(value, "ndim"):
        return int(value.ndim)
    try:
        return int(np.ndim(value))
    except ValueError:
        return 2


def _is_one_row(logits: Any, tp_shards: Any) -> bool:
    """Whether the logits are one ``[V]`` row (or ``tp_shards`` one ``[V_r]`` row each)."""
    if tp_shards is None:
        return logits is not None and _ndim(logits) == 1
    shards = tp_shards if isinstance(tp_shards, Sequence) else ()
    return bool(shards) and all(_ndim(shard) == 1 for shard in shards)


def _as_batch_of_one(kept: Any, logits: Any, tp_shards: Any) -> tuple[Any, Any, Any]:
    """One row's ``kept``, ``logits`` and ``tp_shards`` as a batch of one row."""
    if _ndim(kept) != 1:
        raise LogprobContractError(
            f"kept: {_ndim(kept)}-D with a single [V] row of logits; pass that row's [V] mask "
            "or its list of kept ids"
        )
    if tp_shards is not None:
        return _one_row(kept), None, [_one_row(shard) for shard in tp_shards]
    return _one_row(kept), _one_row(logits), None


def _one_row(row: Any) -> Any:
    """A ``[V]`` array, tensor or list as ``[1, V]``."""
    return [row] if isinstance(row, Sequence) else row[None]


def _kept_mask(kept: Any, shape: tuple[int, int]) -> npt.NDArray[np.bool_]:
    """``kept`` as a bool ``[N, V]`` mask: a mask as it is, kept-id lists spread out."""
    rows, width = shape
    lists = (
        not is_tensor(kept)
        and not isinstance(kept, np.ndarray)
        and isinstance(kept, Sequence)
        and not any(isinstance(v, (bool, np.bool_)) for row in kept for v in list(row)[:1])
    )
    if lists:
        spec = SupportSpec.from_kept_lists(kept)
        if spec.num_rows != rows:
            raise LogprobContractError(
                f"kept: {spec.num_rows} rows of kept ids, the logits have {rows}"
            )
        if spec.kept_ids.size and int(spec.kept_ids.max()) >= width:
            raise LogprobContractError(
                f"kept: token id {int(spec.kept_ids.max())} is past the logits' {width} columns"
            )
        return spec.dense(width)
    mask = as_numpy(kept, "kept")
    if mask.dtype != np.bool_ or mask.shape != shape:
        raise LogprobContractError(
            f"kept: {mask.dtype} {mask.shape}, expected a bool {shape} mask (True = kept) or "
            "one list of kept token ids per row"
        )
    return np.asarray(mask, dtype=np.bool_)


def _row_lines(
    classification: SupportClassification,
    mask: npt.NDArray[np.bool_],
    row: int,
) -> list[tuple[str, str]]:
    """The first wrong row: what was kept, what the exact rules keep, and its borderline
    tokens (id and ``z``)."""
    exact = classification.exact
    z = classification.z[row]
    border = np.flatnonzero(classification.borderline[row])
    shown = ", ".join(f"{int(v)} (z={float(z[v])!r})" for v in border[:_SHOWN])
    more = f", and {border.size - _SHOWN} more" if border.size > _SHOWN else ""
    return [
        ("row", f"{row}: kept |S| = {int(mask[row].sum())}, ids {_ids(mask[row])}"),
        (
            "exact",
            f"the exact rules keep |S| = {int(exact.size[row])}, ids "
            f"{_ids(exact.mask[row])} (z >= {float(exact.threshold[row])!r})",
        ),
        (
            "border",
            f"{border.size} borderline tokens (a correct fp32 engine may keep or drop them): "
            f"{shown or 'none'}{more}",
        ),
    ]


def _ids(kept: npt.NDArray[np.bool_]) -> str:
    ids: list[Any] = np.flatnonzero(kept).tolist()
    return str(ids if len(ids) <= _SHOWN else [*ids[:_SHOWN], "..."])
