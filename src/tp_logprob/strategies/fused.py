"""Fused LM-head cases: hidden states, a padded weight and bias that break a fused kernel.

A :class:`HiddenCase` is a :class:`~tp_logprob.strategies.LogprobCase` whose
contract has ``input_kind="hidden"``. Besides the contract and targets it holds
``hidden [N, H]``, the full ``weight [padded_vocab_size, H]`` and ``bias``
(``[padded_vocab_size]`` or None). Its ``logits`` are ``fp32(x)`` for the exact
``x = hidden @ weight.T + bias`` (:func:`~tp_logprob.oracle.exact_hidden_logits`),
so every logits-path oracle function applies to it unchanged.

What is drawn (each row or column a kind, values from a numpy generator seeded
by Hypothesis, shrinking toward ``random`` with seed 0):

- hidden rows (:data:`HIDDEN_ROW_KINDS`): ``random``; ``cancellation``
  (``h[2k+1] = -h[2k]`` at 2^30 scale: against ``paired`` weight rows the big
  terms cancel exactly and ``x`` is far smaller than ``sum |h_i w_i|``);
  ``huge`` and ``tiny`` magnitudes (products near 2^84, or subnormal in fp32);
  ``zero`` (``x`` is the bias: a row of ties without one);
- weight rows (:data:`WEIGHT_ROW_KINDS`): ``random``, ``paired``
  (``w[2k+1] = w[2k]``), ``huge``, ``tiny``, ``duplicate`` (a copy of another
  live row: a tie), ``negated`` (minus another live row);
- padding rows of the weight and bias hold garbage (NaN, +-inf, huge values):
  a kernel that reads them leaks it;
- inactive rows may hold NaN in ``hidden``: a kernel must not let it reach
  any output or gradient.

Magnitudes keep every partial dot product inside the fp32 range (``|x| <= 2^90``),
where the dot-product error bound holds (``docs/tolerances.md``, "Fused LM head").
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from tp_logprob.contract import LogprobContract, LogprobDType, LogprobInputKind
from tp_logprob.errors import LogprobContractError
from tp_logprob.oracle.fused import dot_product_error_bound, exact_hidden_logits
from tp_logprob.strategies.cases import LogprobCase
from tp_logprob.strategies.contracts import contracts as contracts_strategy
from tp_logprob.strategies.logits import round_to_dtype
from tp_logprob.strategies.supports import supports as supports_strategy
from tp_logprob.strategies.targets import targets as targets_strategy

__all__ = [
    "HIDDEN_ROW_KINDS",
    "WEIGHT_ROW_KINDS",
    "HiddenCase",
    "hidden_cases",
    "hidden_temperatures",
]

HIDDEN_ROW_KINDS = ("random", "cancellation", "huge", "tiny", "zero")
WEIGHT_ROW_KINDS = ("random", "paired", "huge", "tiny", "duplicate", "negated")

_SCALES = {
    # (huge, tiny, cancellation) scales per dtype: fp16 has 5 exponent bits.
    LogprobDType.FP32: (2.0**40, 2.0**-70, 2.0**30),
    LogprobDType.BF16: (2.0**40, 2.0**-70, 2.0**30),
    LogprobDType.FP16: (2.0**6, 2.0**-12, 2.0**5),
}
_GARBAGE = (np.nan, np.inf, -np.inf, 3.0e38)


def _empty() -> npt.NDArray[np.float32]:
    return np.zeros((0, 0), dtype=np.float32)


@dataclass(frozen=True, eq=False)
class HiddenCase(LogprobCase):
    """A fused LM-head case: ``hidden``, full ``weight`` and ``bias`` (float32, dtype values).

    ``logits`` holds ``fp32(exact x)`` (padding columns included, from the garbage
    rows); ``exact_logits`` the exact ``x`` rounded to float64 and ``dot_bound``
    the bound on a fp32 dot product's error, live columns only.
    """

    hidden: npt.NDArray[np.float32] = dataclasses.field(default_factory=lambda: _empty())
    weight: npt.NDArray[np.float32] = dataclasses.field(default_factory=lambda: _empty())
    bias: npt.NDArray[np.float32] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        contract = self.contract
        if contract.input_kind is not LogprobInputKind.HIDDEN:
            raise LogprobContractError(
                f"input_kind={contract.input_kind.value!r}: a HiddenCase needs input_kind='hidden'"
            )
        rows, size = contract.num_tokens, contract.hidden_size
        padded = contract.sharding.padded_vocab_size
        expected: list[tuple[str, Any, tuple[Any, ...] | None]] = [
            ("hidden", self.hidden, (rows, size)),
            ("weight", self.weight, (padded, size)),
            ("bias", self.bias, (padded,) if contract.has_bias else None),
        ]
        for name, value, shape in expected:
            if shape is None:
                if value is not None:
                    raise LogprobContractError(f"{name}: given, but the contract has none")
                continue
            array = np.array(value, dtype=np.float32, copy=True)
            if array.shape != shape:
                raise LogprobContractError(f"{name}: shape {array.shape}, expected {shape}")
            array.flags.writeable = False
            object.__setattr__(self, name, array)

    @functools.cached_property
    def exact_logits(self) -> npt.NDArray[np.float64]:
        """The exact ``x`` of the live columns, each correctly rounded to float64."""
        real = self.contract.sharding.real_vocab_size
        return exact_hidden_logits(self.hidden, self.weight[:real], self._live_bias())

    @functools.cached_property
    def dot_bound(self) -> npt.NDArray[np.float64]:
        """Bound on a fp32 dot product's ``|x_kernel - x|``, live columns only."""
        real = self.contract.sharding.real_vocab_size
        return dot_product_error_bound(self.hidden, self.weight[:real], self._live_bias())

    def _live_bias(self) -> npt.NDArray[np.float32] | None:
        return None if self.bias is None else self.bias[: self.contract.sharding.real_vocab_size]

    def torch_inputs(self, device: Any = None) -> tuple[Any, Any, Any]:
        """``(hidden, weight, bias)`` as torch tensors of the contract dtype (exact casts)."""
        import torch

        dtype = getattr(
            torch,
            {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[self.contract.dtype.value],
        )

        def convert(array: Any) -> Any:
            if array is None:
                return None
            return torch.from_numpy(np.array(array)).to(device=device, dtype=dtype)

        return convert(self.hidden), convert(self.weight), convert(self.bias)

    def describe(self) -> str:
        """The contract, then the magnitudes of the inputs."""
        h = self.hidden[np.isfinite(self.hidden)]
        span = f"|hidden| <= {np.abs(h).max():.3g}" if h.size else "hidden non-finite"
        nan_rows = int(np.isnan(self.hidden).any(axis=1).sum())
        text = f"{self.contract.describe()} | {span}"
        return text + (f", {nan_rows} rows with NaN hidden" if nan_rows else "") + self.form_note()

    def digest(self) -> str:
        """sha256 over the logits-case digest and the exact bytes of hidden, weight and bias."""
        hasher = hashlib.sha256(super().digest().encode())
        for array in (self.hidden, self.weight, self.bias):
            hasher.update(b"-" if array is None else array.tobytes())
        return hasher.hexdigest()

    def __repr__(self) -> str:
        return f"HiddenCase({self.describe()})"


def _hidden_rows(
    draw: Any, rng: np.random.Generator, contract: LogprobContract
) -> npt.NDArray[np.float64]:
    huge, tiny, cancel = _SCALES[contract.dtype]
    size = contract.hidden_size or 1
    rows = np.empty((contract.num_tokens, size))
    for row in range(contract.num_tokens):
        kind = draw(st.sampled_from(HIDDEN_ROW_KINDS), label=f"hidden row {row}")
        values = rng.standard_normal(size)
        if kind == "cancellation":
            values = values * cancel
            values[1::2] = -values[0 : size - size % 2 : 2] if size > 1 else values[1::2]
        elif kind == "huge":
            values = values * huge
        elif kind == "tiny":
            values = values * tiny
        elif kind == "zero":
            values = np.zeros(size)
        rows[row] = values
    return rows


def _weight_rows(
    draw: Any, rng: np.random.Generator, contract: LogprobContract
) -> npt.NDArray[np.float64]:
    huge, tiny, cancel = _SCALES[contract.dtype]
    size = contract.hidden_size or 1
    real, padded = contract.sharding.real_vocab_size, contract.sharding.padded_vocab_size
    rows = rng.standard_normal((padded, size)) * 0.5
    for column in range(real):
        kind = draw(st.sampled_from(WEIGHT_ROW_KINDS), label=f"weight row {column}")
        if kind == "paired":
            rows[column] *= cancel / 8
            rows[column, 1::2] = rows[column, 0 : size - size % 2 : 2]
        elif kind == "huge":
            rows[column] *= huge
        elif kind == "tiny":
            rows[column] *= tiny
        elif kind in ("duplicate", "negated") and column > 0:
            source = draw(st.integers(0, column - 1), label=f"copied row of {column}")
            rows[column] = rows[source] * (1 if kind == "duplicate" else -1)
    for column in range(real, padded):
        rows[column, draw(st.integers(0, size - 1))] = draw(st.sampled_from(_GARBAGE))
    return rows


def _bias(
    draw: Any, rng: np.random.Generator, contract: LogprobContract
) -> npt.NDArray[np.float64] | None:
    if not contract.has_bias:
        return None
    real, padded = contract.sharding.real_vocab_size, contract.sharding.padded_vocab_size
    scale = draw(st.sampled_from([1.0, 0.0, 64.0]), label="bias scale")
    values: npt.NDArray[np.float64] = rng.standard_normal(padded) * scale
    values[real:] = [draw(st.sampled_from(_GARBAGE)) for _ in range(padded - real)]
    return values


def _small_integers(
    rng: np.random.Generator, contract: LogprobContract
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64] | None]:
    """Integers in [-8, 8] (bias [-64, 64]): every fp32 product and partial sum is exact."""
    size = contract.hidden_size or 1
    real, padded = contract.sharding.real_vocab_size, contract.sharding.padded_vocab_size
    hidden = rng.integers(-8, 9, (contract.num_tokens, size)).astype(np.float64)
    weight = rng.integers(-8, 9, (padded, size)).astype(np.float64)
    weight[real:] = np.nan
    bias = None
    if contract.has_bias:
        bias = rng.integers(-64, 65, padded).astype(np.float64)
        bias[real:] = np.inf
    return hidden, weight, bias


