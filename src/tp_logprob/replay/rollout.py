"""The rollout check: a trainer's logits against an engine's response, token by token.

For every sampled token it puts three numbers side by side: the **oracle**, the
exact processed logprob over the engine's own mask at the engine's temperature
(:func:`~tp_logprob.oracle.exact_processed_logprob`, correctly rounded); the
**trainer**'s, a registered backend on the trainer's logits (its TP shards, merged
by the backend's own collectives) with the mask replayed at the trainer's
temperature; and the **engine**'s own. Each of trainer and engine is then
explained, not asserted (``docs/rollout-check.md``): within the fp32 bound of
``docs/tolerances.md`` it agrees; otherwise the first hypothesis that reproduces
it within that bound names the cause: the other temperature (``temperature``),
the full vocabulary or the support recomputed from the sampling parameters
(``engine_support``: its logprob is over another support than the mask it
returned). With sampling parameters given, a mask that is not an admissible
support of them (:func:`~tp_logprob.oracle.admissible_support`) is ``support``,
with the tokens it drops or adds. What is left is ``numerics`` (the ulps against
the bound are in the report), or ``unexplained`` past 64 times the bound.

Rows are processed in blocks, so a 4,096-token response at V = 152,064 holds one
float64 block besides the logits.
"""

from __future__ import annotations

import math
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextvars import copy_context
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.contract import (
    DeterminismScope,
    LogprobContract,
    LogprobDType,
    LogprobRole,
    MaskSpec,
    ReductionSpec,
    ShardingSpec,
)
from tp_logprob.engine_formats import EngineRollout
from tp_logprob.errors import LogprobContractError
from tp_logprob.judging.measuring import fp32_ulp
from tp_logprob.oracle import (
    admissible_support,
    classify_support,
    exact_processed_logprob,
    exact_selected_logprob,
    exact_support,
    support_margins,
    tolerance,
)
from tp_logprob.support import SupportSpec

__all__ = ["CAUSES", "RolloutCheck", "check_rollout", "plot_rollout"]

CAUSES = (
    "agree",
    "support",
    "temperature",
    "engine_support",
    "numerics",
    "unexplained",
    "no_mask",
)
"""Every per-token verdict, in the order the overall verdict prefers them."""

UNEXPLAINED_FACTOR = 64.0
BLOCK_VALUES = 1 << 21  # float64 values per block: 16 MiB, a few rows at a 152k vocabulary
TRAINER_BLOCK_VALUES = 1 << 21  # logits per block of the trainer backend: 8 MiB of fp32

Floats = npt.NDArray[np.float64]
_DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}


