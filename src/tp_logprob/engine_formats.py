"""Rollout engines' sampling-mask responses, read as they come: token ids, kept ids, logprobs.

Three formats, each as its source shows it (the versions are the ones read):

* **SGLang** ``/generate`` with ``return_sampling_mask`` (sgl-project/sglang #27408,
  #33593; read in sglang 0.5.23): one JSON object per request (a list for a batch),
  ``output_ids`` the sampled tokens and, in ``meta_info``,
  ``output_token_sampling_mask`` (one list of kept ids per output token, in the
  sampler's weight order, not sorted) and ``output_token_sampling_logprobs`` (one
  float per token, the sampled token's logprob renormalised over the mask; a list
  per token, aligned with its mask, with ``sampling_logprobs_mode="support"``).
  0.5.23 aborts a request whose support exceeds ``--sampling-mask-max-tokens``; the
  truncation flag ``output_token_sampling_mask_truncated`` (#34037, discussed in
  #35765) is not in 0.5.23, so it is honoured when present (a bool, or one per
  token) and not confirmed against a release.
* **vLLM** ``/generate`` (token in, token out) with ``--return-sampling-mask``
  (vllm-project/vllm #49577; read in vllm 0.33.0): ``choices[i].token_ids``,
  ``choices[i].sampling_mask`` (one list of kept ids per token, ascending) and
  ``choices[i].logprobs.content[j].logprob`` (what the server's ``logprobs_mode``
  gives: over the mask only with ``processed_logprobs``).
* **prime-rl** ``SamplingMask(ids, counts)`` (PrimeIntellect-ai/prime-rl #3431): ``ids``
  the kept ids of every token flat, in position order, ``counts`` the kept count
  per token; a count of 0 means no mask at that position.

Rows are sorted here (an engine's order carries no meaning for the set), and
nothing is dropped or rounded: a malformed response raises
:class:`~tp_logprob.errors.LogprobContractError` naming the token position and
the fault (a mask count that is not the number of output tokens, a mask the
engine flags as truncated, a non-integer or out-of-vocabulary id, a repeated id,
a sampled token outside its own mask).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob._validation import check_int, check_int_array
from tp_logprob.errors import LogprobContractError
from tp_logprob.support import SupportSpec, kept_rows_csr

__all__ = [
    "prime_rl_support",
    "sglang_support",
    "vllm_support",
    "ENGINES",
    "EngineRollout",
    "prime_rl_rollout",
    "read_rollouts",
    "sglang_rollout",
    "vllm_rollout",
]

ENGINES = ("sglang", "vllm", "prime_rl")

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, eq=False)
class EngineRollout:
    """One engine response: per output token, the sampled id, its kept ids, its logprob.

    ``support`` has one row per token (sorted global ids; a row without a mask keeps
    nothing and has ``has_mask`` False), ``logprobs`` the engine's logprob of each
    sampled token (NaN where it gave none; None when it gave none at all).
    """

    engine: str
    token_ids: IntArray
    support: SupportSpec
    has_mask: BoolArray
    logprobs: FloatArray | None

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.size)


def sglang_rollout(response: Mapping[str, Any], *, vocab_size: int | None = None) -> EngineRollout:
    """An SGLang ``/generate`` response object (``output_ids`` and ``meta_info``)."""
    where = "sglang response"
    response = _mapping(where, response, "a /generate response")
    meta = _mapping(f"{where}.meta_info", response.get("meta_info"), "return_sampling_mask=True")
    tokens = check_int_array(f"{where}.output_ids", _field(response, "output_ids", where))
    masks = _field(meta, "output_token_sampling_mask", f"{where}.meta_info")
    _truncation(meta.get("output_token_sampling_mask_truncated"), tokens.size, where)
    support = _support(f"{where}.meta_info.output_token_sampling_mask", masks, tokens, vocab_size)
    raw = meta.get("output_token_sampling_logprobs")
    logprobs = None if raw is None else _sglang_logprobs(where, raw, masks, tokens)
    return EngineRollout("sglang", tokens, support, np.ones(tokens.size, dtype=np.bool_), logprobs)


def vllm_rollout(
    response: Mapping[str, Any], *, choice: int = 0, vocab_size: int | None = None
) -> EngineRollout:
    """A vLLM ``/generate`` response (``choices``) or one of its choices."""
    where = "vllm response"
    item: Any = response
    if _is_mapping(response) and "choices" in response:
        choices = response["choices"]
        if not isinstance(choices, Sequence) or not 0 <= choice < len(choices):
            raise LogprobContractError(f"{where}.choices: no choice {choice!r}")
        item, where = choices[choice], f"{where}.choices[{choice}]"
    item = _mapping(where, item, "choice")
    tokens = check_int_array(f"{where}.token_ids", _field(item, "token_ids", where))
    masks = _field(item, "sampling_mask", where)
    if masks is None:
        raise LogprobContractError(
            f"{where}.sampling_mask=None: the server returned no mask (start it with "
            "--return-sampling-mask)"
        )
    support = _support(f"{where}.sampling_mask", masks, tokens, vocab_size)
    logprobs = None
    section = item.get("logprobs")
    if section is not None:
        content = _field(_mapping(where, section, "logprobs"), "content", f"{where}.logprobs")
        logprobs = _vllm_logprobs(f"{where}.logprobs.content", content, tokens)
    return EngineRollout("vllm", tokens, support, np.ones(tokens.size, dtype=np.bool_), logprobs)


def prime_rl_rollout(
    ids: Any,
    counts: Any,
    token_ids: Any,
    *,
    logprobs: Any = None,
    vocab_size: int | None = None,
) -> EngineRollout:
    """prime-rl's ``SamplingMask(ids, counts)`` and the sampled ``token_ids`` (count 0: no mask)."""
    where = "prime_rl sampling_mask"
    flat = check_int_array(f"{where}.ids", ids)
    sizes = check_int_array(f"{where}.counts", counts)
    tokens = check_int_array("token_ids", token_ids)
    if sizes.size != tokens.size:
        raise LogprobContractError(
            f"{where}.counts: {sizes.size} entries for {tokens.size} output tokens (one per token)"
        )
    if sizes.size and sizes.min() < 0:
        position = int(np.flatnonzero(sizes < 0)[0])
        raise LogprobContractError(
            f"{where}.counts[{position}]={int(sizes[position])}: must be >= 0"
        )
    if int(sizes.sum()) != flat.size:
        raise LogprobContractError(
            f"{where}.counts: they sum to {int(sizes.sum())}, but ids holds {flat.size} ids"
        )
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    rows = [flat[offsets[t] : offsets[t + 1]] for t in range(sizes.size)]
    has_mask = sizes > 0
    support = _support(f"{where}.ids", rows, tokens, vocab_size, has_mask=has_mask)
    values = None if logprobs is None else _floats("logprobs", logprobs, tokens.size)
    return EngineRollout("prime_rl", tokens, support, has_mask, values)


