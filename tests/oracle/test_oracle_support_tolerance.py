"""The support margins are sound (simulated fp32 backends, with exps pushed to the edge
of their error budget and sums in the orders that drift most, never keep a certainly-out
token nor drop a certainly-in one) and tight (the same backends flip decisions deep into
the borderline band). ``python tests/oracle/test_oracle_support_tolerance.py`` prints the
measured depths on long rows.

Three backends, each on ``z`` (temperature is exact in both, so it plays no part):

* ``direct``: ``e = exp32(fl(z - M))``; min-p keeps ``e >= fl(min_p)``; top-p sums the
  survivors by shards (local maxima, partials rescaled by ``exp32(m_r - M)`` and merged
  in fp32), the mass above each value by a descending fp32 cumulative sum, and keeps
  ``A < fl(fl(top_p) Z)``;
* ``normalised``: vLLM's order of work: probabilities ``fl(e / Z)``, min-p against
  ``fl(max p * fl(min_p))``, top-p on the survivors renormalised, an ascending fp32
  cumulative sum compared with ``fl(1 - fl(top_p))``, the largest value always kept;
* ``fixed``: ``floor(e 2^K)`` in int64 with ``K = 62 - ceil(log2 V)``, exact sums,
  ``A < fl(top_p) Z`` decided exactly.

Each keeps the largest value whatever its sums say, as the semantics require (the
argmax always survives top-p) and as vLLM does; a kernel needs that rule explicitly
where ``fl(top_p)`` or ``fl(top_p) Z`` underflows.

``exp32`` is the correctly rounded fp32 exp moved by up to two fp32 ulps (so within the
model's 3), monotone in its argument and exactly 1 at 0; the argument may be scaled by
``fl(log2 e)`` first, as ``exp2``-based kernels do (assumption A4).
"""

from __future__ import annotations

import itertools
import math
import os
import sys
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tp_logprob.oracle import (
    SupportMargins,
    admissible_support,
    classify_support,
    exact_support,
    support_margins,
)

