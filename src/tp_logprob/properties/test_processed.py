"""Processed logprobs: every backend that claims a sampling support (``support_modes``).

``docs/semantics.md``, "Processed logprobs". Cases carry a support aimed at their
logits' boundaries (:func:`~tp_logprob.strategies.supports`: ties at the k-th
value, masses on and one ulp around ``top_p``, ``min_p`` at a token's
``exp(z - M)``, replayed masks of one token, of the largest values, of random
subsets), drawn from the support modes the backend claims; a backend that claims
none skips this module, with the reason. For a backend that serves per-row
parameters (``supports_row_parameters``), two cases in three, logits or fused, are
engine batches: requests with their own temperature and rules, greedy rows among them
(``docs/semantics.md``, "Heterogeneous batches"), run whole and judged group by
group of rows that share their parameters. Each output is judged on the support the
backend used, once that support is shown admissible
(:mod:`tp_logprob.judging.processed`); a fused LM-head backend is judged on
its hidden-state cases (exact products with a recomputed support). Batch
invariance and run-to-run bits reuse their properties of ``test_determinism.py``
on processed cases, which compare the support's outputs too.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tp_logprob.contract import DeterminismScope, LogprobInputKind
from tp_logprob.errors import LogprobContractError
from tp_logprob.judging.measuring import expect_bitwise
from tp_logprob.judging.outputs import Outputs
from tp_logprob.judging.processed import backend_support, judge_support
from tp_logprob.judging.violation import PropertyInputError, format_value, violation
from tp_logprob.properties.test_determinism import batch_invariance, run_to_run
from tp_logprob.strategies import LogprobCase
from tp_logprob.strategies.supports import RULES
from tp_logprob.suite.applicability import (
    RAW_LOGPROB,
    RECOMPUTED_SUPPORT,
    REPLAYED_SUPPORT,
    SAMPLING_SUPPORT,
    SEVERAL_LAYOUTS,
    SEVERAL_RANKS,
    TRAIN_ROLE,
    applies_to,
)
from tp_logprob.suite.backends import BackendUnderTest
from tp_logprob.suite.case_kinds import (
    check_across_layouts,
    check_run_to_run_and_batch_invariance,
    relaid,
)
from tp_logprob.suite.draws import (
    draw_case,
    draw_fused_case,
    draw_processed_case,
    drawing_capability,
)
from tp_logprob.suite.expect import expect_processed_exact, expect_processed_gradient
from tp_logprob.suite.outcomes import NotApplicable
from tp_logprob.suite.profiles import scaled
from tp_logprob.suite.property import suite_property
from tp_logprob.suite.running import execute, select_rows
from tp_logprob.suite.session import Suite
from tp_logprob.suite.summary import SuiteStats
from tp_logprob.suite.variants import variants
from tp_logprob.support import SupportMode, SupportSpec

_RECOMPUTED = (SupportMode.SAMPLING_PARAMS,)


@suite_property("processed_oracle")
def processed_oracle(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """The backend's support is admissible (support_size its size, the threshold its least
    ``z``), and selected_logp, support_lse, lse and entropy are within the tolerance table
    of the exact values on it."""
    if case.contract.support is None:
        raise PropertyInputError("this check takes a case with a sampling support")
    expect_processed_exact("processed oracle", backend, case, stats)


@applies_to(SAMPLING_SUPPORT)
@given(data=st.data())
def test_processed_matches_exact_oracle_on_its_support(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """An admissible support, and every output within the tolerance table of the exact
    values on it; NaN, +inf and all -inf rows (undefined supports) included."""
    backend = tp_logprob_backend
    case = draw_processed_case(data, backend, tp_logprob_suite, special_values=True)
    processed_oracle.run(backend, case, stats=tp_logprob_suite.stats)


RULE_SETS = tuple(
    rules for size in range(1, len(RULES) + 1) for rules in itertools.combinations(RULES, size)
)
"""Every sampling rule alone and with the others: min-p, top-k, top-p, and their four unions."""


@applies_to(RECOMPUTED_SUPPORT, SEVERAL_RANKS)
@scaled(0.12)
@variants("rules", RULE_SETS, ids="+".join)
@given(data=st.data())
def test_every_sampling_rule_across_ranks(
    tp_logprob_backend: BackendUnderTest,
    tp_logprob_suite: Suite,
    data: Any,
    rules: tuple[str, ...],
) -> None:
    """Each rule alone and combined, recomputed at TP > 1, judged as the processed oracle
    property judges: a rule taken from one rank's shard instead of across the ranks (a
    local max for min-p, a local top-k, a local nucleus) shows only there, and a draw of
    every rule and layout at once reaches one rule at TP > 1 only now and then."""
    backend = tp_logprob_backend
    worlds = drawing_capability(backend).served_values("tp_world_size")
    several = [world for world in range(2, 9) if worlds is None or world in worlds]
    if not several:  # a real group of one rank
        raise NotApplicable(
            f"a property of TP > 1; {backend.backend_id} runs at TP {sorted(worlds or ())}"
        )
    case = draw_processed_case(
        data, backend, tp_logprob_suite, modes=_RECOMPUTED, tp_world_sizes=several,
        support_rules=rules,
    )  # fmt: skip
    processed_oracle.run(backend, case, stats=tp_logprob_suite.stats)


@suite_property("processed_replayed_bits")
def processed_replayed_bits(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """The support the backend recomputed from sampling parameters, replayed as a mask, gives
    the recomputed run's bits (selected_logp, lse, entropy, support_lse, support_size) on
    every row whose support is defined.

    An active target outside its row's support is moved (in both runs) to the support's
    largest ``z``, since a replayed mask refuses it; a row whose support is undefined
    replays every live column and is not compared.
    """
    contract = case.contract
    if contract.support_mode is not SupportMode.SAMPLING_PARAMS:
        raise PropertyInputError("this check takes a case with sampling parameters")
    first = execute(backend, case)
    found = backend_support(case, first)
    real = contract.sharding.real_vocab_size
    live = found.mask[:, :real]
    rows = np.arange(contract.num_tokens)
    inside = live[rows, np.clip(case.targets, 0, real - 1)]
    moved = case.active & found.defined & ~inside & live.any(axis=1)
    recomputed, run = case, first
    if moved.any():
        targets = np.array(case.targets)
        with np.errstate(invalid="ignore"):
            z = np.where(live, case.logits[:, :real].astype(np.float64), -np.inf)
        targets[moved] = np.argmax(z[moved], axis=1)
        recomputed = case.replace(targets=targets)
        run = execute(backend, recomputed)
        found = backend_support(recomputed, run)
        live = found.mask[:, :real]
    kept = SupportSpec.from_mask(np.where(found.defined[:, None], live, True))
    try:
        replayed = recomputed.replace(contract=dataclasses.replace(contract, support=kept))
        again = execute(backend, replayed)
    except LogprobContractError as error:
        raise violation(
            "replayed support: the backend's own recomputed support, replayed, was refused",
            recomputed,
            backend.backend_id,
            [("error", str(error).splitlines()[0])],
        ) from None
    defined = np.flatnonzero(found.defined)
    expect_bitwise(
        "replayed support: the backend's recomputed support, replayed as a mask, gives other bits",
        replayed,
        backend.backend_id,
        select_rows(run, defined),
        select_rows(again, defined),
        labels=("recomputed", "replayed"),
    )


@applies_to(RECOMPUTED_SUPPORT, REPLAYED_SUPPORT)
@scaled(0.4)
@given(data=st.data())
def test_replayed_own_support_gives_the_same_bits(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """Sampling parameters, then the support they gave replayed as a mask: the same bits."""
    backend = tp_logprob_backend
    case = draw_processed_case(data, backend, tp_logprob_suite, modes=_RECOMPUTED)
    processed_replayed_bits.run(backend, case)


RULES_OFF = ("top_p", "min_p", "top_k", "all three")
"""Which rules a support with every rule off names: ``top_p=1``, ``min_p=0``, a ``top_k``
at least the live vocabulary, or the three together."""


def _rules_off(params: Mapping[str, Any], real: int) -> SupportSpec:
    kind, top_k = params["rules_off"], params.get("top_k")
    if kind not in RULES_OFF:
        raise PropertyInputError(f"params.rules_off={kind!r}: expected one of {RULES_OFF}")
    if kind in ("top_k", "all three") and (top_k is None or not real <= top_k <= real + 2**20):
        raise PropertyInputError(
            f"params.top_k={top_k!r}: a top_k that keeps every column is >= {real}"
        )
    if kind == "top_p":
        return SupportSpec(top_p=1.0)
    if kind == "min_p":
        return SupportSpec(min_p=0.0)
    if kind == "top_k":
        return SupportSpec(top_k=top_k)
    return SupportSpec(top_k=top_k, top_p=1.0, min_p=0.0)


@suite_property(
    "processed_rules_off", params={"rules_off": "str", "top_k": "int"}, optional={"top_k"}
)
def processed_rules_off(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """The case (no support) with a support whose rules are all off (``params["rules_off"]``,
    ``params["top_k"]``): selected_logp, lse and entropy are bitwise the raw op's, and
    support_lse bitwise lse on every row whose support is defined (NaN where not)."""
    contract = case.contract
    if contract.support is not None:
        raise PropertyInputError("this check takes a case without a support")
    support = _rules_off(params, contract.sharding.real_vocab_size)
    processed = case.replace(contract=dataclasses.replace(contract, support=support))
    raw = execute(backend, case)
    off = execute(backend, processed)
    prop = f"rules off ({support.rules()})"
    expect_bitwise(
        f"{prop}: not bitwise the raw logprob",
        processed,
        backend.backend_id,
        Outputs(raw.selected, raw.lse, raw.results, raw.entropy),
        Outputs(off.selected, off.lse, off.results, off.entropy),
        labels=("raw", "rules off"),
    )
    found = judge_support(prop, processed, backend.backend_id, off)
    if off.lse is None:
        return
    assert off.support_lse is not None
    lse_bits = np.asarray(off.lse, np.float32).view(np.uint32)
    support_bits = np.asarray(off.support_lse, np.float32).view(np.uint32)
    wrong = np.where(found.defined, lse_bits != support_bits, ~np.isnan(off.support_lse))
    if wrong.any():
        row = int(np.flatnonzero(wrong)[0])
        raise violation(
            f"{prop}: support_lse is not bitwise lse (NaN where the support is undefined)",
            processed,
            backend.backend_id,
            [
                ("worst", f"row {row}; rows {np.flatnonzero(wrong).tolist()}"),
                ("observed", f"support_lse {format_value(off.support_lse[row])}"),
                (
                    "expected",
                    format_value(off.lse[row]) if found.defined[row] else "NaN (undefined)",
                ),
            ],
        )


@applies_to(RECOMPUTED_SUPPORT, RAW_LOGPROB)
@scaled(0.4)
@given(data=st.data())
def test_rules_off_is_the_raw_logprob(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """top_k >= live, top_p = 1, min_p = 0: bitwise the op without a support."""
    backend = tp_logprob_backend
    if backend.capability.serves("input_kind", LogprobInputKind.LOGITS):
        case = draw_case(data, backend, tp_logprob_suite, special_values=True)
    else:  # exact products: the threshold is read on the backend's x, which is then the case's
        case = draw_fused_case(data, backend, tp_logprob_suite, small_integers=True)
    real = case.contract.sharding.real_vocab_size
    params = {
        "rules_off": data.draw(st.sampled_from(RULES_OFF), label="rules off"),
        "top_k": real + data.draw(st.integers(0, 3), label="top_k past the vocabulary"),
    }
    processed_rules_off.run(backend, case, params)


@suite_property(
    "processed_tp_consistency", params={"tp_rank": "int", "vocab_shard_bounds": "bounds"}
)
def processed_tp_consistency(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """The layout ``params["vocab_shard_bounds"]`` (seen by ``params["tp_rank"]``): bitwise,
    the support's outputs included, for cross_tp_bitwise; else an admissible support and
    every output within tolerance of the exact values on it, at both layouts."""
    contract = case.contract
    if contract.support is None:
        raise PropertyInputError("this check takes a case with a sampling support")
    other, layouts = relaid(case, params)
    if contract.reduction.determinism_scope.satisfies(DeterminismScope.CROSS_TP_BITWISE):
        expect_bitwise(
            f"processed cross-TP bitwise: layouts {layouts[0]} and {layouts[1]} differ",
            case,
            backend.backend_id,
            execute(backend, case),
            execute(backend, other),
            labels=layouts,
        )
        return
    for layout, subject in zip(layouts, (case, other), strict=True):
        expect_processed_exact(
            f"processed TP consistency (layout {layout})", backend, subject, count_ulps=False
        )


@applies_to(SAMPLING_SUPPORT, SEVERAL_LAYOUTS)
@scaled(0.5)
@given(data=st.data())
def test_processed_tp_consistency(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """Another TP degree and shard layout: bitwise (the support too) for cross_tp_bitwise,
    else admissible and within tolerance at both layouts."""
    check_across_layouts(
        data, tp_logprob_backend, tp_logprob_suite, "processed", processed_tp_consistency
    )


@suite_property("processed_gradients")
def processed_gradients(
    backend: BackendUnderTest,
    case: LogprobCase,
    params: Mapping[str, Any],
    *,
    stats: SuiteStats | None = None,
) -> None:
    """Role train: the gradient of ``w selected_logp + v entropy`` is exactly 0 outside the
    backend's support (the target's column too) and within the gradient bounds of the exact
    one on it."""
    if case.contract.support is None:
        raise PropertyInputError("this check takes a case with a sampling support")
    expect_processed_gradient("processed gradients", case, backend, stats)


@applies_to(SAMPLING_SUPPORT, TRAIN_ROLE)
@scaled(0.5)
@given(data=st.data())
def test_processed_gradients(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """Zero outside the support, within bound of the exact gradient on it; rows sum to their
    exact sums (0, or -w / T where the target lies outside the support)."""
    backend = tp_logprob_backend
    case = draw_processed_case(data, backend, tp_logprob_suite, roles={"train"})
    processed_gradients.run(backend, case, stats=tp_logprob_suite.stats)


@applies_to(SAMPLING_SUPPORT)
@scaled(0.3)
@given(data=st.data())
def test_processed_run_to_run_and_batch_invariance(
    tp_logprob_backend: BackendUnderTest, tp_logprob_suite: Suite, data: Any
) -> None:
    """Two runs give the same bits, and rows run as their own batch keep their bits (unless
    the backend claims run_to_run only): support_lse, support_size and the threshold too."""
    check_run_to_run_and_batch_invariance(
        data, tp_logprob_backend, tp_logprob_suite, "processed", run_to_run, batch_invariance
    )
