"""The rollout check drawn: every token against the noise band, and the importance ratios.

Left, each judged token's ``log p_engine - log p_oracle`` against its oracle logprob,
coloured by verdict, over the band the logit noise allows at the median token's
``eps_t`` and, lighter, at the largest (it narrows toward log p = 0, where a
nearly certain token barely moves) and the op's bound. Each panel's legend sits
outside its axes, so it hides no point. Right,
the log importance ratios stacked by verdict, with the [0.9, 1.1] band and the
clip. Non-finite tokens are counted and named in the title. Drawn on a
matplotlib ``Figure`` of its own (the object API; no global backend is chosen).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.rollout.noise import noise_interval
from tp_logprob.rollout.report import CLEAN, NOT_JUDGED, RolloutCheck
from tp_logprob.rollout.units import BAND

__all__ = ["plot_rollout"]

COLOURS = {
    "agree": "#9e9e9e",
    "noise": "#1f77b4",
    "borderline": "#17becf",
    "temperature_missing": "#d62728",
    "temperature_twice": "#ff7f0e",
    "temperature_other": "#bcbd22",
    "unrenormalised": "#9467bd",
    "raw": "#8c564b",
    "recomputed_mask": "#e377c2",
    "stale_policy": "#2ca02c",
    "unexplained": "#000000",
    "support": "#e6b800",
    "trainer_temperature": "#7f7f00",
    "trainer_numerics": "#4d4d4d",
}
MAX_TICKS_PER_SIDE = 4


def plot_rollout(check: RolloutCheck, path: str) -> None:
    """Write the PNG at ``path`` (needs matplotlib: ``pip install 'tp-logprob[plot]'``)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise RuntimeError(
            "--plot needs matplotlib: pip install 'tp-logprob[plot]' (or matplotlib>=3.7)"
        ) from None
    figure = Figure(figsize=(17, 5.6), layout="constrained")
    FigureCanvasAgg(figure)
    left, right = figure.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    _tokens(left, check)
    _ratios(right, check)
    bad = check.nonfinite()
    named = ", ".join(str(t) for t in bad[:8]) + (" ..." if len(bad) > 8 else "")
    title = (
        f"{check.engine}: {check.token_ids.size} tokens, {len(check.responses)} response(s); "
        f"engine at fault on {len(check.engine_at_fault())}; eps_t = {check.noise.a:.3g} + "
        f"{check.noise.b:.3g} m_t, median {check.noise.eps:.3g} ({check.noise.source})"
    )
    if bad:
        title += f"; {len(bad)} non-finite token(s) not drawn: {named}"
    figure.suptitle(title, fontsize=11)
    figure.savefig(path, dpi=100)


def _verdicts(check: RolloutCheck) -> list[str]:
    return [v for v in dict.fromkeys(check.verdict) if v in COLOURS]