F32 = np.float32
INF = math.inf
SETTINGS = settings(
    max_examples=int(os.environ.get("TP_LOGPROB_ORACLE_EXAMPLES", "120")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
WORST: dict[str, float] = {}


def exp32(args: np.ndarray, shift: np.ndarray, scaled: bool) -> np.ndarray:
    """fp32 ``exp`` of fp32 arguments, ``shift`` ulps from correctly rounded, monotone."""
    with np.errstate(under="ignore", over="ignore"):
        if scaled:
            exact = np.exp2((args * F32(1.4426950408889634)).astype(np.float64))
        else:
            exact = np.exp(args.astype(np.float64))
        bits = exact.astype(F32).view(np.int32).astype(np.int64) + shift
    out = np.clip(bits, 0, None).astype(np.int32).view(F32)
    out = np.where(args == 0, F32(1), np.where(args == -INF, F32(0), out))
    order = np.argsort(args, kind="stable")
    out[order] = np.maximum.accumulate(out[order])  # a monotone exp
    return out.astype(F32)


def sum32(terms: np.ndarray, order: str) -> Any:
    if terms.size == 0:
        return F32(0)
    if order == "sequential":
        return F32(np.cumsum(terms, dtype=F32)[-1])
    return F32(terms.sum(dtype=F32))


def _masses(z: np.ndarray, shift_of: Callable[[np.ndarray], np.ndarray], scaled: bool) -> Any:
    """Per column ``exp32(fl(z - M))``, computed once per distinct value (ties agree)."""
    values, inverse = np.unique(z, return_inverse=True)
    with np.errstate(invalid="ignore"):
        args = (values.astype(F32) - F32(z.max())).astype(F32)
    return exp32(args, shift_of(values), scaled)[inverse]


def _top_k(z: np.ndarray, keep: np.ndarray, top_k: int | None) -> np.ndarray:
    if top_k is None or keep.sum() <= top_k:
        return keep
    return keep & (z >= np.sort(z[keep])[::-1][top_k - 1])


def _by_value(z: np.ndarray, keep: np.ndarray, kept_values: np.ndarray) -> np.ndarray:
    return keep & np.isin(z, kept_values)


def direct(z: np.ndarray, rules: dict[str, Any], sim: dict[str, Any]) -> np.ndarray:
    e = _masses(z, sim["shift"], sim["scaled"])
    keep = np.ones(z.size, bool) if rules["min_p"] is None else e >= F32(rules["min_p"])
    keep = _top_k(z, keep, rules["top_k"])
    if rules["top_p"] is None:
        return keep
    big_m = F32(z.max())
    total = F32(0)
    for a, b in sim["bounds"]:
        part = np.where(keep[a:b], z[a:b], -INF).astype(F32)
        if part.size == 0 or part.max() == -INF:
            continue
        m = F32(part.max())
        local = _masses_against(part, m, sim)
        scale = exp32(np.array([F32(m - big_m)]), sim["shift"](np.array([m])), sim["scaled"])[0]
        total = F32(total + F32(sum32(local, sim["order"]) * scale))
    order = np.argsort(-z[keep], kind="stable")
    values, masses = z[keep][order], e[keep][order]
    above = np.concatenate([[F32(0)], np.cumsum(masses, dtype=F32)[:-1]]).astype(F32)
    first = np.searchsorted(-values, -values, side="left")
    bar = F32(F32(rules["top_p"]) * total)
    # The maximum is kept even where fl(top_p) or the product underflows to 0.
    return _by_value(z, keep, values[(above[first] < bar) | (first == 0)])


def _masses_against(part: np.ndarray, m: Any, sim: dict[str, Any]) -> np.ndarray:
    values, inverse = np.unique(part, return_inverse=True)
    with np.errstate(invalid="ignore"):
        args = (values - m).astype(F32)
    return exp32(args, sim["shift"](values), sim["scaled"])[inverse]


def normalised(z: np.ndarray, rules: dict[str, Any], sim: dict[str, Any]) -> np.ndarray:
    e = _masses(z, sim["shift"], sim["scaled"])
    with np.errstate(under="ignore"):
        probs = (e / sum32(e, sim["order"])).astype(F32)
    keep = np.ones(z.size, bool)
    if rules["min_p"] is not None:
        keep = probs >= F32(probs.max() * F32(rules["min_p"]))
    keep = _top_k(z, keep, rules["top_k"])
    if rules["top_p"] is None:
        return keep
    with np.errstate(under="ignore"):
        p2 = (e[keep] / sum32(e[keep], sim["order"])).astype(F32)
    order = np.argsort(z[keep], kind="stable")
    values = z[keep][order]
    below = np.cumsum(p2[order], dtype=F32)
    last = np.searchsorted(values, values, side="right") - 1  # each value's last position
    bar = F32(F32(1) - F32(rules["top_p"]))
    # vLLM keeps the largest value whatever the sums say (here with its ties).
    return _by_value(z, keep, values[(below[last] > bar) | (values == values[-1])])


def fixed(z: np.ndarray, rules: dict[str, Any], sim: dict[str, Any]) -> np.ndarray:
    bits = fixed_bits(z.size)
    e = _masses(z, sim["shift"], sim["scaled"])
    q = [int(v) for v in np.floor(e.astype(np.float64) * 2.0**bits)]
    keep = np.ones(z.size, bool)
    if rules["min_p"] is not None:
        threshold = Fraction(float(F32(rules["min_p"]))) * 2**bits
        keep = np.array([v >= threshold for v in q])
    keep = _top_k(z, keep, rules["top_k"])
    if rules["top_p"] is None:
        return keep
    p = Fraction(float(F32(rules["top_p"])))
    total = sum(v for v, k in zip(q, keep, strict=True) if k)
    kept_values = [
        w
        for w in np.unique(z[keep])
        if sum(v for v, k, y in zip(q, keep, z, strict=True) if k and y > w) < p * total
        or w == z.max()
    ]
    return _by_value(z, keep, np.array(kept_values))


def fixed_bits(width: int) -> int:
    return 62 - math.ceil(math.log2(max(width, 2)))


BACKENDS = {"direct": direct, "normalised": normalised, "fixed": fixed}


def margins_for(backend: str, sim: dict[str, Any], width: int) -> SupportMargins:
    if backend == "fixed":
        return support_margins("fp32", width, fixed_point_bits=fixed_bits(width))
    bounds = sim["bounds"]
    widest = max(b - a for a, b in bounds)
    return support_margins("fp32", width, num_shards=len(bounds), max_shard_size=widest)


def flip_depth(
    z: np.ndarray, rules: dict[str, Any], margins: SupportMargins, got: np.ndarray
) -> float:
    """How deep into the borderline band the deepest flipped decision lies (1 = its edge).

    With min-p alone, a flip at ``v`` is ``|log(e_v / min_p)|`` over the band's half-width
    ``a |d| + term_rel + threshold_rel``; with top-p and no min-p (so the backend's
    survivors are the exact ones), ``|A_v - p Z| / (mu Z)``. Other rules: 0.
    """
    flips = got != exact_support(z[None], **rules).mask[0]
    if not flips.any():
        return 0.0
    d = z - z.max()
    mass = np.exp(d)
    if rules["min_p"] is not None and rules["top_k"] is None and rules["top_p"] is None:
        band = margins.arg_rel * np.abs(d) + margins.term_rel + margins.threshold_rel
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios = np.abs(np.log(mass / rules["min_p"])) / band
        return float(np.where(np.isfinite(ratios), ratios, 0.0)[flips].max())
    if rules["top_p"] is not None and rules["min_p"] is None:
        survivors = exact_support(z[None], top_k=rules["top_k"]).mask[0]
        total = mass[survivors].sum()
        _, inverse = np.unique(np.where(survivors, z, -INF), return_inverse=True)
        group = np.bincount(inverse, weights=np.where(survivors, mass, 0.0))
        above = (group[::-1].cumsum()[::-1] - group)[inverse]  # mass of larger values
        mu = margins.top_p_margin(rules["top_p"])
        return float((np.abs(above - rules["top_p"] * total) / (mu * total))[flips].max())
    return 0.0


@st.composite
def simulations(draw: st.DrawFn, width: int) -> dict[str, Any]:
    mode = draw(st.sampled_from(["up", "down", "random"]), label="exp rounding")
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))

    def shift(values: np.ndarray) -> np.ndarray:
        if mode == "random":
            return rng.integers(-2, 3, size=values.shape)
        return np.full(values.shape, 2 if mode == "up" else -2)

    cuts = sorted(draw(st.lists(st.integers(0, width), max_size=4), label="shard cuts"))
    edges = [0, *cuts, width]
    return {
        "shift": shift,
        "scaled": draw(st.booleans(), label="exp2 argument"),
        "order": draw(st.sampled_from(["sequential", "pairwise"]), label="sum order"),
        "bounds": [(a, b) for a, b in itertools.pairwise(edges) if b > a] or [(0, 0)],
    }