@st.composite
def _hidden_cases(
    draw: Any,
    contracts: st.SearchStrategy[LogprobContract],
    small_integers: bool,
    support_rules: tuple[str, ...] | None,
) -> HiddenCase:
    contract = draw(contracts)
    if contract.input_kind is not LogprobInputKind.HIDDEN:
        raise InvalidArgument(
            f"hidden_cases: drew a contract with input_kind={contract.input_kind}"
        )
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    if small_integers:
        raw_hidden, raw_weight, raw_bias = _small_integers(rng, contract)
    else:
        raw_hidden = _hidden_rows(draw, rng, contract)
        raw_weight = _weight_rows(draw, rng, contract)
        raw_bias = _bias(draw, rng, contract)
    hidden = round_to_dtype(raw_hidden, contract.dtype)
    weight = round_to_dtype(raw_weight, contract.dtype)
    bias = None if raw_bias is None else round_to_dtype(raw_bias, contract.dtype)
    active = contract.mask.dense()
    if (~active).any() and draw(st.booleans(), label="NaN in inactive hidden rows"):
        hidden[~active] = np.nan
    with np.errstate(over="ignore", invalid="ignore"):
        logits = exact_hidden_logits(hidden, weight, bias).astype(np.float32)
    if contract.support is not None:  # aim the support at these logits' boundaries
        modes = (contract.support_mode,)
        support = draw(supports_strategy(contract, modes=modes, logits=logits, rules=support_rules))
        contract = dataclasses.replace(contract, support=support)
    chosen = draw(targets_strategy(contract, logits=logits))
    return HiddenCase(contract, logits, chosen, hidden=hidden, weight=weight, bias=bias)


