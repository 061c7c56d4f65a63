"""The noise model: the log-odds bound holds for every perturbation and is reached; the estimate
finds a clean two-pass rollout clean; the RL units are the textbook ones."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tp_logprob.rollout.noise import (
    MIN_TOKENS,
    estimate_noise,
    given_noise,
    log_odds,
    median_line,
    noise_interval,
    token_magnitude,
    token_shift,
)
from tp_logprob.rollout.units import k3, rl_units


def _logprob(z: np.ndarray, y: int) -> float:
    """``z_y - LSE(z)`` from the log-odds, ``-log(1 + exp(-(z_y - LSE_{others})))``: a
    dominant token's logprob keeps its digits (``z_y - LSE(z)`` rounds it to 0)."""
    others = np.delete(z, y)
    top = others.max()
    odds = z[y] - top - math.log(np.exp(others - top).sum())
    return float(-np.logaddexp(0.0, -odds))


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(2, 40),
    seed=st.integers(0, 2**32 - 1),
    eps=st.floats(1e-4, 2.0),
    temperature=st.sampled_from([0.3, 0.7, 1.0, 1.5]),
)
def test_no_perturbation_of_eps_leaves_the_interval(
    size: int, seed: int, eps: float, temperature: float
) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 4.0, size)
    y = int(rng.integers(size))
    reference = _logprob(x / temperature, y)
    low, high = noise_interval(np.array([reference]), eps, temperature)
    slack = 1e-12 * (1.0 + abs(reference))
    for _ in range(20):
        d = rng.uniform(-eps, eps, size)
        d[rng.random(size) < 0.5] = eps * rng.choice([-1.0, 1.0])
        value = _logprob((x + d) / temperature, y)
        assert low[0] - slack <= value <= high[0] + slack


@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("sampled", [0, 3])
def test_the_bound_is_reached_by_plus_eps_on_the_token_and_minus_eps_elsewhere(
    temperature: float, sampled: int
) -> None:
    x = np.array([3.0, 1.0, -2.0, 0.5, -1.0])
    eps = 0.3
    reference = _logprob(x / temperature, sampled)
    low, high = noise_interval(np.array([reference]), eps, temperature)
    up = np.full(x.size, -eps)
    up[sampled] = eps
    assert _logprob((x + up) / temperature, sampled) == pytest.approx(high[0], abs=1e-12)
    assert _logprob((x - up) / temperature, sampled) == pytest.approx(low[0], abs=1e-12)
    # Tighter than 2 eps / T wherever the token is likely: here p = 0.83 for token 0.
    if sampled == 0:
        assert high[0] - reference < 0.5 * 2 * eps / temperature


def test_a_certain_token_stays_certain_and_log_odds_invert() -> None:
    low, high = noise_interval(np.array([0.0, -math.inf]), 1.0, 0.7)
    assert low.tolist() == [0.0, -math.inf] and high.tolist() == [0.0, -math.inf]
    lp = np.array([-1e-9, -0.5, -30.0])
    back, _ = noise_interval(lp, 0.0, 1.0)
    assert np.allclose(back, lp, rtol=1e-12)
    assert math.isinf(float(log_odds(np.array([0.0]))[0]))
    assert token_shift(np.array([-1.0]), np.array([-1.0]), 0.7)[0] == 0.0


def test_the_estimate_covers_a_clean_run_and_ignores_what_a_cause_fits() -> None:
    rng = np.random.default_rng(0)
    magnitude = rng.uniform(5.0, 40.0, 4000)
    shift = np.abs(rng.normal(0.0, 1.0, 4000)) * (0.002 + 0.001 * magnitude)
    none = np.full((1, 4000), np.nan)  # a cause that predicts nothing
    clean = estimate_noise(shift, none, magnitude, largest_logit=40.0)
    assert clean.source == "estimated"
    assert clean.a == pytest.approx(6 * 0.002, rel=0.5)
    assert clean.b == pytest.approx(6 * 0.001, rel=0.1)
    assert (shift < clean.per_token).all()
    # The line follows the magnitude: the small tokens get a narrower noise than one size.
    assert clean.per_token[magnitude < 10].max() < 0.5 * clean.per_token[magnitude > 35].min()
    faulty = shift.copy()
    faulty[:1500] = 5.0
    misfit = np.full((1, 4000), 50.0)
    misfit[0, :1500] = shift[:1500]  # a cause fits these: they do not move the estimate
    moved = estimate_noise(faulty, misfit, magnitude, 40.0)
    kept = estimate_noise(shift[1500:], misfit[:, 1500:], magnitude[1500:], 40.0)
    assert (moved.a, moved.b) == pytest.approx((kept.a, kept.b), rel=0.02)
    few = estimate_noise(shift[: MIN_TOKENS - 1], none[:, : MIN_TOKENS - 1],
                         magnitude[: MIN_TOKENS - 1], 40.0)  # fmt: skip
    assert few.source == "smallest" and few.eps == shift[: MIN_TOKENS - 1].max() and few.b == 0
    capped = estimate_noise(shift * 1000, none, magnitude, 1.0)
    assert capped.source == "capped" and capped.per_token.max() == capped.ceiling


