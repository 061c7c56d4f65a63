"""Each planted-bug backend really is a mutant: a hand-made case its bug changes.

The suite's power is measured by ``benchmarks/suite_power.py`` (minutes); these
fast tests keep the zoo honest: every mutant loads through the suite's own
``module:attr`` loader with its base backend's capability (torch_native, or
torch_native_fused for the ``fused_*`` modules; bar its declared lie), the controls rebuilt
from the same parts pass every demo, and each mutant differs from its base
backend on a case designed for its bug (``processed_bugs``: a contract with a
sampling support, every output compared, the support's too).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import tp_logprob as tpl
from tests.mutants import CONTROLS, MUTANTS
from tests.mutants.control import control_native
from tests.mutants.fused_bugs import control_fused
from tests.mutants.processed_bugs import control_processed
from tp_logprob.comm import CollectiveError, EmulatedGroup
from tp_logprob.emulate import ReplicationError
from tp_logprob.kernels.builtin import TORCH_NATIVE, TORCH_NATIVE_FUSED
from tp_logprob.kernels.dtypes import TORCH_DTYPES
from tp_logprob.kernels.native import torch_native_logprob
from tp_logprob.kernels.native_fused import torch_native_fused_logprob
from tp_logprob.oracle import apply_temperature, exact_selected_logprob, tolerance
from tp_logprob.strategies import InputForm, laid_out
from tp_logprob.suite.backends import resolve_backends

_INF = float("inf")
_NAN = float("nan")
_V = 8


def _contract(
    bounds: tuple[tuple[int, int], ...] = ((0, _V),),
    *,
    rows: int = 1,
    real: int | None = None,
    mask: Any = None,
    dtype: str = "fp32",
    role: str = "infer",
    scope: str = "fixed_topology",
    temperature: float = 1.0,
    entropy: bool = False,
) -> tpl.LogprobContract:
    padded = bounds[-1][1]
    return tpl.LogprobContract(
        role=tpl.LogprobRole(role),
        dtype=tpl.LogprobDType(dtype),
        mask=tpl.MaskSpec(rows, mask),
        sharding=tpl.ShardingSpec(0, len(bounds), bounds, padded if real is None else real, padded),
        reduction=tpl.ReductionSpec(tpl.DeterminismScope(scope)),
        temperature=temperature,
        export_entropy=entropy,
    )


@dataclasses.dataclass(frozen=True)
class Case:
    """Full logits (as nested lists or an array), targets and the contract; the forward
    hands them over laid out as ``form`` says."""

    contract: tpl.LogprobContract
    logits: Any
    targets: list[int]
    form: InputForm = dataclasses.field(default_factory=InputForm)

    def tensors(self, *, grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = TORCH_DTYPES[self.contract.dtype]
        logits = torch.tensor(np.asarray(self.logits, dtype=np.float32)).to(dtype)
        if grad:
            return logits.requires_grad_(True), torch.tensor(self.targets)
        targets = laid_out(torch.tensor(self.targets), self.form.targets)
        return laid_out(logits, self.form.values), targets


def _random(rows: int, columns: int, seed: int = 0) -> Any:
    return np.random.default_rng(seed).standard_normal((rows, columns)).astype(np.float32)


_RAMP = [[float(v) for v in range(_V)]]
_TP2 = ((0, 4), (4, _V))
_WIDE_ROWS = 64


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().view(torch.int32)


def _outputs(op: Callable[..., Any], case: Case) -> tuple[torch.Tensor | None, ...]:
    """``(selected_logp, lse, entropy)``; an output the contract does not ask for is None."""
    logits, targets = case.tensors()
    result = tpl.run_tp(op, logits, targets, case.contract)[0]
    return result.selected_logp, result.lse, result.entropy


def _gradient(
    op: Callable[..., Any], case: Case, weight: float = 1.0, entropy_weight: float = 0.0
) -> torch.Tensor:
    """The gradient of ``weight * selected_logp + entropy_weight * entropy``, summed over ranks."""
    logits, targets = case.tensors(grad=True)
    results = tpl.run_tp(op, logits, targets, case.contract)
    loss = sum(weight * result.selected_logp.sum() for result in results)
    if case.contract.export_entropy:
        loss = loss + sum(entropy_weight * result.entropy.sum() for result in results)
    loss.backward()
    assert logits.grad is not None
    return logits.grad


def _same_bits(a: Any, b: Any) -> bool:
    return all(
        (x is None and y is None) or torch.equal(_bits(x), _bits(y))
        for x, y in zip(a, b, strict=True)
    )


Pair = tuple[Callable[..., Any], Any]
"""A backend as ``(op, capability)``."""

NATIVE: Pair = (torch_native_logprob, TORCH_NATIVE)
NATIVE_FUSED: Pair = (torch_native_fused_logprob, TORCH_NATIVE_FUSED)


def _forward_differs(case: Case) -> Callable[[Pair], bool]:
    return lambda pair: not _same_bits(_outputs(pair[0], case), _outputs(NATIVE[0], case))


_SUPPORT_OUTPUTS = ("support_lse", "support_size", "support_threshold")


def _processed_differs(case: Case) -> Callable[[Pair], bool]:
    """Some output of a processed op (the support's included) has other bits than native's."""

    def outputs(op: Callable[..., Any]) -> tuple[Any, ...]:
        logits, targets = case.tensors()
        result = tpl.run_tp(op, logits, targets, case.contract)[0]
        support = tuple(getattr(result, name) for name in _SUPPORT_OUTPUTS)
        return (*tuple(result), *support)

    def differs(pair: Pair) -> bool:
        mine, native = outputs(pair[0]), outputs(NATIVE[0])
        return not all(_same_output(a, b) for a, b in zip(mine, native, strict=True))

    return differs


def _same_output(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Both None, or the same bits (int64 sizes: the same values)."""
    if a is None or b is None:
        return a is None and b is None
    if a.dtype == torch.int64:
        return torch.equal(a, b)
    return torch.equal(_bits(a), _bits(b))


def _supported(
    support: tpl.SupportSpec, bounds: tuple[tuple[int, int], ...] = ((0, _V),), **fields: Any
) -> tpl.LogprobContract:
    return dataclasses.replace(_contract(bounds, **fields), support=support)


def _input_written(case: Case) -> Callable[[Pair], bool]:
    """Does the op change the caller's logits (their bits) during the forward?"""

    def written(pair: Pair) -> bool:
        logits, targets = case.tensors()
        before = logits.clone()
        tpl.run_tp(pair[0], logits, targets, case.contract)
        return not torch.equal(_bits(before), _bits(logits))

    return written


def _gradient_differs(
    case: Case, weight: float = 1.0, entropy_weight: float = 0.0
) -> Callable[[Pair], bool]:
    def differs(pair: Pair) -> bool:
        mine = _gradient(pair[0], case, weight, entropy_weight)
        native = _gradient(NATIVE[0], case, weight, entropy_weight)
        return not torch.equal(_bits(mine), _bits(native))

    return differs


def _outside_oracle(case: Case) -> Callable[[Pair], bool]:
    """Some output is outside the exact oracle's fp32 tolerance (not merely other bits)."""

    def differs(pair: Pair) -> bool:
        selected, lse, _ = _outputs(pair[0], case)
        assert lse is not None
        contract, (logits, targets) = case.contract, case.tensors()
        x = logits.double().numpy()
        want_selected, want_lse = exact_selected_logprob(
            x, targets.numpy(), temperature=contract.temperature
        )
        row_max = apply_temperature(x, contract.temperature).max(axis=1)
        table = tolerance(contract.dtype.value, x.shape[1])
        bad = table.violations(
            selected.double().numpy(),
            lse.double().numpy(),
            want_selected,
            want_lse,
            row_max=row_max,
        )
        return bool(bad.any())

    return differs


def _raises(error: type[BaseException], case: Case) -> Callable[[Pair], bool]:
    """The op raises ``error`` on a case torch_native serves."""

    def differs(pair: Pair) -> bool:
        try:
            _outputs(pair[0], case)
        except error:
            return True
        return False

    return differs


def _batch_dependent(case: Case) -> Callable[[Pair], bool]:
    """Some row's bits differ between the whole batch and that row run alone."""

    def differs(pair: Pair) -> bool:
        op = pair[0]
        logits, targets = case.tensors()
        whole = op(logits, targets, case.contract)
        alone = dataclasses.replace(case.contract, mask=tpl.MaskSpec(1))
        rows = range(len(targets))
        lse = torch.stack([op(logits[i : i + 1], targets[i : i + 1], alone).lse[0] for i in rows])
        return not torch.equal(_bits(whole.lse), _bits(lse))

    return differs


def _false_cross_tp_claim(
    case: Case, bounds: tuple[tuple[int, int], ...]
) -> Callable[[Pair], bool]:
    """The backend claims cross_tp_bitwise, yet ``case`` and its relayout to ``bounds`` differ."""

    def differs(pair: Pair) -> bool:
        op, capability = pair
        if tpl.DeterminismScope.CROSS_TP_BITWISE not in capability.determinism_scopes:
            return False
        sharding = dataclasses.replace(
            case.contract.sharding, tp_world_size=len(bounds), vocab_shard_bounds=bounds
        )
        relaid = dataclasses.replace(case.contract, sharding=sharding)
        other = dataclasses.replace(case, contract=relaid)
        return not _same_bits(_outputs(op, case), _outputs(op, other))

    return differs


def _lone_rank_with_bad_width(pair: Pair) -> bool:
    """A bad width on one rank whose peer never arrives: a timeout, not LogprobContractError."""
    contract = _contract(_TP2, rows=1)
    try:
        pair[0](
            torch.zeros((1, 3)), torch.tensor([0]), contract, group=EmulatedGroup(2, timeout=0.2)[0]
        )
    except tpl.LogprobContractError:
        return False
    except CollectiveError:
        return True
    raise AssertionError("a shard of the wrong width was accepted")


@dataclasses.dataclass(frozen=True)
class HiddenDemo:
    """A fused case: hidden ``[N, H]``, the full padded weight ``[V, H]`` and bias, targets."""

    contract: tpl.LogprobContract
    hidden: Any
    weight: Any
    targets: list[int]
    bias: Any = None
    form: InputForm = dataclasses.field(default_factory=InputForm)

    def tensors(self, *, grad: bool = False) -> tuple[torch.Tensor, ...]:
        """``(hidden, weight, bias or None, targets)``; with ``grad`` the floats are leaves,
        else hidden and weight are laid out as ``form`` says."""
        floats = [
            None if v is None else torch.tensor(np.asarray(v, dtype=np.float32))
            for v in (self.hidden, self.weight, self.bias)
        ]
        if grad:
            leaves = [None if t is None else t.requires_grad_(True) for t in floats]
            return (*leaves, torch.tensor(self.targets))
        hidden, weight, bias = floats
        views = (laid_out(hidden, self.form.values), laid_out(weight, self.form.weight), bias)
        return (*views, torch.tensor(self.targets))


def _fused_contract(
    bounds: tuple[tuple[int, int], ...],
    *,
    rows: int = 1,
    real: int | None = None,
    mask: Any = None,
    role: str = "infer",
    hidden_size: int = 2,
    bias: bool = False,
) -> tpl.LogprobContract:
    return dataclasses.replace(
        _contract(bounds, rows=rows, real=real, mask=mask, role=role),
        input_kind=tpl.LogprobInputKind.HIDDEN,
        hidden_size=hidden_size,
        has_bias=bias,
    )


def _fused_results(op: Callable[..., Any], case: HiddenDemo, *, grad: bool = False) -> Any:
    hidden, weight, bias, targets = case.tensors(grad=grad)
    results = tpl.run_tp_hidden(op, hidden, weight, targets, case.contract, bias=bias)
    return results, (hidden, weight, bias)


def _fused_forward_differs(case: HiddenDemo) -> Callable[[Pair], bool]:
    def differs(pair: Pair) -> bool:
        (mine, *_), _ = _fused_results(pair[0], case)
        (native, *_), _ = _fused_results(NATIVE_FUSED[0], case)
        pairs = [(mine.selected_logp, native.selected_logp), (mine.lse, native.lse)]
        return not all(torch.equal(_bits(a), _bits(b)) for a, b in pairs)

    return differs


def _fused_gradients(op: Callable[..., Any], case: HiddenDemo) -> list[torch.Tensor]:
    """d hidden (every rank's partial, summed by autograd), d weight and d bias of sum(selected)."""
    results, leaves = _fused_results(op, case, grad=True)
    sum(result.selected_logp.sum() for result in results).backward()
    return [leaf.grad for leaf in leaves if leaf is not None and leaf.grad is not None]


def _fused_gradient_differs(case: HiddenDemo) -> Callable[[Pair], bool]:
    def differs(pair: Pair) -> bool:
        mine, native = _fused_gradients(pair[0], case), _fused_gradients(NATIVE_FUSED[0], case)
        return len(mine) != len(native) or not all(
            torch.equal(_bits(a), _bits(b)) for a, b in zip(mine, native, strict=True)
        )

    return differs


def _fused_batch_dependent(case: HiddenDemo) -> Callable[[Pair], bool]:
    """Some row's lse bits differ between the whole batch and that row run alone."""

    def differs(pair: Pair) -> bool:
        op = pair[0]
        hidden, weight, _, targets = case.tensors()
        whole = op(hidden, targets, case.contract, weight=weight).lse
        alone = dataclasses.replace(case.contract, mask=tpl.MaskSpec(1))
        rows = range(len(targets))
        lse = [op(hidden[i : i + 1], targets[i : i + 1], alone, weight=weight).lse for i in rows]
        return not torch.equal(_bits(whole), _bits(torch.cat(lse)))

    return differs


_PADDED = _contract(((0, 4), (4, 6), (6, _V)), real=5)
_MASKED = _contract(rows=2, mask=[True, False])
_TRAIN_TP2 = _contract(_TP2, role="train")
_WIDE = _random(_WIDE_ROWS, 16)
_WIDE_TARGETS = [0] * _WIDE_ROWS
_LONG_ROWS = 70  # past the 64-row tile of the long-batch mutants
_LONG_TARGETS = [(row // 7) % _V for row in range(_LONG_ROWS)]  # row 64's is not row 0's
_WIDE_V = 200  # past the 128-column tile of the fused wide mutants
_H = [[1.0, 0.5]]
_FUSED_W = [[float(v), 1.0] for v in range(5)] + [[100.0, 0.0], [_NAN, 0.0], [_INF, 1.0]]

DEMOS: dict[str, Callable[[Pair], bool]] = {
    # name -> does this backend show the bug on a case made for it? (never torch_native)
    "lse_average": _forward_differs(Case(_contract(_TP2), _RAMP, [1])),
    "merge_no_rescale": _forward_differs(Case(_contract(_TP2), _RAMP, [1])),
    "identity_nan": _forward_differs(Case(_contract(), [[-_INF] * _V], [0])),
    "plus_inf_not_special": _forward_differs(Case(_contract(), [[0.0, _INF, *[1.0] * 6]], [0])),
    "owner_off_by_one": _forward_differs(Case(_contract(_TP2), _RAMP, [4])),
    "reverse_merge_cross_tp": _false_cross_tp_claim(
        Case(
            _contract(((0, 16),), rows=_WIDE_ROWS, scope="cross_tp_bitwise"), _WIDE, _WIDE_TARGETS
        ),
        tpl.even_shard_bounds(16, 4),
    ),
    "ring_order_merge": _raises(
        ReplicationError,
        Case(_contract(tpl.even_shard_bounds(16, 4), rows=_WIDE_ROWS), _WIDE, _WIDE_TARGETS),
    ),
    "rank1_lse_last_bit": _raises(ReplicationError, Case(_contract(_TP2), _RAMP, [1])),
    "partials_in_logits_dtype": _forward_differs(
        Case(_contract(_TP2, dtype="bf16"), [[0.1 * v for v in range(_V)]], [1])
    ),
    "padding_not_masked": _forward_differs(Case(_PADDED, [[*range(5), 100.0, 100.0, 100.0]], [1])),
    "padding_in_max_only": _forward_differs(Case(_PADDED, [[*range(5), 1e4, 1e4, 1e4]], [1])),
    "padding_last_rank_only": _forward_differs(Case(_PADDED, [[*range(5), 3.0, 3.0, 3.0]], [1])),
    "last_column_dropped": _forward_differs(Case(_contract(), _RAMP, [1])),
    "target_local_index": _forward_differs(Case(_contract(_TP2), _RAMP, [5])),
    "half_precision_accumulation": _forward_differs(
        Case(_contract(dtype="bf16"), [[0.1 * v for v in range(_V)]], [1])
    ),
    "no_max_shift": _forward_differs(Case(_contract(), [[100.0] * _V], [0])),
    "tiling_depends_on_n": _batch_dependent(
        Case(_contract(((0, 16),), rows=_WIDE_ROWS), _WIDE, _WIDE_TARGETS)
    ),
    # The half-ulp row: left to right every addition rounds up, the tree's pairs are exact.
    "sequential_declared_tree": _forward_differs(
        Case(_contract(((0, 64),)), [[0.0] + [-16.63553] * 63], [0])
    ),
    "inactive_not_zeroed": _forward_differs(Case(_MASKED, _RAMP * 2, [1, 3])),
    "inactive_lse_zeroed": _forward_differs(Case(_MASKED, _RAMP * 2, [1, -100])),
    "inactive_target_checked": _raises(
        tpl.LogprobContractError, Case(_MASKED, _RAMP * 2, [1, -100])
    ),
    "check_after_collective": _lone_rank_with_bad_width,
    "grad_no_one_hot": _gradient_differs(Case(_TRAIN_TP2, _RAMP, [5])),
    "grad_local_lse": _gradient_differs(Case(_TRAIN_TP2, _RAMP, [1])),
    "grad_padding_nonzero": _gradient_differs(
        Case(dataclasses.replace(_PADDED, role=tpl.LogprobRole.TRAIN), [[*range(_V)]], [1])
    ),
    "grad_ignores_upstream": _gradient_differs(Case(_TRAIN_TP2, _RAMP, [1]), weight=2.0),
    "entropy_zero_times_neg_inf": _forward_differs(
        Case(_contract(entropy=True), [[0.0, -_INF, *range(1, _V - 1)]], [2])
    ),
    "entropy_before_temperature": _forward_differs(
        Case(_contract(temperature=0.5, entropy=True), _RAMP, [1])
    ),
    "temperature_on_logprobs": _forward_differs(Case(_contract(temperature=2.0), _RAMP, [1])),
    "entropy_grad_nan_to_num": _gradient_differs(
        Case(_contract(_TP2, role="train", entropy=True), [[0.0, 1.0, _NAN, *range(5)]], [1]),
        entropy_weight=1.0,
    ),
    "entropy_over_padding": _forward_differs(
        Case(dataclasses.replace(_PADDED, export_entropy=True), [[*range(5), 0.0, 0.0, 0.0]], [1])
    ),
    "entropy_unmerged": _forward_differs(Case(_contract(_TP2, entropy=True), _RAMP, [1])),
    "writes_input": _input_written(Case(_MASKED, _RAMP * 2, [1, -100])),
    # A column-major view of [[0, ..., 7]]: read as unit strides, row 0 is 0, 1, 1, 1, ...
    "unit_column_stride": _forward_differs(
        Case(_contract(rows=2), _RAMP * 2, [7, 0], InputForm("column major"))
    ),
    # A column of an id table: read densely, row 1 takes the poison after row 0's id.
    "dense_targets": _forward_differs(
        Case(_contract(rows=2), _RAMP * 2, [7, 3], InputForm(targets="step"))
    ),
    "fused_dense_hidden": _fused_forward_differs(
        HiddenDemo(
            _fused_contract(((0, _V),), rows=2, hidden_size=2),
            [[1.0, 0.5], [-0.25, 2.0]],
            _random(_V, 2),
            [3, 6],
            form=InputForm("column major"),
        )
    ),
    "block_without_finite_value": _forward_differs(
        Case(_contract(((0, 4100),)), [[-_INF] * 2048 + [0.5] * 2052], [3000])
    ),
    "last_block_dropped": _forward_differs(
        Case(_contract(((0, 4100),)), [[0.0] * 4096 + [9.0] * 4], [4098])
    ),
    # fp32(2103 / 0.7) = 3004.2856 but 2103 * fp32(1 / 0.7) = 3004.286: with the row's one
    # large logit, lse = z, one ulp past the bound at this magnitude.
    "temperature_reciprocal": _outside_oracle(
        Case(_contract(temperature=0.7), [[2103.0, *range(_V - 1)]], [1])
    ),
    # Fused LM head (vs torch_native_fused). Rank 1 holds live column 4 and padding 5-7,
    # whose weight rows hold garbage; the target (column 1) is rank 0's.
    "fused_sentinel_collides_with_padding": _fused_forward_differs(
        HiddenDemo(_fused_contract(_TP2, real=5), _H, _FUSED_W, [1])
    ),
    "fused_hidden_grad_missing_rank_sum": _fused_gradient_differs(
        HiddenDemo(_fused_contract(_TP2, real=5, role="train"), _H, _FUSED_W, [1])
    ),
    "fused_bias_on_padding": _fused_forward_differs(
        HiddenDemo(
            _fused_contract(_TP2, real=5, bias=True), _H, _FUSED_W, [1], [0.0] * 5 + [_INF] * 3
        )
    ),
    "fused_chunk_from_n": _fused_batch_dependent(
        HiddenDemo(
            _fused_contract(((0, 40),), rows=_WIDE_ROWS, hidden_size=16),
            _random(_WIDE_ROWS, 16),
            _random(40, 16, seed=1),
            _WIDE_TARGETS,
        )
    ),
    "long_batch_target_offset": _forward_differs(
        Case(_contract(rows=_LONG_ROWS), _random(_LONG_ROWS, _V), _LONG_TARGETS)
    ),
    "blas_row_sums": _batch_dependent(Case(_contract(rows=37), _random(37, _V) * 3, [1] * 37)),
    "fused_long_batch_target_offset": _fused_forward_differs(
        HiddenDemo(
            _fused_contract(((0, _V),), rows=_LONG_ROWS, hidden_size=4),
            _random(_LONG_ROWS, 4),
            _random(_V, 4, seed=1),
            _LONG_TARGETS,
        )
    ),
    "fused_bias_first_tile_only": _fused_forward_differs(
        HiddenDemo(
            _fused_contract(((0, _WIDE_V),), hidden_size=2, bias=True),
            _H,
            _random(_WIDE_V, 2, seed=2),
            [_WIDE_V - 1],
            bias=_random(1, _WIDE_V, seed=3)[0],
        )
    ),
    "fused_last_partial_tile_dropped": _fused_forward_differs(
        HiddenDemo(
            _fused_contract(((0, _WIDE_V),), hidden_size=2), _H, _random(_WIDE_V, 2), [_WIDE_V - 1]
        )
    ),
    "fused_blas_row_sums": _fused_batch_dependent(
        HiddenDemo(
            _fused_contract(((0, 40),), rows=37, hidden_size=16),
            _random(37, 16) * 3,
            _random(40, 16, seed=2),
            [0] * 37,
        )
    ),
    "fused_inactive_nan_into_weight_grad": _fused_gradient_differs(
        HiddenDemo(
            _fused_contract(_TP2, rows=2, real=5, mask=[True, False], role="train"),
            [[1.0, 0.5], [_NAN, _NAN]],
            _FUSED_W,
            [1, 2],
        )
    ),
    # Processed logprobs (vs torch_native). RAMP's masses exp(v - 7): 1, 0.368, 0.135, ...
    "top_k_exactly_k": _processed_differs(
        Case(
            _supported(tpl.SupportSpec(top_k=2), _TP2),
            [[0.0, 1.0, 2.0, 2.0, 2.0, 3.0, -1.0, -2.0]],
            [5],
        )
    ),
    # top_p=0.9 keeps 7, 6, 5 (mass above 5 is 1.37 < 0.9 Z = 1.42); through 5 it is 1.50.
    "top_p_inclusive_cumsum": _processed_differs(
        Case(_supported(tpl.SupportSpec(top_p=0.9)), _RAMP, [7])
    ),
    # top_k=2, top_p=0.7: over {7, 6} 6 goes (1 >= 0.7 * 1.37); over the vocabulary it stays.
    "rules_on_full_distribution": _processed_differs(
        Case(_supported(tpl.SupportSpec(top_k=2, top_p=0.7), _TP2), _RAMP, [7])
    ),
    # min_p=0.1 keeps 7, 6, 5 (Z = 1.50); top_p=0.88 then keeps 7, 6, over the vocabulary 5 too.
    "min_p_last": _processed_differs(
        Case(_supported(tpl.SupportSpec(min_p=0.1, top_p=0.88)), _RAMP, [7])
    ),
    # z = 2x: min_p=0.1 keeps 7, 6 of z, and 7, 6, 5 of x.
    "temperature_after_truncation": _processed_differs(
        Case(_supported(tpl.SupportSpec(min_p=0.1), temperature=0.5), _RAMP, [7])
    ),
    "mask_not_renormalised": _processed_differs(
        Case(_supported(tpl.SupportSpec(top_k=3)), _RAMP, [7])
    ),
    "support_per_shard": _raises(
        ReplicationError, Case(_supported(tpl.SupportSpec(top_k=2), _TP2), _RAMP, [7])
    ),
    # min_p=0.1 keeps 5, 6, 7 (v >= 7 + log 0.1); from rank 0's own max 3, it keeps 1, 2, 3.
    "min_p_local_max": _processed_differs(
        Case(_supported(tpl.SupportSpec(min_p=0.1), _TP2), _RAMP, [7])
    ),
    # Rank 1 (columns 4-7) must keep global id 6; read as a local id, 1 is global 5.
    "replayed_local_ids": _processed_differs(
        Case(_supported(tpl.SupportSpec.from_kept_lists([[1, 6]]), _TP2), _RAMP, [1])
    ),
    # One replayed mask, rows at T = 0.5 and greedy: one launch, and row 1 divided by 0.5.
    "first_row_temperature": _processed_differs(
        Case(
            dataclasses.replace(
                _supported(tpl.SupportSpec.from_kept_lists([[5, 6, 7]] * 2), rows=2),
                temperature=(0.5, 0.0),
            ),
            _RAMP * 2,
            [7, 7],
        )
    ),
}
_FUSED_DEMOS = {m.name for m in MUTANTS if m.module.startswith("fused_")}
_PROCESSED_DEMOS = {m.name for m in MUTANTS if m.module == "processed_bugs"}


def _pair(name: str) -> Pair:
    mutant = next(m for m in MUTANTS if m.name == name)
    pair: Pair = getattr(importlib.import_module(f"tests.mutants.{mutant.module}"), name)
    return pair


def test_every_mutant_has_a_demo() -> None:
    assert set(DEMOS) == {mutant.name for mutant in MUTANTS}
    assert len(MUTANTS) >= 15


@pytest.mark.parametrize("name", sorted(DEMOS))
def test_mutant_shows_its_bug(name: str) -> None:
    assert DEMOS[name](_pair(name))


@pytest.mark.parametrize("backend", ["builtin", "control"])
@pytest.mark.parametrize("name", sorted(DEMOS))
def test_unmutated_backends_do_not(name: str, backend: str) -> None:
    """The built-in base backend (torch_native, or torch_native_fused for a fused demo), and
    the control built from the mutants' parts, pass every demo."""
    builtin, control = (
        (NATIVE_FUSED, control_fused) if name in _FUSED_DEMOS else (NATIVE, control_native)
    )
    if name in _PROCESSED_DEMOS:
        control = control_processed
    assert not DEMOS[name](builtin if backend == "builtin" else control)


_CONTROL_SPECS = [
    dict(CONTROLS)[name] for name in ("control_native", "control_fused", "control_processed")
]


@pytest.mark.parametrize("spec", [m.spec for m in MUTANTS] + _CONTROL_SPECS)
def test_loads_through_the_suite_with_native_capability(spec: str) -> None:
    (backend,) = resolve_backends([spec], "cpu")
    base = TORCH_NATIVE_FUSED if spec.startswith("tests.mutants.fused_") else TORCH_NATIVE
    claimed = dataclasses.replace(backend.capability, backend_id=base.backend_id)
    lies = {
        field.name
        for field in dataclasses.fields(claimed)
        if getattr(claimed, field.name) != getattr(base, field.name)
    }
    # Base-op mutants claim neither temperature nor entropy, and no mutant claims a sampling
    # support (see _compose): narrower claims.
    narrower = {"determinism_scopes", "supports_temperature", "exports_entropy", "support_modes"}
    assert lies <= narrower, lies
    assert backend.load_failure() is None