def sglang_support(response: Mapping[str, Any], *, vocab_size: int | None = None) -> SupportSpec:
    """The replayed support of an SGLang response (:func:`sglang_rollout`'s checks)."""
    return sglang_rollout(response, vocab_size=vocab_size).support


def vllm_support(
    response: Mapping[str, Any], *, choice: int = 0, vocab_size: int | None = None
) -> SupportSpec:
    """The replayed support of a vLLM response's ``sampling_mask`` (one choice)."""
    return vllm_rollout(response, choice=choice, vocab_size=vocab_size).support


def prime_rl_support(
    ids: Any, counts: Any, token_ids: Any, *, vocab_size: int | None = None
) -> SupportSpec:
    """The replayed support of prime-rl's ``SamplingMask(ids, counts)`` (count 0: no ids)."""
    return prime_rl_rollout(ids, counts, token_ids, vocab_size=vocab_size).support


def read_rollouts(
    document: Any, *, engine: str = "auto", vocab_size: int | None = None
) -> list[EngineRollout]:
    """Every response in a saved engine JSON document: one object, or a batch (a list).

    ``engine`` is ``"sglang"``, ``"vllm"``, ``"prime_rl"`` (an object with ``ids``,
    ``counts``, ``token_ids`` and optionally ``logprobs``) or ``"auto"`` (by the fields).
    """
    if engine not in (*ENGINES, "auto"):
        raise LogprobContractError(f"engine={engine!r}: expected one of {(*ENGINES, 'auto')}")
    items = list(document) if isinstance(document, list) else [document]
    found: list[EngineRollout] = []
    for index, item in enumerate(items):
        kind = engine if engine != "auto" else _detect(item, index)
        if kind == "sglang":
            found.append(sglang_rollout(item, vocab_size=vocab_size))
        elif kind == "prime_rl":
            item = _mapping(f"response {index}", item, "prime_rl sampling mask")
            found.append(
                prime_rl_rollout(
                    _field(item, "ids", "prime_rl"),
                    _field(item, "counts", "prime_rl"),
                    _field(item, "token_ids", "prime_rl"),
                    logprobs=item.get("logprobs"),
                    vocab_size=vocab_size,
                )
            )
        else:
            choices = item.get("choices") if _is_mapping(item) else None
            count = len(choices) if isinstance(choices, Sequence) else 1
            found.extend(vllm_rollout(item, choice=c, vocab_size=vocab_size) for c in range(count))
    return found