def test_a_clean_shift_near_a_cause_by_chance_still_counts() -> None:
    """Causes whose predictions sit a scale or two from the clean value catch the larger
    clean shifts more often than the small ones: leaving out every token a cause fits
    better would bias the scale low; the mixture keeps it."""
    rng = np.random.default_rng(1)
    n = 6000
    magnitude = rng.uniform(5.0, 40.0, n)
    sigma = 0.001 * magnitude
    signed = rng.normal(0.0, 1.0, n) * sigma
    shift = np.abs(signed)
    # Six causes, each predicting a value 0.5 to 3 scales to either side of the clean one.
    offsets = rng.uniform(0.5, 3.0, (6, n)) * rng.choice([-1.0, 1.0], (6, n)) * sigma
    misfit = np.abs(signed - offsets)
    truth = estimate_noise(shift, np.full((1, n), np.nan), magnitude, 40.0)
    found = estimate_noise(shift, misfit, magnitude, 40.0)
    assert found.b == pytest.approx(truth.b, rel=0.12)
    fitted = (misfit < shift).any(axis=0)
    assert fitted.mean() > 0.3  # the hard rule would have left out this many
    biased = estimate_noise(shift[~fitted], np.full((1, int((~fitted).sum())), np.nan),
                            magnitude[~fitted], 40.0)  # fmt: skip
    assert biased.b < 0.85 * truth.b  # and been this far off


@pytest.mark.parametrize(
    ("alpha", "beta"),
    [(0.01, 0.0), (0.0, 0.002), (0.004, 0.001)],
    ids=["constant", "relative", "both"],
)
def test_the_median_line_finds_the_conditional_median(alpha: float, beta: float) -> None:
    rng = np.random.default_rng(1)
    magnitude = rng.uniform(2.0, 30.0, 3000)
    shift = (alpha + beta * magnitude) * np.abs(rng.normal(0.0, 1.0, 3000)) / 0.6745
    shift[:300] = 10.0  # a tenth moved by a cause no hypothesis caught: the median moves ~15%
    found = median_line(shift, magnitude)
    assert found[0] == pytest.approx(alpha, abs=0.25 * (alpha + 30 * beta))
    assert found[1] == pytest.approx(beta, abs=0.25 * (alpha / 30 + beta))
    assert min(found) >= 0.0


def test_a_given_noise_is_a_constant_or_a_line() -> None:
    magnitude = np.array([1.0, 10.0, 30.0])
    constant = given_noise(0.05, magnitude, 30.0)
    assert constant.per_token.tolist() == [0.05] * 3 and constant.source == "given"
    line = given_noise((0.01, 0.002), magnitude, 30.0)
    assert line.per_token == pytest.approx([0.012, 0.03, 0.07]) and line.source == "given_model"
    kept = np.array([[-3.0, 2.0, -np.inf], [-np.inf, -np.inf, -np.inf]])
    assert token_magnitude(kept).tolist() == [3.0, 0.0]


def test_the_rl_units_are_the_textbook_ones() -> None:
    log_ratio = np.array([0.0, math.log(1.05), math.log(0.85), math.log(1.3), math.nan])
    owner = np.array([0, 0, 1, 1, 1])
    units = rl_units(log_ratio, owner, clip=0.2)
    assert units.tokens == 4
    assert units.max_abs == pytest.approx(math.log(1.3))
    assert units.k3 == pytest.approx(np.mean([r - 1 - math.log(r) for r in (1, 1.05, 0.85, 1.3)]))
    assert units.outside_band == 0.5  # 0.85 and 1.3
    assert units.outside_clip == 0.25  # 1.3 only
    assert units.sequence_mean == pytest.approx((math.log(1.05) + math.log(0.85 * 1.3)) / 2)
    assert units.sequence_worst == pytest.approx(math.log(0.85 * 1.3))
    assert np.all(k3(np.linspace(-3, 3, 61)) >= 0)