@st.composite
def near_boundary(draw: st.DrawFn) -> tuple[np.ndarray, dict[str, Any]]:
    """A row and rules placed within a few margins of one of its decisions."""
    width = draw(st.integers(2, 64), label="width")
    offset = draw(st.sampled_from([0.0, 100.0, -1000.0]), label="offset")
    body = st.one_of(
        st.floats(-12, 0, width=32), st.sampled_from([0.0, -0.6931471, -16.635532, -INF])
    )
    x = draw(hnp.arrays(F32, width, elements=body), label="row")
    z = (x + F32(offset)).astype(F32).astype(np.float64)
    if not np.isfinite(z).any():
        z[0] = offset
    mass = np.exp(z - z.max())
    pick = draw(st.integers(0, width - 1), label="token")
    spread = draw(st.one_of(st.floats(-0.4, 0.4), st.floats(-1.5, 1.5)), label="depth")
    margins = support_margins("fp32", width)
    mode = draw(st.sampled_from(["min_p", "top_p", "all"]), label="rules")
    rules: dict[str, Any] = {"top_k": None, "min_p": None, "top_p": None}
    if mode == "all":
        rules["top_k"] = draw(st.one_of(st.none(), st.integers(1, width)), label="top_k")
    if mode != "top_p" and 0 < mass[pick] < 1:
        d = abs(z[pick] - z.max())
        band = margins.arg_rel * d + margins.term_rel + margins.threshold_rel
        rules["min_p"] = float(min(1.0, mass[pick] * math.exp(-spread * band)))
    if mode != "min_p":
        pre = exact_support(z[None], top_k=rules["top_k"], min_p=rules["min_p"]).mask[0]
        ratio = mass[pre & (z > z[pick])].sum() / mass[pre].sum()
        p = float(ratio + spread * margins.top_p_margin(ratio))
        rules["top_p"] = p if 0 < p < 1 else None
    return z, rules


