"""Strategies for sampling supports: parameters that stress the rules, and replayed masks.

:func:`supports` draws a :class:`~tp_logprob.SupportSpec` for a contract: sampling
parameters (top-k, top-p, min-p, alone or together, or every rule off) or a
replayed mask of kept ids. Given the logits, the parameters aim at the places the
rules are hard to get right (``docs/semantics.md``, "Processed logprobs"): a
``top_k`` whose k-th value is the first of several tied tokens, a ``top_p`` equal to
(or one ulp around) the mass strictly above some token, relative to the survivors of
the min-p and top-k drawn with it (the distribution top-p renormalises over), a
``min_p`` equal to (or one ulp around) some token's ``exp(z - M)``. Where a row has
a tie (the ``ties_at_max`` and ``ties_inside`` rows of
:func:`~tp_logprob.strategies.logits`, the latter across a shard edge), the boundary
is usually on it: a rule that cuts a tie by position, as a sort does, goes wrong
only there. Those values are computed in float64 here; the exact decision at such a
boundary is the oracle's business, and a backend may take either side of a
borderline token.

Replayed masks keep a random subset of each row's live columns (all of them, a
single token, or the row's largest values), never empty for an active row.
Everything shrinks toward every rule off (``top_p=1``) and toward keeping every
live column.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from tp_logprob.contract import LogprobContract
from tp_logprob.support import SupportMode, SupportSpec

__all__ = ["PARAM_KINDS", "REPLAYED_ROW_KINDS", "RULES", "supports"]

PARAM_KINDS = (
    "all_off",
    "top_k",
    "top_p",
    "min_p",
    "top_k_top_p",
    "min_p_top_k",
    "min_p_top_p",
    "all_rules",
)
"""Which sampling rules a drawn support turns on (``all_off`` is ``top_p=1``)."""

RULES = ("min_p", "top_k", "top_p")
"""The sampling rules, in the order they apply (vLLM's: min-p, top-k, top-p)."""

REPLAYED_ROW_KINDS = ("every_live", "single", "random_subset", "largest", "empty_inactive")
"""How a replayed mask's row is drawn: every live column, one token, a random
subset, the row's largest values (what an engine's top-k keeps), or nothing (for an
inactive row only)."""

_AT_A_BOUNDARY = (False, True, True)
"""Whether a rule's value sits at a boundary of the logits (two times in three; shrinks to a
plain value)."""
_ON_A_TIE = (False, True, True, True)
"""Whether a boundary sits on a tied value, where some row has one (three times in four)."""

_TOP_P_VALUES = (0.5, 0.8, 0.9, 0.95, 0.99)
_MIN_P_VALUES = (0.01, 0.05, 0.1, 0.5, 1.0)


def _tempered(contract: LogprobContract, logits: npt.NDArray[np.float32]) -> npt.NDArray[Any]:
    """``z = fp32(x) / fp32(T)`` over the live columns, as float64."""
    live = np.asarray(logits[:, : contract.sharding.real_vocab_size], dtype=np.float32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        z = live / np.float32(contract.temperature_fp32)
    return np.asarray(z, dtype=np.float64)


def _defined_rows(z: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    """Rows whose support is defined: no NaN, no +inf, a finite value."""
    with np.errstate(invalid="ignore"):
        ok = ~np.isnan(z).any(axis=1) & ~np.isposinf(z).any(axis=1) & np.isfinite(z).any(axis=1)
    return np.flatnonzero(ok)


def _near(value: float, shift: int) -> float:
    """``value`` (in ``[0, 1]``) moved by ``shift`` float64 ulps, clamped to ``[0, 1]``.

    Stepping the bit pattern of a non-negative double moves it by one ulp per step.
    """
    bits = int(np.float64(value).view(np.int64)) + shift
    moved = float(np.int64(max(bits, 0)).view(np.float64))
    return min(max(moved, 0.0), 1.0)


def _survivors(values: npt.NDArray[Any], earlier: dict[str, Any]) -> npt.NDArray[Any]:
    """The finite ``values`` of a row that min-p and top-k (those ``earlier`` holds) keep, in
    float64: what top-p renormalises over."""
    kept = values
    min_p, top_k = earlier.get("min_p"), earlier.get("top_k")
    if min_p is not None:
        with np.errstate(under="ignore"):
            kept = kept[np.exp(kept - kept.max()) >= min_p]
    if top_k is not None and top_k < kept.size:
        kept = kept[kept >= np.sort(kept)[::-1][top_k - 1]]
    return kept


def _boundary_values(row: npt.NDArray[Any], rule: str, earlier: dict[str, Any]) -> npt.NDArray[Any]:
    """The finite values of a defined ``row`` that ``rule`` decides on: top-p's are the
    survivors of the rules drawn ``earlier``."""
    finite = row[np.isfinite(row)]
    return _survivors(finite, earlier) if rule == "top_p" else finite


def _tied(values: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """The distinct ``values`` that two tokens or more share, largest first."""
    distinct, counts = np.unique(values, return_counts=True)
    return distinct[counts > 1][::-1]


@st.composite
def _boundary(
    draw: Any, z: npt.NDArray[Any], rule: str, earlier: dict[str, Any]
) -> float | int | None:
    """A parameter of ``rule`` at a boundary of some defined row of ``z``, or None; top-p's on
    the distribution renormalised over the survivors of the rules drawn ``earlier``.

    Where some row holds a tie (among top-p's survivors, for top-p), the boundary sits on
    a tied value three times in four: a rule that cuts a tie (torch.topk's exactly k tokens
    of a tie at the k-th value, a prefix of a sorted cumulative sum at the top-p
    boundary) shows only there, and most rows have none."""
    rows = _defined_rows(z).tolist()
    if not rows:
        return None
    tied_rows = [row for row in rows if _tied(_boundary_values(z[row], rule, earlier)).size]
    on_tie = bool(tied_rows) and draw(st.sampled_from(_ON_A_TIE), label=f"{rule} on a tie")
    row = z[draw(st.sampled_from(tied_rows if on_tie else rows), label=f"{rule} boundary row")]
    finite = _boundary_values(row, rule, earlier)
    values = _tied(finite) if on_tie else np.unique(finite)[::-1]  # largest first
    index = draw(st.integers(0, values.size - 1), label=f"{rule} boundary value")
    value = float(values[index])
    if rule == "top_k":
        # k lands on the first of the tokens tied at ``value``: every tie must be kept.
        return int(np.count_nonzero(row > value)) + 1
    top = float(finite.max())
    masses = np.exp(finite - top)
    if rule == "min_p":
        boundary = float(np.exp(value - top))
    else:
        boundary = float(masses[finite > value].sum() / masses.sum())
    shift = draw(st.sampled_from([0, 0, -1, 1, -(2**29), 2**29]), label=f"{rule} ulps")
    moved = _near(boundary, shift)
    if rule == "top_p" and moved <= 0.0:
        return None
    return moved


def _rule_value(
    draw: Any, rule: str, z: npt.NDArray[Any] | None, real: int, earlier: dict[str, Any]
) -> Any:
    """One rule's parameter: at a boundary of the logits when given (two times in three),
    else a plain value."""
    if z is not None and draw(st.sampled_from(_AT_A_BOUNDARY), label=f"{rule} at a boundary"):
        value = draw(_boundary(z, rule, earlier))
        if value is not None:
            return value
    if rule == "top_k":  # one past the vocabulary keeps it all: "all_off" draws those
        return draw(st.sampled_from([1, 2, 3, max(1, real - 1), real]) | st.integers(1, real))
    if rule == "top_p":
        return draw(st.sampled_from(_TOP_P_VALUES) | st.floats(2.0**-20, 1.0, exclude_min=False))
    return draw(st.sampled_from(_MIN_P_VALUES) | st.floats(0.0, 1.0))


@st.composite
def _sampling_params(
    draw: Any,
    contract: LogprobContract,
    z: npt.NDArray[Any] | None,
    only: tuple[str, ...] | None = None,
) -> SupportSpec:
    if only is not None:  # exactly these rules on, each at a value drawn as below
        chosen: dict[str, Any] = {}
        for rule in only:
            chosen[rule] = _rule_value(draw, rule, z, contract.sharding.real_vocab_size, chosen)
        return SupportSpec(**chosen)
    kind = draw(st.sampled_from(PARAM_KINDS), label="support rules")
    if kind == "all_off":
        off = draw(st.sampled_from(["top_p", "min_p", "top_k", "all three"]), label="rules off")
        real = contract.sharding.real_vocab_size
        return {
            "top_p": SupportSpec(top_p=1.0),
            "min_p": SupportSpec(min_p=0.0),
            "top_k": SupportSpec(top_k=real + draw(st.integers(0, 3))),
            "all three": SupportSpec(top_k=real, top_p=1.0, min_p=0.0),
        }[off]
    rules = {
        "top_k": ("top_k",),
        "top_p": ("top_p",),
        "min_p": ("min_p",),
        "top_k_top_p": ("top_k", "top_p"),
        "min_p_top_k": ("min_p", "top_k"),
        "min_p_top_p": ("min_p", "top_p"),
        "all_rules": ("min_p", "top_k", "top_p"),
    }[kind]
    real = contract.sharding.real_vocab_size
    chosen = {}
    for rule in rules:  # in vLLM's order: min-p, top-k, top-p
        chosen[rule] = _rule_value(draw, rule, z, real, chosen)
    return SupportSpec(**chosen)


@st.composite
def _replayed(draw: Any, contract: LogprobContract, z: npt.NDArray[Any] | None) -> SupportSpec:
    real = contract.sharding.real_vocab_size
    seed = draw(st.integers(0, 2**32 - 1), label="replayed mask seed")
    rng = np.random.default_rng(seed)
    active = contract.mask.dense()
    rows: list[npt.NDArray[np.int64]] = []
    for row in range(contract.num_tokens):
        kinds = REPLAYED_ROW_KINDS if not active[row] else REPLAYED_ROW_KINDS[:-1]
        kind = draw(st.sampled_from(kinds), label=f"replayed row {row}")
        if kind == "every_live":
            kept = np.arange(real)
        elif kind == "single":
            kept = np.array([int(rng.integers(0, real))])
        elif kind == "random_subset":
            kept = np.flatnonzero(rng.random(real) < rng.uniform(0.05, 0.95))
            if kept.size == 0:
                kept = np.array([int(rng.integers(0, real))])
        elif kind == "largest" and z is not None:
            order = np.argsort(-np.nan_to_num(z[row], nan=-np.inf), kind="stable")
            kept = np.sort(order[: int(rng.integers(1, real + 1))])
        elif kind == "largest":
            kept = np.arange(int(rng.integers(1, real + 1)))
        else:
            kept = np.array([], dtype=np.int64)
        rows.append(np.asarray(kept, dtype=np.int64))
    return SupportSpec.from_kept_lists([row.tolist() for row in rows])


def supports(
    contract: LogprobContract,
    *,
    modes: Iterable[SupportMode | str] = (SupportMode.SAMPLING_PARAMS, SupportMode.REPLAYED_MASK),
    logits: npt.NDArray[np.float32] | None = None,
    rules: Iterable[str] | None = None,
) -> st.SearchStrategy[SupportSpec]:
    """A :class:`~tp_logprob.SupportSpec` for ``contract`` in one of ``modes``.

    ``sampling_params`` draws the rules of :data:`PARAM_KINDS`; with ``logits`` their
    values often sit at a boundary of one of the rows (a tie at the k-th value, a
    mass on or one ulp around ``top_p``, ``min_p`` at a token's ``exp(z - M)``), most
    often at a value that several tokens share, where the row has one;
    ``rules`` (some of :data:`RULES`) turns exactly those rules on instead.
    ``replayed_mask`` draws kept ids per row (:data:`REPLAYED_ROW_KINDS`), never
    empty for an active row. The targets of a replayed contract must then lie in
    their rows' kept ids: :func:`~tp_logprob.strategies.targets` draws them so.

    Example::

        support = data.draw(supports(contract, logits=case.logits))
        case = case.replace(contract=dataclasses.replace(contract, support=support))
    """
    if not isinstance(contract, LogprobContract):
        raise InvalidArgument(f"contract={contract!r}: expected a LogprobContract")
    wanted = []
    for mode in modes:
        try:
            wanted.append(SupportMode(mode))
        except ValueError:
            raise InvalidArgument(f"modes: {mode!r} is not a SupportMode") from None
    wanted = [mode for mode in wanted if mode is not SupportMode.FULL]
    if not wanted:
        raise InvalidArgument(f"modes={modes!r}: name sampling_params or replayed_mask")
    expected = (contract.num_tokens, contract.sharding.padded_vocab_size)
    if logits is not None and np.shape(logits) != expected:
        raise InvalidArgument(f"logits: shape {np.shape(logits)}, expected {expected}")
    only = None if rules is None else _rules(rules)
    z = None if logits is None else _tempered(contract, logits)
    choices = []
    if SupportMode.SAMPLING_PARAMS in wanted:
        choices.append(_sampling_params(contract, z, only))
    if SupportMode.REPLAYED_MASK in wanted:
        choices.append(_replayed(contract, z))
    return st.one_of(choices)


def _rules(rules: Iterable[str]) -> tuple[str, ...]:
    """``rules`` in the order they apply; at least one, each a name of :data:`RULES`."""
    given = tuple(rules) if not isinstance(rules, str) else (rules,)
    unknown = [rule for rule in given if rule not in RULES]
    if unknown or not given or len(set(given)) != len(given):
        raise InvalidArgument(
            f"rules={rules!r}: name each of {', '.join(RULES)} at most once, at least one"
        )
    return tuple(rule for rule in RULES if rule in given)