def hidden_cases(
    contracts: st.SearchStrategy[LogprobContract] | None = None,
    *,
    small_integers: bool = False,
    support_rules: Any = None,
    **contract_filters: Any,
) -> st.SearchStrategy[HiddenCase]:
    """:class:`HiddenCase` values: a fused LM-head contract and adversarial operands.

    Pass a strategy of hidden-input contracts, or the keyword filters of
    :func:`~tp_logprob.strategies.contracts` (``input_kind="hidden"`` is implied;
    temperatures default to :func:`hidden_temperatures`). With ``small_integers``
    the operands are integers in [-8, 8] (bias in [-64, 64]), so a fp32 dot
    product is exact in any order and the kernel's ``x`` is the oracle's. A
    contract drawn with a sampling support (``support_modes=...``) gets one aimed at
    the drawn logits (:func:`~tp_logprob.strategies.supports`; ``support_rules`` turns
    exactly those sampling rules on), as in :func:`~tp_logprob.strategies.cases`, and
    its targets follow it.

    Example::

        @given(hidden_cases(capability=my_fused_capability, max_hidden_size=16))
        def test_my_fused_kernel(case): ...
    """
    if contracts is not None and contract_filters:
        raise InvalidArgument("hidden_cases(contracts=..., ...): pass a strategy or filters")
    if contracts is None:
        contract_filters.setdefault("input_kind", LogprobInputKind.HIDDEN)
        contract_filters.setdefault("temperature", hidden_temperatures())
        contracts = contracts_strategy(**contract_filters)
    rules = None if support_rules is None else tuple(support_rules)
    return _hidden_cases(contracts, bool(small_integers), rules)


def hidden_temperatures() -> st.SearchStrategy[float]:
    """Temperatures for fused cases, in ``[2^-8, 2^8]``, shrinking toward 1.0.

    ``z = x / T`` then stays far inside the fp32 range (``|x| <= 2^90``), where the
    dot-product bound holds; the extremes of :func:`temperatures` are the logits
    path's to test.
    """
    return st.one_of(
        st.just(1.0),
        st.sampled_from([0.6, 0.7, 0.8, 1.2, 1.5]),
        st.integers(-8, 8).map(lambda k: 2.0**k),
        st.floats(min_value=2.0**-8, max_value=2.0**8),
    )