@SETTINGS
@given(case=near_boundary(), data=st.data())
def test_simulated_backends_stay_admissible(
    case: tuple[np.ndarray, dict[str, Any]], data: st.DataObject
) -> None:
    z, rules = case
    sim = data.draw(simulations(z.size), label="simulation")
    for name, backend in BACKENDS.items():
        margins = margins_for(name, sim, z.size)
        got = backend(z, rules, sim)
        c = classify_support(z[None], margins=margins, **rules)
        assert admissible_support(c, got[None]) == [], (name, z.tolist(), rules)
        depth = flip_depth(z, rules, margins, got)
        target(depth, label=name)
        WORST[name] = max(WORST.get(name, 0.0), depth)
    print_worst()


def print_worst() -> None:
    if os.environ.get("TP_LOGPROB_ORACLE_EXAMPLES"):
        sys.stderr.write(f"\rworst flip depth: {WORST}")


def half_ulp_row(width: int) -> np.ndarray:
    """One ``0`` and ``width - 1`` copies of the smallest fp32 ``x`` with ``exp(x) > 2^-24``:
    every sequential fp32 addition to a partial sum near 1 rounds up by half an ulp."""
    x = F32(math.log(2.0**-24))
    while math.exp(float(x)) <= 2.0**-24:
        x = np.nextafter(x, F32(1))
    return np.array([0.0] + [float(x)] * (width - 1))


def sequential_sim(width: int, mode: str) -> dict[str, Any]:
    return {
        "shift": lambda values: np.full(values.shape, 2 if mode == "up" else -2),
        "scaled": False,
        "order": "sequential",
        "bounds": [(0, width)],
    }


def top_p_depth(width: int) -> float:
    """The direct backend on a half-ulp row, ``top_p`` between ``A / Z`` of its tie (exact)
    and ``A / Z_hat`` (the backend's, whose ``Z_hat`` every addition rounded up)."""
    z = half_ulp_row(width)
    sim = sequential_sim(width, "up")
    exact_ratio = 1.0 / np.exp(z).sum()
    backend_ratio = 1.0 / float(sum32(_masses(z, sim["shift"], False), "sequential"))
    margins = margins_for("direct", sim, width)
    best = 0.0
    for fraction in (0.9, 0.7, 0.5, 0.3, 0.1):
        top_p = exact_ratio - fraction * (exact_ratio - backend_ratio)
        rules = {"top_k": None, "min_p": None, "top_p": top_p}
        got = direct(z, rules, sim)
        c = classify_support(z[None], margins=margins, **rules)
        assert admissible_support(c, got[None]) == []
        best = max(best, flip_depth(z, rules, margins, got))
    return best


def min_p_depth(width: int, backend: str = "direct") -> float:
    """A mass three ulps above 1/2 (an ulp is largest relative to the value there, and
    ``|d|`` small), ``min_p`` a little below it, and exps rounded down by two ulps."""
    x = F32(math.log(0.5))
    while math.exp(float(x)) <= 0.5 * (1 + 3 * 2.0**-23):
        x = np.nextafter(x, F32(1))
    z = np.array([0.0] + [float(x)] * (width - 1))
    sim = sequential_sim(width, "down")
    margins = margins_for(backend, sim, width)
    mass = math.exp(z[1])
    band = margins.arg_rel * abs(z[1]) + margins.term_rel + margins.threshold_rel
    best = 0.0
    for fraction in np.linspace(0.05, 0.5, 10):
        rules = {"top_k": None, "top_p": None, "min_p": mass * (1 - fraction * band)}
        got = BACKENDS[backend](z, rules, sim)
        c = classify_support(z[None], margins=margins, **rules)
        assert admissible_support(c, got[None]) == []
        best = max(best, flip_depth(z, rules, margins, got))
    return best


def test_top_p_flips_reach_into_the_band() -> None:
    assert top_p_depth(64) > 0.2


def test_min_p_flips_reach_into_the_band() -> None:
    assert min_p_depth(64) > 0.15


if __name__ == "__main__":
    for size in (64, 1024, 32000):
        minp = ", ".join(f"{name} {min_p_depth(size, name):.3f}" for name in BACKENDS)
        print(f"V={size}: top-p depth (direct) {top_p_depth(size):.3f}, min-p depth {minp}")
