"""Each declared order's bound is sound: fp32 sums in that order never exceed it, under a
Hypothesis search that targets ``error / bound`` on random rows and on rows built to make
every addition of some order round up (``tp_logprob.strategies.order_rows``)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import example, given, target
from hypothesis import strategies as st

from tests.helpers.order_sums import Realization, order_logprob
from tests.oracle.test_oracle_tolerance import SETTINGS, Case, fp32_cases
from tp_logprob.accumulation import AccumulationOrder
from tp_logprob.oracle import exact_selected_logprob, tolerance
from tp_logprob.strategies.order_rows import ORDER_LAYOUTS, order_layout, order_row

REALIZATIONS = [
    Realization("sequential"),
    Realization("tree"),
    Realization("tree", fan_in=3),
    Realization("lanes", block=4),
    Realization("lanes", block=4, within="tree"),
    Realization("blocks", block=4),
    Realization("blocks", block=8, within="tree", across="tree"),
    Realization("online", block=4),
    Realization("online", block=4, within="tree"),
    Realization("sequential", edge=True),
    Realization("tree", edge=True),
    Realization("lanes", block=4, within="tree", edge=True),
    Realization("online", block=4, edge=True),
]


@st.composite
def adversarial_cases(draw: st.DrawFn, how: Realization) -> Case:
    """A half-ulp row laid out for one order, on one rank; the other ranks' terms small."""
    width = draw(st.integers(1, 300), label="shard width")
    layout = draw(st.sampled_from(ORDER_LAYOUTS), label="layout")
    block = draw(st.sampled_from([how.block, 3, 16]), label="layout block")
    groups = order_layout(
        layout, width, block=block, fan_in=how.fan_in, tree_inside=how.within == "tree"
    )
    top = draw(st.sampled_from([0.0, 1.0, 100.0]), label="maximum")
    shard = order_row(groups, width, "fp32", top=top)
    ranks = draw(st.integers(1, 4), label="ranks")
    holder = draw(st.integers(0, ranks - 1), label="rank of the maximum")
    small = np.float32(top - 17.0 - np.log(width))
    row = np.concatenate(
        [shard if r == holder else np.full(width, small, np.float32) for r in range(ranks)]
    )
    edges = [r * width for r in range(ranks + 1)]
    return row, holder * width, row.size, list(itertools.pairwise(edges))


def _ratios(order: AccumulationOrder, case: Case, sel: float, lse: float) -> tuple[float, float]:
    row, t, rv, bounds = case
    widest = max(max(0, min(b, rv) - a) for a, b in bounds)
    tol = tolerance("fp32", rv, num_shards=len(bounds), max_shard_size=max(widest, 1), order=order)
    want_sel, want_lse = exact_selected_logprob(row[None, :], [t], real_vocab_size=rv)
    if not (np.isfinite(want_lse[0]) and np.isfinite(want_sel[0])):
        assert not tol.violations([sel], [lse], want_sel, want_lse).any()
        return 0.0, 0.0
    row_max = [float(row[:rv].max())]
    lse_b = float(tol.lse_bound(want_lse, row_max=row_max)[0])
    sel_b = float(tol.selected_bound(want_sel, want_lse, row_max=row_max)[0])
    return abs(lse - float(want_lse[0])) / lse_b, abs(sel - float(want_sel[0])) / sel_b


def _label(how: Realization) -> str:
    return how.label() + (", exp and log at their edge" if how.edge else "")


@pytest.mark.parametrize("how", REALIZATIONS, ids=_label)
def test_declared_order_bound_is_sound(how: Realization) -> None:
    worst = {"lse": 0.0, "selected": 0.0}

    @SETTINGS
    @given(case=fp32_cases() | adversarial_cases(how))
    @example(case=(np.array([0.0, *[-16.63553] * 63], np.float32), 0, 64, [(0, 64)]))
    def search(case: Case) -> None:
        sel, lse = order_logprob(*case, how)
        r_lse, r_sel = _ratios(how.declared, case, sel, lse)
        target(r_lse, label="lse error / bound")
        target(r_sel, label="selected error / bound")
        worst["lse"] = max(worst["lse"], r_lse)
        worst["selected"] = max(worst["selected"], r_sel)
        assert r_lse <= 1.0 and r_sel <= 1.0

    search()
    print(f"\n{_label(how)}: worst lse/bound {worst['lse']:.3f}, selected {worst['selected']:.3f}")


@pytest.mark.parametrize(
    ("how", "layout", "floor"),
    [
        (Realization("sequential"), "sequential", 0.95),
        (Realization("lanes", block=16), "lanes", 0.9),
        (Realization("blocks", block=64, within="tree"), "blocks", 0.75),
    ],
    ids=["sequential", "lanes", "blocks"],
)
def test_rows_built_for_an_order_reach_its_bound(
    how: Realization, layout: str, floor: float
) -> None:
    width = 8192
    groups = order_layout(
        layout, width, block=how.block, fan_in=how.fan_in, tree_inside=how.within == "tree"
    )
    row = order_row(groups, width, "fp32")
    case = (row, 0, width, [(0, width)])
    assert floor < _ratios(how.declared, case, *order_logprob(*case, how))[0] <= 1.0


def test_a_sequential_sum_breaks_a_declared_tree() -> None:
    width = 256
    row = order_row(order_layout("sequential", width), width, "fp32")
    case = (row, 0, width, [(0, width)])
    sequential = order_logprob(*case, Realization("sequential"))
    assert _ratios(AccumulationOrder.tree(), case, *sequential)[0] > 2.0
    assert _ratios(AccumulationOrder.any(), case, *sequential)[0] <= 1.0