def _detect(item: Any, index: int) -> str:
    if _is_mapping(item):
        if "meta_info" in item:
            return "sglang"
        if "choices" in item or "sampling_mask" in item:
            return "vllm"
        if "counts" in item and "ids" in item:
            return "prime_rl"
    raise LogprobContractError(
        f"response {index}: neither SGLang (meta_info), vLLM (choices / sampling_mask) nor "
        "prime-rl (ids, counts); pass engine= to say which"
    )


def _support(
    where: str,
    masks: Any,
    tokens: IntArray,
    vocab_size: int | None,
    *,
    has_mask: BoolArray | None = None,
) -> SupportSpec:
    """The sorted replayed support of ``masks`` (one row per token), checked token by token."""
    if isinstance(masks, (str, bytes)) or not isinstance(masks, (Sequence, np.ndarray)):
        raise LogprobContractError(f"{where}={masks!r}: expected one list of kept ids per token")
    if len(masks) != tokens.size:
        raise LogprobContractError(
            f"{where}: {len(masks)} masks for {tokens.size} output tokens (one per token)"
        )
    if not tokens.size:
        raise LogprobContractError(
            f"{where}: the response has no output tokens (an empty response has nothing to check)"
        )
    if vocab_size is not None:
        check_int("vocab_size", vocab_size, min_value=1)
    outside = (tokens < 0) | (tokens >= vocab_size) if vocab_size is not None else tokens < 0
    if outside.any():
        position = int(np.flatnonzero(outside)[0])
        raise LogprobContractError(
            f"{where}[token {position}]: the sampled token {int(tokens[position])} is outside "
            f"the vocabulary [0, {vocab_size if vocab_size is not None else 'inf'})"
        )
    offsets, flat = kept_rows_csr(where, masks, "token")
    rows = [flat[offsets[t] : offsets[t + 1]] for t in range(tokens.size)]
    for position, row in enumerate(rows):
        if has_mask is not None and not has_mask[position]:
            continue
        if row.size == 0:
            raise LogprobContractError(f"{where}[token {position}]=[]: a sampled token keeps no id")
        outside = (row < 0) | (row >= vocab_size) if vocab_size is not None else row < 0
        if outside.any():
            bad = int(row[outside][0])
            raise LogprobContractError(
                f"{where}[token {position}]: id {bad} is outside the vocabulary "
                f"[0, {vocab_size if vocab_size is not None else 'inf'})"
            )
        ordered = np.sort(row)
        repeated = ordered[1:][np.diff(ordered) == 0]
        if repeated.size:
            raise LogprobContractError(
                f"{where}[token {position}]: id {int(repeated[0])} appears twice in one mask"
            )
        if not np.isin(tokens[position], ordered):
            raise LogprobContractError(
                f"{where}[token {position}]: the sampled token {int(tokens[position])} is not in "
                f"its own mask ({ordered.size} ids); the engine never samples outside it"
            )
        rows[position] = ordered
    sizes = np.array([row.size for row in rows], dtype=np.int64)
    sorted_offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    ids = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    return SupportSpec(kept_offsets=sorted_offsets, kept_ids=ids.astype(np.int64))