@dataclass(frozen=True)
class RolloutCheck:
    """Per token: the three logprobs, their errors in fp32 ulps, the bound (absolute and in
    ulps), the causes found for the trainer and the engine, and the verdict with its reason."""

    engine: str
    token_ids: npt.NDArray[np.int64]
    oracle: Floats
    trainer: Floats
    engine_logprob: Floats
    bound: Floats
    bound_ulp: Floats
    trainer_ulp: Floats
    engine_ulp: Floats
    trainer_cause: list[str]
    engine_cause: list[str]
    verdict: list[str]
    details: list[str]
    settings: dict[str, Any] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        found = Counter(self.verdict)
        return {cause: found[cause] for cause in CAUSES if found[cause]}

    def log_ratio(self) -> dict[str, Floats]:
        """``log p_x - log p_oracle`` of the trainer and the engine (finite tokens only)."""
        found = {}
        for name, values in (("trainer", self.trainer), ("engine", self.engine_logprob)):
            with np.errstate(invalid="ignore"):
                ratio = values - self.oracle
            found[name] = ratio[np.isfinite(ratio)]
        return found

    def worst(self, count: int = 10) -> list[dict[str, Any]]:
        """The mismatched tokens first, then those whose larger error / bound is worst."""
        with np.errstate(invalid="ignore", divide="ignore"):
            used = np.fmax(self.trainer_ulp, self.engine_ulp) / self.bound_ulp
        used = np.where(np.isnan(used), -1.0, used)
        mismatch = np.array([v not in ("agree", "no_mask") for v in self.verdict], dtype=bool)
        order = np.lexsort((-used, ~mismatch))[:count]
        return [self._row(int(t)) for t in order if mismatch[t] or used[t] >= 0]

    def _row(self, t: int) -> dict[str, Any]:
        return {
            "token": t,
            "token_id": int(self.token_ids[t]),
            "oracle": float(self.oracle[t]),
            "trainer": float(self.trainer[t]),
            "engine": float(self.engine_logprob[t]),
            "trainer_ulp": float(self.trainer_ulp[t]),
            "engine_ulp": float(self.engine_ulp[t]),
            "bound_ulp": float(self.bound_ulp[t]),
            "verdict": self.verdict[t],
            "detail": self.details[t],
        }

    def histogram(self, bins: int = 12) -> dict[str, list[tuple[float, float, int]]]:
        """Counts of ``|log-ratio|`` per decade, ``(low, high, count)``; 0 is its own bin."""
        found = {}
        for name, ratio in self.log_ratio().items():
            size = np.abs(ratio)
            rows = [(0.0, 0.0, int(np.count_nonzero(size == 0)))]
            for k in range(bins):
                low, high = 10.0 ** (k - bins + 1 - 1), 10.0 ** (k - bins + 1)
                inside = (size > low) & (size <= high) if k else (size > 0) & (size <= high)
                rows.append((0.0 if not k else low, high, int(np.count_nonzero(inside))))
            rows.append((10.0**0, math.inf, int(np.count_nonzero(size > 1.0))))
            found[name] = rows
        return found

    def failed(self) -> bool:
        return any(v not in ("agree", "no_mask") for v in self.verdict)

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = _strict(
            {
                "engine": self.engine,
                "tokens": int(self.token_ids.size),
                "settings": self.settings,
                "verdicts": self.counts(),
                "worst": self.worst(),
                "histogram": {k: [list(r) for r in v] for k, v in self.histogram().items()},
                "per_token": [self._row(t) for t in range(self.token_ids.size)],
            }
        )
        return document

    def markdown(self, shown: int = 10) -> str:
        lines = [
            f"Rollout check: {self.engine} response, {self.token_ids.size} tokens "
            f"({', '.join(f'{k}={v!r}' for k, v in self.settings.items())})",
            "",
            "| verdict | tokens |",
            "|---|---|",
            *(f"| {cause} | {count} |" for cause, count in self.counts().items()),
            "",
            f"Worst {shown} tokens by error / bound:",
            "",
            "| token | id | oracle | trainer | engine | trainer ulp | engine ulp | bound ulp "
            "| verdict | why |",
            "|" + "---|" * 10,
        ]
        for row in self.worst(shown):
            lines.append(
                f"| {row['token']} | {row['token_id']} | {row['oracle']!r} | {row['trainer']!r} "
                f"| {row['engine']!r} | {row['trainer_ulp']:.3g} | {row['engine_ulp']:.3g} "
                f"| {row['bound_ulp']:.3g} | {row['verdict']} | {row['detail']} |"
            )
        lines += ["", "|log-ratio| against the oracle (tokens per bin):", ""]
        for name, rows in self.histogram().items():
            cells = ", ".join(f"<={high:.0e}: {count}" for low, high, count in rows[1:-1] if count)
            lines.append(
                f"- {name}: exact {rows[0][2]}, {cells or 'none inexact'}, >1: {rows[-1][2]}"
            )
        return "\n".join(lines)