def _tokens(axis: Any, check: RolloutCheck) -> None:
    verdicts = np.array(check.verdict, dtype=object)
    with np.errstate(invalid="ignore"):
        diff = check.engine_logprob - check.oracle
    drawn = np.isfinite(diff) & np.isfinite(check.oracle)
    low_x = float(np.min(check.oracle[drawn], initial=-1.0))
    grid = -np.geomspace(max(-low_x, 1e-6) * 1.05, 1e-9, 400)
    t = float(check.settings["engine_temperature"])
    sizes = check.noise.per_token
    eps = check.noise.eps
    widest = float(sizes.max(initial=eps))
    bound = float(np.median(check.bound[drawn])) if drawn.any() else 0.0
    if widest > eps:
        wide_low, wide_high = noise_interval(grid, widest, t)
        axis.fill_between(
            grid, wide_low - grid - bound, wide_high - grid + bound, color="#1f77b4",
            alpha=0.07, label=f"noise band at the largest eps_t ({widest:.3g})",
        )  # fmt: skip
    band_low, band_high = noise_interval(grid, eps, t)
    axis.fill_between(
        grid, band_low - grid - bound, band_high - grid + bound, color="#1f77b4", alpha=0.15,
        label=f"noise band at the median eps_t ({eps:.3g}) and op bound",
    )  # fmt: skip
    band_high = noise_interval(grid, widest, t)[1]
    axis.axhline(bound, color="#555555", lw=0.8, ls=":", label=f"op bound ({bound:.2g})")
    axis.axhline(-bound, color="#555555", lw=0.8, ls=":")
    for verdict in _verdicts(check):
        inside = drawn & (verdicts == verdict)
        if inside.any():
            axis.scatter(
                check.oracle[inside], diff[inside], s=9, color=COLOURS[verdict],
                label=f"{verdict} ({int(inside.sum())})", zorder=3,
                alpha=0.55 if verdict in CLEAN else 0.9,
            )  # fmt: skip
    top = float(np.max(np.abs(diff[drawn]), initial=0.0))
    top = max(top, float(np.max(np.abs(band_high - grid)) + bound), 1e-12) * 1.3
    floor = max(bound, 1e-12)
    _symlog(axis, "y", floor, top)
    axis.set_ylim(-top, top)
    axis.set_xlabel("oracle log p of the sampled token (over the engine's mask)")
    axis.set_ylabel("log p_engine - log p_oracle")
    axis.set_title("every token against the logit noise")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _ratios(axis: Any, check: RolloutCheck) -> None:
    from matplotlib.ticker import MaxNLocator

    ratio = check.log_ratio()
    verdicts = np.array(check.verdict, dtype=object)
    finite = np.isfinite(ratio)
    clip = float(check.settings["clip"])
    top = max(float(np.max(np.abs(ratio[finite]), initial=0.0)), math.log1p(clip)) * 1.2
    floor = max(top * 1e-6, 1e-9)
    half = np.geomspace(floor, top, 24)
    edges = np.concatenate([-half[::-1], half])
    stacks, labels, colours = [], [], []
    for verdict in _verdicts(check):
        inside = finite & (verdicts == verdict)
        if inside.any() and verdict not in NOT_JUDGED:
            stacks.append(np.clip(ratio[inside], -top, top))
            labels.append(f"{verdict} ({int(inside.sum())})")
            colours.append(COLOURS[verdict])
    if stacks:
        axis.hist(stacks, bins=edges, stacked=True, color=colours, label=labels)
    for value, style, label in (
        (math.log1p(BAND), "--", f"ratio {1 - BAND:g} / {1 + BAND:g}"),
        (math.log1p(clip), "-", f"clip {1 - clip:g} / {1 + clip:g}"),
    ):
        axis.axvline(value, color="#d62728", ls=style, lw=1, label=label)
        axis.axvline(math.log1p(-BAND if style == "--" else -clip), color="#d62728", ls=style, lw=1)
    _symlog(axis, "x", floor, top)
    axis.yaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_xlabel("log importance ratio, log p_trainer - log p_engine")
    axis.set_ylabel("tokens")
    axis.set_title("importance ratios by verdict")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _symlog(axis: Any, which: str, floor: float, top: float) -> None:
    """A symlog axis linear within ``floor`` with at most a few labelled decades per side,
    so the labels never run into each other."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    low, high = math.floor(math.log10(floor)), math.ceil(math.log10(top))
    step = max(1, math.ceil((high - low + 1) / MAX_TICKS_PER_SIDE))
    decades = [10.0**k for k in range(high, low - 1, -step)][::-1]
    ticks: npt.NDArray[np.float64] = np.array([*(-d for d in decades[::-1]), 0.0, *decades])
    scale = {"linthresh": 10.0**low, "linscale": 0.5}
    target = axis.yaxis if which == "y" else axis.xaxis
    (axis.set_yscale if which == "y" else axis.set_xscale)("symlog", **scale)
    target.set_major_locator(FixedLocator(ticks.tolist()))
    target.set_minor_locator(NullLocator())
    target.set_major_formatter(FuncFormatter(_decade))


def _decade(value: float, _: Any) -> str:
    if value == 0:
        return "0"
    exponent = round(math.log10(abs(value)))
    return f"{'-' if value < 0 else ''}1e{exponent}"