def _truncation(flag: Any, num_tokens: int, where: str) -> None:
    """The truncation flag: a bool, or one bool (or 0 / 1) per token; any truncated mask
    is refused."""
    name = f"{where}.meta_info.output_token_sampling_mask_truncated"
    if flag is None or flag is False:
        return
    flags = [flag] if isinstance(flag, bool) else flag
    if isinstance(flags, (str, bytes)) or not isinstance(flags, Sequence):
        raise LogprobContractError(f"{name}={flag!r}: expected a bool or one bool per token")
    if not isinstance(flag, bool) and len(flags) != num_tokens:
        raise LogprobContractError(
            f"{name}: {len(flags)} flags for {num_tokens} output tokens (one per token)"
        )
    for position, value in enumerate(flags):
        if not isinstance(value, (bool, int)) or value not in (0, 1):
            raise LogprobContractError(f"{name}[token {position}]={value!r}: expected a bool")
        if value:
            at = "" if isinstance(flag, bool) else f"[token {position}]"
            raise LogprobContractError(
                f"{name}{at}={value!r}: the engine returned "
                "part of the support only; a truncated mask cannot be replayed"
            )


def _sglang_logprobs(where: str, raw: Any, masks: Any, tokens: IntArray) -> FloatArray:
    name = f"{where}.meta_info.output_token_sampling_logprobs"
    if not isinstance(raw, Sequence) or len(raw) != tokens.size:
        count = len(raw) if isinstance(raw, Sequence) else type(raw).__name__
        raise LogprobContractError(f"{name}: {count} entries for {tokens.size} output tokens")
    values = np.full(tokens.size, math.nan)
    for position, entry in enumerate(raw):
        if isinstance(entry, Sequence):  # support mode: one logprob per mask entry
            mask = list(masks[position])
            if len(entry) != len(mask):
                raise LogprobContractError(
                    f"{name}[token {position}]: {len(entry)} logprobs for a mask of {len(mask)}"
                )
            entry = entry[mask.index(int(tokens[position]))]
        values[position] = _float(f"{name}[token {position}]", entry)
    return values


def _vllm_logprobs(where: str, content: Any, tokens: IntArray) -> FloatArray:
    if not isinstance(content, Sequence) or len(content) != tokens.size:
        count = len(content) if isinstance(content, Sequence) else type(content).__name__
        raise LogprobContractError(f"{where}: {count} entries for {tokens.size} output tokens")
    values = np.full(tokens.size, math.nan)
    for position, entry in enumerate(content):
        entry = _mapping(f"{where}[{position}]", entry, "logprob entry")
        token = entry.get("token_id")
        if token is not None and token != int(tokens[position]):
            raise LogprobContractError(
                f"{where}[token {position}].token_id={token!r}: the sampled token is "
                f"{int(tokens[position])}"
            )
        values[position] = _float(f"{where}[token {position}].logprob", entry.get("logprob"))
    return values


def _floats(name: str, value: Any, count: int) -> FloatArray:
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise LogprobContractError(f"{name}={value!r}: expected one float per token")
    if len(value) != count:
        raise LogprobContractError(f"{name}: {len(value)} entries for {count} output tokens")
    # None: no logprob at that position (a token without a mask has none).
    return np.array(
        [math.nan if v is None else _float(f"{name}[token {i}]", v) for i, v in enumerate(value)]
    )


def _float(name: str, value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise LogprobContractError(f"{name}={value!r}: expected a float logprob")
    number = float(value)
    if math.isnan(number) or number > 0.0:
        raise LogprobContractError(f"{name}={value!r}: a logprob is <= 0 and not NaN")
    return number


def _is_mapping(value: Any) -> bool:
    return isinstance(value, Mapping)


def _mapping(where: str, value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise LogprobContractError(
            f"{where}: expected a JSON object ({what}), got {type(value).__name__}"
        )
    return value


def _field(value: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in value:
        raise LogprobContractError(f"{where}.{key}: missing")
    return value[key]