def check_rollout(
    logits: Any,
    rollout: EngineRollout,
    *,
    engine_temperature: float = 1.0,
    trainer_temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    real_vocab_size: int | None = None,
    backend: str = "torch_native",
    group: Any = None,
) -> RolloutCheck:
    """Check ``rollout`` against the trainer's ``logits``: a ``[N, V]`` tensor, or one shard
    per TP rank (a list, in rank order), or, with ``group``, this rank's shard on the real
    group (every rank calls it; each gets the same check).

    ``top_k`` / ``top_p`` / ``min_p`` are the engine's sampling parameters, when known:
    they let the check test the mask itself and the recomputed-support hypothesis.
    """
    import torch

    shards = list(logits) if isinstance(logits, (list, tuple)) else [logits]
    if group is not None and len(shards) != 1:
        raise LogprobContractError("logits: on a real group pass this rank's shard alone")
    for rank, shard in enumerate(shards):
        if not isinstance(shard, torch.Tensor) or shard.dim() != 2:
            raise LogprobContractError(f"logits[{rank}]: expected a 2-D tensor [N, shard width]")
        if shard.shape[0] != rollout.num_tokens:
            raise LogprobContractError(
                f"logits[{rank}]: {shard.shape[0]} rows for {rollout.num_tokens} response tokens"
            )
    dtype = _DTYPES.get(str(shards[0].dtype))
    if dtype is None or any(s.dtype != shards[0].dtype for s in shards):
        raise LogprobContractError(
            f"logits: dtype {shards[0].dtype}, expected one of fp32/bf16/fp16"
        )
    trainer_t = engine_temperature if trainer_temperature is None else trainer_temperature
    contract, columns = _trainer_contract(shards, rollout, dtype, trainer_t, real_vocab_size, group)
    rv = contract.sharding.real_vocab_size
    params: dict[str, Any] = {"top_k": top_k, "top_p": top_p, "min_p": min_p}
    has_params = any(v is not None for v in params.values())
    n = rollout.num_tokens
    alternatives: dict[str, Floats] = {}
    engine = (
        np.full(n, math.nan) if rollout.logprobs is None else rollout.logprobs.astype(np.float64)
    )
    tp = contract.sharding.tp_world_size
    tol = tolerance(dtype, rv, num_shards=tp)
    margins = support_margins(dtype, rv, num_shards=tp)
    rows_per_block = max(1, BLOCK_VALUES // max(contract.sharding.padded_vocab_size, 1))
    targets = rollout.token_ids
    active = rollout.has_mask
    hypotheses = _hypotheses(engine_temperature, trainer_t, has_params)
    for name in hypotheses:
        alternatives[name] = np.full(n, math.nan)
    with ThreadPoolExecutor(max_workers=1) as pool:
        # The masks are judged (numpy, one thread) while the backend runs (its ranks' threads).
        screening = None
        if has_params:
            context = copy_context()  # the caller's oracle settings (slow_path_only)
            screening = pool.submit(
                lambda: context.run(
                    _screen_masks, columns, rollout, margins, rv, engine_temperature, params,
                    rows_per_block,
                )
            )  # fmt: skip
        trainer = _trainer_logprobs(
            columns if group is None else shards[0], rollout, contract, backend, group
        )
        # Over a replayed mask the oracle needs the kept columns only: every other column
        # counts as -inf, so the kept values, padded with -inf, give the same correctly
        # rounded result.
        kept, local = _kept_values(columns, rollout)
        oracle, support_lse = exact_selected_logprob(
            kept, local, active_mask=active, temperature=engine_temperature
        )
        problems = {} if screening is None else screening.result()
    with np.errstate(invalid="ignore", over="ignore"):
        scale = np.fmax(np.abs(oracle), np.abs(support_lse))
        ulp = fp32_ulp(scale)
        bound = tol.selected_bound(oracle, support_lse)
        bound_ulp = np.where(ulp > 0, bound / ulp, math.inf)
        off = (np.abs(trainer - oracle) > bound) | (np.abs(engine - oracle) > bound)
    # The hypotheses run on the tokens that need one only.
    suspects = np.flatnonzero(active & off)
    for start in range(0, suspects.size, rows_per_block):
        rows = suspects[start : start + rows_per_block]
        x = _rows(columns, torch.as_tensor(rows)).to(torch.float32).numpy().astype(np.float64)
        mask = _dense(rollout, rows, x.shape[1])
        for name, (temperature, kind) in hypotheses.items():
            if kind == "mask":
                alt, _ = exact_selected_logprob(kept[rows], local[rows], temperature=temperature)
                alternatives[name][rows] = alt
                continue
            if kind == "full":
                alt_mask = np.zeros_like(mask)
                alt_mask[:, :rv] = True
            else:
                found = exact_support(x, real_vocab_size=rv, temperature=temperature, **params)
                alt_mask = found.mask
            alt, _, _ = exact_processed_logprob(
                x, targets[rows], alt_mask, real_vocab_size=rv, temperature=temperature
            )
            alternatives[name][rows] = alt
    trainer_cause, trainer_ulp, trainer_why = _explain(
        trainer, oracle, bound, ulp, alternatives, active
    )
    engine_cause, engine_ulp, engine_why = _explain(
        engine, oracle, bound, ulp, alternatives, active
    )
    verdict, details = [], []
    for t in range(n):
        if not active[t]:
            verdict.append("no_mask")
            details.append("no mask at this position")
            continue
        if t in problems:
            verdict.append("support")
            details.append(problems[t])
            continue
        pick = min(
            (engine_cause[t], f"engine: {engine_why[t]}"),
            (trainer_cause[t], f"trainer: {trainer_why[t]}"),
            key=lambda item: _rank(item[0]),
        )
        verdict.append(pick[0])
        details.append("" if pick[0] == "agree" else pick[1])
    settings = {
        "engine_temperature": engine_temperature,
        "trainer_temperature": trainer_t,
        "backend": backend,
        "tp": contract.sharding.tp_world_size,
        "vocab": rv,
        "dtype": dtype,
        **{k: v for k, v in params.items() if v is not None},
    }
    return RolloutCheck(
        rollout.engine, targets, oracle, trainer, engine, bound, bound_ulp, trainer_ulp, engine_ulp,
        trainer_cause, engine_cause, verdict, details, settings,
    )  # fmt: skip


def _rank(cause: str) -> int:
    """Lower is reported first: a named cause before numerics, numerics before agreement."""
    order = ("temperature", "engine_support", "unexplained", "numerics", "agree", "no_mask")
    return order.index(cause)


def _hypotheses(
    engine_t: float, trainer_t: float, has_params: bool
) -> dict[str, tuple[float, str]]:
    """The alternatives a mismatch is tested against: ``name -> (temperature, support)``."""
    found: dict[str, tuple[float, str]] = {}
    for temperature in dict.fromkeys((trainer_t, 1.0)):
        if temperature != engine_t:
            found[f"temperature={temperature!r}"] = (temperature, "mask")
    found["engine_support=full vocabulary"] = (engine_t, "full")
    if has_params:
        found["engine_support=recomputed support"] = (engine_t, "recomputed")
    return found


def _explain(
    values: Floats,
    oracle: Floats,
    bound: Floats,
    ulp: Floats,
    alternatives: dict[str, Floats],
    active: npt.NDArray[np.bool_],
) -> tuple[list[str], Floats, list[str]]:
    """Per token: cause, error in ulps, and why (the hypothesis that reproduces ``values``)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        error = np.abs(values - oracle)
        same = (values == oracle) | (np.isnan(values) & np.isnan(oracle))
        error = np.where(same, 0.0, error)
        error_ulp = np.where(ulp > 0, error / ulp, np.where(error == 0, 0.0, math.inf))
        error_ulp = np.where(np.isnan(values), math.nan, error_ulp)
    causes, why = [], []
    for t in range(values.size):
        if not active[t] or np.isnan(values[t]):
            causes.append("agree" if active[t] else "no_mask")
            why.append("no logprob given" if active[t] else "")
            continue
        if error[t] <= bound[t]:
            causes.append("agree")
            why.append("")
            continue
        for name, alt in alternatives.items():
            if abs(values[t] - alt[t]) <= bound[t] or values[t] == alt[t]:
                cause, _, what = name.partition("=")
                causes.append(cause)
                why.append(f"matches the oracle at {what}" if cause == "temperature" else
                           f"its logprob is over the {what}, not the mask")  # fmt: skip
                break
        else:
            big = error[t] > UNEXPLAINED_FACTOR * bound[t]
            causes.append("unexplained" if big else "numerics")
            why.append(f"{error_ulp[t]:.3g} ulp against a bound of {bound[t] / ulp[t]:.3g}")
    return causes, error_ulp, why


def _trainer_contract(
    shards: list[Any],
    rollout: EngineRollout,
    dtype: str,
    temperature: float,
    real_vocab_size: int | None,
    group: Any,
) -> tuple[LogprobContract, list[Any]]:
    """The trainer's contract, and its logits as every rank's shard in rank order (on a real
    group, gathered from the ranks)."""
    import torch

    if group is None:
        widths = [int(s.shape[1]) for s in shards]
        rank, world = 0, len(shards)
        columns = [s.detach() for s in shards]
    else:
        import torch.distributed as dist

        rank, world = dist.get_rank(group), dist.get_world_size(group)
        counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(counts, torch.tensor([shards[0].shape[1]]), group=group)
        widths = [int(c.item()) for c in counts]
        gathered = [torch.empty(shards[0].shape[0], w, dtype=shards[0].dtype) for w in widths]
        dist.all_gather(gathered, shards[0].detach().contiguous(), group=group)
        columns = gathered
    ends = np.cumsum(widths).tolist()
    bounds = tuple(zip([0, *ends[:-1]], ends, strict=True))
    padded = int(sum(widths))
    rv = padded if real_vocab_size is None else real_vocab_size
    contract = LogprobContract(
        role=LogprobRole.INFER,
        dtype=LogprobDType(dtype),
        mask=MaskSpec(rollout.num_tokens, active_mask=rollout.has_mask.tolist()),
        sharding=ShardingSpec(rank, world, bounds, rv, padded),
        reduction=ReductionSpec(DeterminismScope.FIXED_TOPOLOGY),
        temperature=temperature,
        export_lse=False,  # the check reads selected_logp only: no full-vocabulary partial
        support=rollout.support,
    )
    return contract, columns


def _trainer_logprobs(
    logits: Any, rollout: EngineRollout, contract: LogprobContract, backend: str, group: Any
) -> Floats:
    """The backend's processed logprobs: on every emulated rank of ``logits`` (the shards in
    rank order), or on this rank's shard of the real ``group``; each rank calls the backend
    on one block of rows after another (:func:`_blocked`). A CPU backend on a long response
    is slow, so the emulated ranks wait as long as it takes (10 minutes)."""
    import torch

    from tp_logprob.emulate import run_tp
    from tp_logprob.preflight import preflight
    from tp_logprob.registry import registry

    targets = torch.as_tensor(np.where(rollout.has_mask, rollout.token_ids, 0), dtype=torch.int64)
    world = contract.sharding.tp_world_size
    dispatch = registry.get_logprob_op(
        contract, backend, preflighted=group is not None or world > 1
    )
    op = _blocked(dispatch.op, rollout, contract)
    with torch.no_grad():
        if group is None:
            result = run_tp(op, logits, targets, contract, timeout=600.0)[0]
        else:
            preflight(contract, dispatch.capability.backend_id, group)
            result = op(logits, targets, contract, group=group)
    return result.selected_logp.double().numpy()  # type: ignore[no-any-return]


def _blocked(op: Any, rollout: EngineRollout, contract: LogprobContract) -> Any:
    """``op`` on the whole response as a run of calls on blocks of rows, each with its block's
    contract (its rows' active mask and kept ids); the result holds ``selected_logp``.

    A backend's row never depends on the other rows (its reductions run along the row), so
    the blocks' outputs are the bits of one call on every row. A block of a few MiB keeps a
    CPU backend's temporaries in cache: several times faster than one call on the whole
    response, whose every temporary is the size of the logits. The ranks start once; each
    block is one call and its collectives."""
    from tp_logprob.result import LogprobResult

    n = rollout.num_tokens
    step = max(1, TRAINER_BLOCK_VALUES // max(contract.sharding.padded_vocab_size, 1))
    blocks = [
        (
            begin,
            min(n, begin + step),
            _block_contract(contract, rollout, begin, min(n, begin + step)),
        )
        for begin in range(0, max(n, 1), step)
    ]

    def call(logits: Any, targets: Any, rank_contract: LogprobContract, group: Any) -> Any:
        import torch

        rank = rank_contract.sharding.tp_rank
        found = [
            op(logits[begin:end], targets[begin:end], block.with_rank(rank), group=group)
            for begin, end, block in blocks
        ]
        return LogprobResult(torch.cat([r.selected_logp for r in found]), None)

    return call


def _block_contract(
    contract: LogprobContract, rollout: EngineRollout, begin: int, end: int
) -> LogprobContract:
    """``contract`` on rows ``begin:end`` of the response: their active mask and kept ids."""
    if (begin, end) == (0, rollout.num_tokens):
        return contract
    offsets = rollout.support.kept_offsets
    low, high = int(offsets[begin]), int(offsets[end])
    support = SupportSpec(
        kept_offsets=offsets[begin : end + 1] - low, kept_ids=rollout.support.kept_ids[low:high]
    )
    mask = MaskSpec(end - begin, active_mask=rollout.has_mask[begin:end].tolist())
    return replace(contract, mask=mask, support=support)


def _rows(columns: list[Any], index: Any) -> Any:
    """Rows ``index`` of the logits given as shards in rank order, as one ``[rows, V]`` tensor."""
    import torch

    if len(columns) == 1:
        return columns[0][index]
    return torch.cat([part[index] for part in columns], dim=1)


def _kept_values(
    columns: list[Any], rollout: EngineRollout
) -> tuple[Floats, npt.NDArray[np.int64]]:
    """The logits of every row's kept ids, ``[N, max kept]`` float64 padded with -inf, and
    the sampled token's place among them (0 for a row without a mask). Each id is read
    from the shard that holds it."""
    import torch

    counts = rollout.support.kept_counts()
    rows = np.repeat(np.arange(counts.size), counts)
    places = np.arange(rows.size) - np.repeat(rollout.support.kept_offsets[:-1], counts)
    ids = np.array(rollout.support.kept_ids)  # writable: torch refuses read-only arrays
    values = np.empty(ids.size)
    start = 0
    for part in columns:
        inside = (ids >= start) & (ids < start + part.shape[1])
        picked = part[torch.as_tensor(rows[inside]), torch.as_tensor(ids[inside] - start)]
        values[inside] = picked.to(torch.float32).double().numpy()
        start += part.shape[1]
    kept = np.full((counts.size, max(int(counts.max(initial=0)), 1)), -math.inf)
    kept[rows, places] = values
    local = np.zeros(counts.size, dtype=np.int64)
    sampled = ids == rollout.token_ids[rows]
    local[rows[sampled]] = places[sampled]
    return kept, local


def _dense(
    rollout: EngineRollout, rows: npt.NDArray[np.int64], width: int
) -> npt.NDArray[np.bool_]:
    """The engine's mask of ``rows`` as bool ``[len(rows), width]``."""
    offsets = rollout.support.kept_offsets
    mask = np.zeros((rows.size, width), dtype=np.bool_)
    for index, row in enumerate(rows.tolist()):
        mask[index, rollout.support.kept_ids[offsets[row] : offsets[row + 1]]] = True
    return mask


def _screen_masks(
    columns: list[Any],
    rollout: EngineRollout,
    margins: Any,
    rv: int,
    temperature: float,
    params: dict[str, Any],
    rows_per_block: int,
) -> dict[int, str]:
    """:func:`_support_problems` of every block of rows."""
    import torch

    problems: dict[int, str] = {}
    for start in range(0, rollout.num_tokens, rows_per_block):
        end = min(rollout.num_tokens, start + rows_per_block)
        x = _rows(columns, slice(start, end)).to(torch.float32).numpy()
        problems.update(_support_problems(x, rollout, start, margins, rv, temperature, params))
    return problems


def _support_problems(
    x: npt.NDArray[np.float32],
    rollout: EngineRollout,
    begin: int,
    margins: Any,
    rv: int,
    temperature: float,
    params: dict[str, Any],
) -> dict[int, str]:
    """Per active row of rows ``begin:begin + len(x)`` whose mask is not an admissible
    support of ``params``: what differs.

    The rows are screened at once, from their kept ids, for what :func:`admissible_support`
    refuses: a kept column where the support is undefined, on padding or certainly out; a
    certainly-in column not kept (more certainly-in columns than kept ones among them); a
    kept set that is not an upper set of ``z`` (more live columns at or above its least
    value than it keeps). The few rows it flags are explained."""
    c = classify_support(x, margins=margins, real_vocab_size=rv, temperature=temperature, **params)
    count = x.shape[0]
    offsets = rollout.support.kept_offsets
    sizes = np.diff(offsets[begin : begin + count + 1])
    row = np.repeat(np.arange(count), sizes)
    ids = np.asarray(rollout.support.kept_ids[offsets[begin] : offsets[begin + count]])
    values = c.z[row, ids]
    live = ~np.isnan(values)
    lowest = np.full(count, math.inf)
    np.minimum.at(lowest, row[live], values[live])
    with np.errstate(invalid="ignore"):
        reached = (c.z >= lowest[:, None]).sum(axis=1)
    flagged = (
        (~c.defined & (sizes > 0))
        | (np.bincount(row, ~live, minlength=count) > 0)
        | (np.bincount(row, c.certainly_out[row, ids], minlength=count) > 0)
        | (c.certainly_in.sum(axis=1) > np.bincount(row, c.certainly_in[row, ids], minlength=count))
        | (reached > np.bincount(row, live, minlength=count))
    )
    found = {}
    for offset in np.flatnonzero(rollout.has_mask[begin : begin + count] & flagged).tolist():
        mask = _dense(rollout, np.array([begin + offset]), c.z.shape[1])
        missing = np.flatnonzero(c.certainly_in[offset] & ~mask[0])
        extra = np.flatnonzero(c.certainly_out[offset] & mask[0])
        upper = admissible_support(_one_row(c, offset), mask)
        if missing.size or extra.size or upper:
            found[begin + offset] = _support_detail(missing, extra, upper)
    return found


def _one_row(c: Any, row: int) -> Any:
    from tp_logprob.oracle import SupportClassification

    exact = c.exact
    return SupportClassification(
        c.certainly_in[row : row + 1],
        c.certainly_out[row : row + 1],
        c.defined[row : row + 1],
        type(exact)(exact.mask[row : row + 1], exact.threshold[row : row + 1],
                    exact.defined[row : row + 1], exact.size[row : row + 1]),
        c.z[row : row + 1],
    )  # fmt: skip


def _support_detail(missing: Any, extra: Any, upper: list[str]) -> str:
    parts = []
    if missing.size:
        parts.append(f"the mask drops {_ids(missing)}, which the rules keep")
    if extra.size:
        parts.append(f"the mask keeps {_ids(extra)}, which the rules drop")
    if not parts:
        parts.append(upper[0].partition(": ")[2])
    return "; ".join(parts)


def _ids(values: Any, limit: int = 6) -> str:
    shown = ", ".join(str(int(v)) for v in values[:limit])
    more = f" and {values.size - limit} more" if values.size > limit else ""
    return f"token{'s' if values.size > 1 else ''} {shown}{more}"


def _strict(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {key: _strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(item) for item in value]
    return value


def plot_rollout(check: RolloutCheck, path: str) -> None:
    """A PNG histogram of the trainer's and the engine's log-ratio against the oracle."""
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError(
            "--plot needs matplotlib: pip install 'tp-logprob[plot]' (or matplotlib>=3.7)"
        ) from None
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    data = check.log_ratio()
    figure, axes = plt.subplots(1, 2, figsize=(12, 4), squeeze=False)
    for axis, (name, ratio) in zip(axes[0], data.items(), strict=True):
        top = max(float(np.abs(ratio).max(initial=0.0)) * 1.5, 1e-6)
        edges = np.concatenate([-np.geomspace(top, 1e-9, 40), [0.0], np.geomspace(1e-9, top, 40)])
        axis.hist(ratio, bins=edges, color="tab:blue", label=f"{ratio.size} tokens")
        axis.set_xscale("symlog", linthresh=1e-9)
        axis.set_xlabel(f"log p_{name} - log p_oracle (symlog)")
        axis.set_ylabel("tokens")
        axis.set_title(f"{check.engine} response: {name} vs the exact oracle over the mask")
        axis.legend(loc="upper right")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
