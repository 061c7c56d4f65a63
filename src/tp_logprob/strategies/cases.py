"""One complete invocation: a contract, its full logits and its targets."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from tp_logprob.contract import LogprobContract, LogprobDType
from tp_logprob.errors import LogprobContractError
from tp_logprob.strategies.contracts import contracts as contracts_strategy
from tp_logprob.strategies.input_forms import InputForm
from tp_logprob.strategies.logits import logits as logits_strategy
from tp_logprob.strategies.supports import supports as supports_strategy
from tp_logprob.strategies.targets import targets as targets_strategy

__all__ = ["LogprobCase", "cases"]

_TORCH_DTYPE_NAMES = {
    LogprobDType.FP32: "float32",
    LogprobDType.BF16: "bfloat16",
    LogprobDType.FP16: "float16",
}


@dataclass(frozen=True, eq=False)
class LogprobCase:
    """A frozen test case: ``contract`` (any rank's view), full ``logits`` and ``targets``.

    ``logits`` is float32 ``[num_tokens, padded_vocab_size]`` holding values exactly
    representable in ``contract.dtype``; ``targets`` is int64 ``[num_tokens]`` of
    global ids. Both are read-only copies. Shapes are checked; target values are
    not, so a case can also describe a bad input. ``form`` is how the tensors are laid
    out when the suite hands them to an op
    (:class:`~tp_logprob.strategies.input_forms.InputForm`; the values do not change).
    """

    contract: LogprobContract
    logits: npt.NDArray[np.float32]
    targets: npt.NDArray[np.int64]
    form: InputForm = dataclasses.field(default_factory=InputForm)

    def __post_init__(self) -> None:
        if not isinstance(self.contract, LogprobContract):
            raise LogprobContractError(
                f"contract={self.contract!r}: expected a LogprobContract, got "
                f"{type(self.contract).__name__}"
            )
        rows, padded = self.contract.num_tokens, self.contract.sharding.padded_vocab_size
        logits = np.array(self.logits, dtype=np.float32, copy=True)
        targets = np.array(self.targets, dtype=np.int64, copy=True)
        if logits.shape != (rows, padded):
            raise LogprobContractError(
                f"logits: shape {logits.shape}, expected [num_tokens, padded_vocab_size] = "
                f"{(rows, padded)}"
            )
        if targets.shape != (rows,):
            raise LogprobContractError(f"targets: shape {targets.shape}, expected ({rows},)")
        if not isinstance(self.form, InputForm):
            raise LogprobContractError(
                f"form={self.form!r}: expected an InputForm, got {type(self.form).__name__}"
            )
        logits.flags.writeable = False
        targets.flags.writeable = False
        object.__setattr__(self, "logits", logits)
        object.__setattr__(self, "targets", targets)

    @property
    def active(self) -> npt.NDArray[np.bool_]:
        """The active mask as a bool array (all True when the contract has none)."""
        return self.contract.mask.dense()

    def replace(self, **changes: Any) -> LogprobCase:
        """A copy with some of ``contract``, ``logits``, ``targets``, ``form`` replaced
        (re-checked)."""
        return dataclasses.replace(self, **changes)

    def torch_logits(self, device: Any = None) -> Any:
        """The full logits as a torch tensor of the contract dtype (an exact cast)."""
        torch = _torch()
        dtype = getattr(torch, _TORCH_DTYPE_NAMES[self.contract.dtype])
        return torch.from_numpy(np.array(self.logits)).to(device=device, dtype=dtype)

    def torch_targets(self, device: Any = None) -> Any:
        """The targets as an int64 torch tensor."""
        return _torch().from_numpy(np.array(self.targets)).to(device=device)

    def describe(self) -> str:
        """The case in one line: the contract, then what the logits hold."""
        values = self.logits
        special = [
            f"{name} {count}"
            for name, count in (
                ("nan", int(np.isnan(values).sum())),
                ("+inf", int(np.isposinf(values).sum())),
                ("-inf", int(np.isneginf(values).sum())),
            )
            if count
        ]
        finite = values[np.isfinite(values)]
        span = f"[{finite.min():.6g}, {finite.max():.6g}]" if finite.size else "none"
        return (
            f"{self.contract.describe()} | logits {list(values.shape)} finite in {span}"
            + (f", {', '.join(special)}" if special else "")
            + self.form_note()
        )

    def form_note(self) -> str:
        """`` | laid out values row gap, ...`` for a case with a non-contiguous form, else empty."""
        return "" if self.form.contiguous else f" | laid out {self.form.describe()}"

    def digest(self) -> str:
        """sha256 over the contract fingerprint, rank, the exact bytes of the arrays and a
        non-contiguous form (a contiguous case keeps the digest it had before forms)."""
        hasher = hashlib.sha256(self.contract.cross_rank_fingerprint().encode())
        hasher.update(str(self.contract.sharding.tp_rank).encode())
        hasher.update(self.logits.tobytes())
        hasher.update(self.targets.tobytes())
        if not self.form.contiguous:
            hasher.update(repr(sorted(self.form.to_dict().items())).encode())
        return hasher.hexdigest()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LogprobCase):
            return NotImplemented
        return self.digest() == other.digest()

    def __hash__(self) -> int:
        return hash(self.digest())

    def __repr__(self) -> str:
        return f"LogprobCase({self.describe()})"


def _torch() -> Any:
    import torch

    return torch


@st.composite
def _cases(
    draw: Any,
    contracts: st.SearchStrategy[LogprobContract],
    special_values: bool,
    logit_kinds: tuple[str, ...] | None,
    support_rules: tuple[str, ...] | None,
) -> LogprobCase:
    contract = draw(contracts)
    logits = draw(logits_strategy(contract, special_values=special_values, kinds=logit_kinds))
    if contract.support is not None:  # aim the support at these logits' boundaries
        modes = (contract.support_mode,)
        support = draw(supports_strategy(contract, modes=modes, logits=logits, rules=support_rules))
        contract = dataclasses.replace(contract, support=support)
    targets = draw(targets_strategy(contract, logits=logits))
    return LogprobCase(contract, logits, targets)


def cases(
    contracts: st.SearchStrategy[LogprobContract] | None = None,
    *,
    special_values: bool = False,
    logit_kinds: Any = None,
    support_rules: Any = None,
    **contract_filters: Any,
) -> st.SearchStrategy[LogprobCase]:
    """Complete :class:`LogprobCase` values: a contract, adversarial logits, valid targets.

    Pass a contract strategy, or the keyword filters of
    :func:`~tp_logprob.strategies.contracts` (not both). ``special_values`` and
    ``logit_kinds`` go to :func:`~tp_logprob.strategies.logits`. A contract drawn with a
    sampling support gets one aimed at the drawn logits
    (:func:`~tp_logprob.strategies.supports`; ``support_rules`` turns exactly those
    sampling rules on), and its targets follow it.

    Example::

        @given(cases(capability=my_capability, max_padded_vocab_size=256))
        def test_my_kernel(case): ...
    """
    if contracts is not None and contract_filters:
        raise InvalidArgument(
            f"cases(contracts=..., {', '.join(sorted(contract_filters))}=...): pass either a "
            "contract strategy or contract filters, not both"
        )
    if contracts is None:
        contracts = contracts_strategy(**contract_filters)
    elif not isinstance(contracts, st.SearchStrategy):
        raise InvalidArgument(f"contracts={contracts!r}: expected a strategy of contracts")
    kinds = None if logit_kinds is None else tuple(logit_kinds)
    rules = None if support_rules is None else tuple(support_rules)
    return _cases(contracts, bool(special_values), kinds, rules)
