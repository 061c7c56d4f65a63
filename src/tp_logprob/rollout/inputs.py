"""The rollout check's inputs, read and checked before any work: the response, the logits,
the options and where the outputs go.

Every fault raises :class:`RolloutInputError`, which names the side at fault (the
engine's response, the trainer's logits, an option, an output), the file, and
the field and position: ``engine response (r.json): meta_info.output_ids[token 3]=...``.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.engine_formats import EngineRollout, read_rollouts
from tp_logprob.errors import LogprobContractError
from tp_logprob.support import SupportSpec

__all__ = [
    "RolloutInputError",
    "check_logits",
    "check_noise_model",
    "check_options",
    "check_outputs",
    "join_rollouts",
    "load_logits",
    "load_response",
]

DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}

ENGINE = "engine response"
TRAINER = "trainer logits"
OPTION = "option"
OUTPUT = "output"


class RolloutInputError(LogprobContractError):
    """A bad input to the rollout check: ``side`` (who is at fault), ``file`` (or None) and
    what is wrong, field and position first."""

    def __init__(self, side: str, file: str | None, problem: str) -> None:
        self.side, self.file, self.problem = side, file, problem
        where = side if file is None else f"{side} ({file})"
        super().__init__(f"{where}: {problem}")


def load_response(path: str, engine: str) -> list[EngineRollout]:
    """Every response in the saved engine JSON at ``path`` (ids checked against the
    vocabulary later, by :func:`check_logits`)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise RolloutInputError(ENGINE, path, f"cannot be read: {error}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise RolloutInputError(
            ENGINE, path, f"not JSON: {error.msg} at line {error.lineno} column {error.colno}"
        ) from None
    try:
        return read_rollouts(document, engine=engine)
    except LogprobContractError as error:
        raise RolloutInputError(ENGINE, path, str(error)) from None


def load_logits(paths: Sequence[str]) -> list[Any]:
    """The trainer's logits: one tensor per file (one per TP rank, in rank order)."""
    import torch

    found = []
    for path in paths:
        try:
            value = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise RolloutInputError(TRAINER, path, "no such file") from None
        except Exception as error:  # torch.load raises many kinds on a file it did not write
            raise RolloutInputError(
                TRAINER, path,
                f"not a tensor saved with torch.save ({type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else ''})",
            ) from None  # fmt: skip
        if not isinstance(value, torch.Tensor):
            raise RolloutInputError(
                TRAINER, path,
                f"holds a {type(value).__name__}, expected the logits tensor [N, V] "
                "(torch.save(logits), not a dict or a state dict)",
            )  # fmt: skip
        found.append(value)
    return found


def check_options(
    temperature: float,
    trainer_temperature: float | None,
    params: dict[str, Any],
    logit_noise: float | None,
    clip: float,
) -> None:
    """The options, each named as the command line spells it."""
    _positive("--engine-temperature", temperature)
    if trainer_temperature is not None:
        _positive("--temperature", trainer_temperature)
    top_k, top_p, min_p = params["top_k"], params["top_p"], params["min_p"]
    if top_k is not None and (
        isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1
    ):
        raise RolloutInputError(OPTION, None, f"--top-k={top_k!r}: expected an int >= 1")
    if top_p is not None and not (_real(top_p) and 0.0 < top_p <= 1.0):
        raise RolloutInputError(OPTION, None, f"--top-p={top_p!r}: expected 0 < top_p <= 1")
    if min_p is not None and not (_real(min_p) and 0.0 <= min_p < 1.0):
        raise RolloutInputError(OPTION, None, f"--min-p={min_p!r}: expected 0 <= min_p < 1")
    if logit_noise is not None and not (_real(logit_noise) and logit_noise >= 0.0):
        raise RolloutInputError(
            OPTION, None, f"--logit-noise={logit_noise!r}: expected a finite size >= 0"
        )
    if not (_real(clip) and 0.0 < clip < 1.0):
        raise RolloutInputError(OPTION, None, f"--clip={clip!r}: expected 0 < clip < 1")


def check_noise_model(model: Any, logit_noise: float | None) -> tuple[float, float]:
    """``--logit-noise-model A B``: the per-token noise ``a + b m_t``, both finite and >= 0
    (and not with ``--logit-noise``, a constant)."""
    if logit_noise is not None:
        raise RolloutInputError(
            OPTION, None, "--logit-noise and --logit-noise-model: give one noise, not both"
        )
    if not (
        isinstance(model, (tuple, list))
        and len(model) == 2
        and all(_real(v) and v >= 0.0 for v in model)
    ):
        raise RolloutInputError(
            OPTION, None, f"--logit-noise-model={model!r}: expected two finite sizes a b >= 0"
        )
    return float(model[0]), float(model[1])


def _real(value: Any) -> bool:
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def _positive(name: str, value: Any) -> None:
    if not (_real(value) and value > 0.0):
        raise RolloutInputError(OPTION, None, f"{name}={value!r}: expected a finite T > 0")


def check_outputs(*paths: str | None) -> None:
    """Each output's folder exists, before any work."""
    for path in paths:
        if path is None:
            continue
        folder = Path(path).parent
        if not folder.is_dir():
            raise RolloutInputError(OUTPUT, path, f"the folder {str(folder)!r} does not exist")


def join_rollouts(
    rollouts: Sequence[EngineRollout],
) -> tuple[EngineRollout, npt.NDArray[np.int64]]:
    """The responses as one run of tokens, and each token's response index."""
    if not rollouts:
        raise RolloutInputError(ENGINE, None, "no response to check")
    for index, rollout in enumerate(rollouts):
        if rollout.num_tokens == 0:
            raise RolloutInputError(ENGINE, None, f"response {index}: no output tokens")
        if not rollout.has_mask.any():
            raise RolloutInputError(
                ENGINE, None,
                f"response {index}: no token has a mask (every count is 0): nothing to check",
            )  # fmt: skip
    owner = np.repeat(np.arange(len(rollouts)), [r.num_tokens for r in rollouts])
    if len(rollouts) == 1:
        return rollouts[0], owner.astype(np.int64)
    offsets = [np.asarray(r.support.kept_offsets) for r in rollouts]
    shifts = np.cumsum([0, *[int(o[-1]) for o in offsets[:-1]]])
    kept_offsets = np.concatenate(
        [[0], *[o[1:] + s for o, s in zip(offsets, shifts, strict=True)]]
    ).astype(np.int64)
    support = SupportSpec(
        kept_offsets=kept_offsets,
        kept_ids=np.concatenate([np.asarray(r.support.kept_ids) for r in rollouts]),
    )
    given = [r.logprobs for r in rollouts]
    logprobs = (
        None
        if all(v is None for v in given)
        else np.concatenate(
            [
                np.full(r.num_tokens, math.nan) if v is None else v
                for r, v in zip(rollouts, given, strict=True)
            ]
        )
    )
    joined = EngineRollout(
        rollouts[0].engine,
        np.concatenate([r.token_ids for r in rollouts]),
        support,
        np.concatenate([r.has_mask for r in rollouts]),
        logprobs,
    )
    return joined, owner.astype(np.int64)


def check_logits(
    shards: list[Any],
    rollout: EngineRollout,
    real_vocab_size: int | None,
    group: Any,
    files: Sequence[str] | None = None,
) -> str:
    """The logits against the response: 2-D float shards, one row per token, every value
    finite or -inf, every id inside; the dtype's name. A fault names ``files[i]`` when
    given, else ``logits[i]``."""
    import torch

    if group is not None and len(shards) != 1:
        raise RolloutInputError(TRAINER, None, "on a real group pass this rank's shard alone")
    if real_vocab_size is not None and (
        isinstance(real_vocab_size, bool)
        or not isinstance(real_vocab_size, numbers.Integral)
        or real_vocab_size < 1
    ):
        raise RolloutInputError(OPTION, None, f"--vocab={real_vocab_size!r}: expected an int >= 1")
    for rank, shard in enumerate(shards):
        file = None if files is None else files[rank]
        where = "logits" if file is not None else f"logits[{rank}]"
        if not isinstance(shard, torch.Tensor) or shard.dim() != 2:
            shape = tuple(shard.shape) if isinstance(shard, torch.Tensor) else type(shard).__name__
            raise RolloutInputError(
                TRAINER, file, f"{where}: {shape}, expected a 2-D tensor [N, shard width]"
            )
        if str(shard.dtype) not in DTYPES or shard.dtype != shards[0].dtype:
            raise RolloutInputError(
                TRAINER, file,
                f"{where}: dtype {shard.dtype}, expected one of fp32/bf16/fp16, alike on every "
                "shard",
            )  # fmt: skip
        if shard.shape[0] != rollout.num_tokens:
            raise RolloutInputError(
                TRAINER, file,
                f"{where}: {shard.shape[0]} rows for {rollout.num_tokens} response tokens",
            )  # fmt: skip
        _finite_or_minus_inf(where, shard, file)
    if group is not None:
        return DTYPES[str(shards[0].dtype)]
    width = sum(int(s.shape[1]) for s in shards)
    if real_vocab_size is not None and real_vocab_size > width:
        raise RolloutInputError(
            TRAINER, None,
            f"the {len(shards)} shard(s) hold {width} columns, fewer than "
            f"--vocab={real_vocab_size}: a TP shard missing?",
        )  # fmt: skip
    _ids_inside(rollout, real_vocab_size, width, len(shards))
    return DTYPES[str(shards[0].dtype)]


def _finite_or_minus_inf(where: str, shard: Any, file: str | None) -> None:
    """NaN and +inf are refused (one reduction finds either); -inf is a masked logit."""
    import torch

    if not shard.numel():
        return
    # The largest value is NaN if any is (numpy's max on fp32 is several times torch's speed).
    top = float(shard.max()) if shard.dtype != torch.float32 else float(shard.numpy().max())
    if math.isfinite(top) or top == -math.inf:
        return
    bad = torch.isnan(shard) | (shard == math.inf)
    row, column = (int(v) for v in torch.nonzero(bad)[0])
    raise RolloutInputError(
        TRAINER, file,
        f"{where}[{row}, {column}]={float(shard[row, column])!r}: a logit is finite or -inf",
    )  # fmt: skip


def _ids_inside(rollout: EngineRollout, vocab: int | None, width: int, files: int) -> None:
    """Every sampled and kept id below the vocabulary: past ``--vocab`` the response is at
    fault; past the logits' width only, the logits (a shard missing)."""
    limit = width if vocab is None else vocab
    ids = np.asarray(rollout.support.kept_ids)
    rows = np.repeat(np.arange(rollout.num_tokens), rollout.support.kept_counts())
    for what, values, positions in (
        ("output token", rollout.token_ids, np.arange(rollout.num_tokens)),
        ("mask id", ids, rows),
    ):
        outside = np.flatnonzero(values >= limit)
        if not outside.size:
            continue
        first = int(outside[0])
        bad, position = int(values[first]), int(positions[first])
        if vocab is None:
            raise RolloutInputError(
                f"{ENGINE} or {TRAINER}", None,
                f"{what} {bad} at token {position} is past the logits' {width} columns "
                f"({files} file(s)): a TP shard missing, or a response from another model; "
                "pass --vocab to say which",
            )  # fmt: skip
        raise RolloutInputError(
            ENGINE, None,
            f"{what} {bad} at token {position} is outside the vocabulary [0, {vocab})",
        )  # fmt: skip
