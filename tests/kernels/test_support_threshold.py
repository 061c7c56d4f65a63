"""The vocab-parallel support threshold: the rules' support on well-separated rows and on
constructed ties, the same bits for every TP degree, shard layout and batch composition.

Most tests run three ways (the ``candidates`` fixture): with the module's 256 candidates
per rank (top-k and top-p by candidates), with 5 (top-p's nucleus often past a rank's
candidates: some batches fall back to the radix select, others stay exact), and with 1
(top-k past 1 and every truncated top-p by radix select)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tp_logprob as tpl
from tests.helpers.native_cases import LAYOUTS, PADDED, REAL, bits
from tests.helpers.support_cases import (
    live_z32,
    reference_support,
    support_contract,
    tp_threshold,
)
from tp_logprob.kernels import support_threshold
from tp_logprob.kernels.fixed_point import fixed_point_terms, fraction_bits
from tp_logprob.kernels.radix_select import float_keys, key_passes, keys_to_float
from tp_logprob.kernels.support_threshold import sampling_rules

NAN, INF = float("nan"), float("inf")
RULES = {
    "min_p": {"min_p": 0.05},
    "top_k": {"top_k": 5},
    "top_p": {"top_p": 0.7},
    "min_p-top_k": {"min_p": 0.02, "top_k": 4},
    "top_k-top_p": {"top_k": 6, "top_p": 0.8},
    "all-three": {"min_p": 0.01, "top_k": 7, "top_p": 0.9},
    "top_k-1": {"top_k": 1},
    "top_p-small": {"top_p": 0.05},
    "top_k-past-vocab": {"top_k": REAL},
    "all-off": {"top_p": 1.0, "min_p": 0.0},
}
THRESHOLD_LAYOUTS = ["tp1", "tp2-width1", "tp3-uneven", "tp3-padding-shard", "tp4-even"]


@pytest.fixture(params=[256, 5, 1], ids=lambda c: f"candidates{c}")
def candidates(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(support_threshold, "CANDIDATES", request.param)
    return int(request.param)


def random_logits(seed: int, rows: int, scale: float = 2.0) -> torch.Tensor:
    """Logits whose live values are distinct; padding columns hold NaN and +inf."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, PADDED, generator=gen) * scale
    logits[:, REAL:] = NAN
    logits[:, -1] = INF
    return logits


def threshold(
    logits: torch.Tensor, layout: str, temperature: float = 1.0, **rules: float
) -> tuple[torch.Tensor, torch.Tensor]:
    support = tpl.SupportSpec(**rules)  # type: ignore[arg-type]
    contract = support_contract(
        LAYOUTS[layout], support, num_tokens=len(logits), temperature=temperature
    )
    return tp_threshold(logits, contract)


def assert_matches_reference(
    logits: torch.Tensor, layout: str, temperature: float = 1.0, **rules: float
) -> None:
    tau, size = threshold(logits, layout, temperature, **rules)
    want = reference_support(live_z32(logits, temperature), **rules)  # type: ignore[arg-type]
    assert (want.margin > 1e-4).all(), "the rows must be well separated from every boundary"
    assert size.tolist() == want.size.tolist()
    np.testing.assert_array_equal(tau.double().numpy(), want.tau)
    assert tau.dtype == torch.float32 and size.dtype == torch.int64


@pytest.mark.usefixtures("candidates")
@pytest.mark.parametrize("rules", list(RULES.values()), ids=list(RULES))
@pytest.mark.parametrize("layout", THRESHOLD_LAYOUTS)
def test_threshold_matches_the_rules_on_random_rows(layout: str, rules: dict[str, float]) -> None:
    logits = random_logits(3, 6)
    want = reference_support(live_z32(logits), **rules)  # type: ignore[arg-type]
    if (want.margin <= 1e-4).any():
        pytest.fail("seed 3 must give well-separated rows")
    assert_matches_reference(logits, layout, **rules)


@pytest.mark.usefixtures("candidates")
@pytest.mark.parametrize("temperature", [0.7, 2.5])
def test_threshold_uses_the_tempered_logits(temperature: float) -> None:
    logits = random_logits(5, 6)
    assert_matches_reference(logits, "tp3-uneven", temperature, min_p=0.03, top_p=0.8)


def rows_of(*live: list[float]) -> torch.Tensor:
    """Logits from live rows (padded with -inf live columns, then NaN padding)."""
    logits = torch.full((len(live), PADDED), NAN)
    logits[:, :REAL] = -INF
    for row, values in enumerate(live):
        logits[row, : len(values)] = torch.tensor(values)
    return logits


# Constructed rows, each with the support the rules give (as the live ids kept).
TIES = {
    "kth-value-tied": (
        [5.0, 3.0, 3.0, 3.0, 1.0, 0.0],
        {"top_k": 2},
        [0, 1, 2, 3],
    ),
    "top_k-1-tied-max": ([2.0, 7.0, 7.0, 1.0], {"top_k": 1}, [1, 2]),
    "min_p-inside-a-tie": (
        # exp(-1) = 0.37 >= 0.3 for the three tied at 1.0; exp(-3) < 0.3.
        [2.0, 1.0, 1.0, 1.0, -1.0],
        {"min_p": 0.3},
        [0, 1, 2, 3],
    ),
    "top_p-boundary-tie": (
        # masses 1, 1, 1, e^-5...: the first tie alone is above 0.4 of the total, so all
        # three tied maxima are kept (their strictly larger mass is 0).
        [4.0, 4.0, 4.0, -1.0, -1.0],
        {"top_p": 0.4},
        [0, 1, 2],
    ),
    "top_p-second-tie": (
        # masses 1, e^-0 ... : top at 3, then a tie of two at 2 whose mass above is
        # 1/(1 + 2 e^-1 + ...) < 0.9; the value 0 has mass above >= 0.9 of the total.
        [3.0, 2.0, 2.0, 0.0],
        {"top_p": 0.8},
        [0, 1, 2],
    ),
    "top_k-keeps-minus-inf": ([1.0, 2.0], {"top_k": 3}, list(range(REAL))),
    "minus-inf-dropped-by-min_p": ([1.0, 2.0], {"min_p": 0.1}, [0, 1]),
    "one-finite-value": ([3.0], {"top_p": 0.5, "top_k": 2}, [0]),
    "signed-zeros": ([0.0, -0.0, 0.0, -1.0], {"top_k": 2}, [0, 1, 2]),
}


@pytest.mark.usefixtures("candidates")
@pytest.mark.parametrize("layout", THRESHOLD_LAYOUTS)
@pytest.mark.parametrize(("values", "rules", "kept"), list(TIES.values()), ids=list(TIES))
def test_threshold_on_constructed_ties(
    values: list[float], rules: dict[str, float], kept: list[int], layout: str
) -> None:
    logits = rows_of(values)
    tau, size = threshold(logits, layout, **rules)
    z = logits[0, :REAL]
    got = torch.nonzero(z >= tau[0]).flatten().tolist()
    assert got == kept
    assert size.tolist() == [len(kept)]
    assert bits(tau).tolist() != bits(torch.tensor([-0.0])).tolist(), "tau is never -0.0"
    want = reference_support(live_z32(logits), **rules)  # type: ignore[arg-type]
    assert want.size.tolist() == [len(kept)], "the reference agrees with the table"


UNDEFINED = {
    "nan": [1.0, NAN, 2.0],
    "+inf": [1.0, INF, 2.0],
    "all-minus-inf": [],
}


@pytest.mark.usefixtures("candidates")
@pytest.mark.parametrize("rules", list(RULES.values()), ids=list(RULES))
@pytest.mark.parametrize("layout", ["tp1", "tp3-uneven"])
def test_undefined_rows_have_nan_threshold_and_size_zero(
    layout: str, rules: dict[str, float]
) -> None:
    logits = rows_of(*UNDEFINED.values(), [1.0, 2.0, 3.0])
    tau, size = threshold(logits, layout, **rules)
    assert torch.isnan(tau[:3]).all() and size[:3].tolist() == [0, 0, 0]
    assert not torch.isnan(tau[3]) and size[3] >= 1


@pytest.mark.usefixtures("candidates")
@pytest.mark.parametrize("rules", list(RULES.values()), ids=list(RULES))
def test_threshold_bits_are_the_same_for_every_layout(rules: dict[str, float]) -> None:
    logits = random_logits(11, 7, scale=6.0)
    logits[0, :REAL] = torch.round(logits[0, :REAL])  # ties
    logits[1, 3:9] = -INF
    logits[2, 5] = NAN
    want = threshold(logits, "tp1", **rules)
    for layout in LAYOUTS:
        tau, size = threshold(logits, layout, **rules)
        assert torch.equal(bits(tau), bits(want[0])), layout
        assert torch.equal(size, want[1]), layout


@pytest.mark.usefixtures("candidates")
@pytest.mark.parametrize("rules", list(RULES.values()), ids=list(RULES))
def test_a_rows_threshold_depends_on_that_row_alone(rules: dict[str, float]) -> None:
    logits = random_logits(13, 9, scale=4.0)
    logits[4, :REAL] = torch.round(logits[4, :REAL])
    tau, size = threshold(logits, "tp3-uneven", **rules)
    order = torch.tensor([8, 3, 5, 0, 1, 7, 2, 6, 4])
    shuffled = threshold(logits[order], "tp3-uneven", **rules)
    assert torch.equal(bits(shuffled[0]), bits(tau[order]))
    assert torch.equal(shuffled[1], size[order])
    for row in (0, 4, 8):
        alone = threshold(logits[row : row + 1], "tp3-uneven", **rules)
        assert torch.equal(bits(alone[0]), bits(tau[row : row + 1]))
        assert torch.equal(alone[1], size[row : row + 1])


@pytest.mark.usefixtures("candidates")
def test_no_rows() -> None:
    tau, size = threshold(torch.zeros(0, PADDED), "tp3-uneven", top_k=3, top_p=0.5, min_p=0.1)
    assert tau.shape == size.shape == (0,)


@pytest.mark.parametrize(
    ("rules", "off"),
    [
        ({"top_p": 1.0}, (None, None, None)),
        ({"min_p": 0.0, "top_k": REAL}, (None, None, None)),
        ({"top_k": REAL - 1, "min_p": 0.5}, (0.5, REAL - 1, None)),
    ],
)
def test_rules_that_keep_everything_are_off(
    rules: dict[str, float], off: tuple[object, ...]
) -> None:
    contract = support_contract(LAYOUTS["tp1"], tpl.SupportSpec(**rules))  # type: ignore[arg-type]
    got = sampling_rules(contract)
    assert (got.min_p, got.top_k, got.top_p) == off


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float_keys_order_the_floats(dtype: torch.dtype) -> None:
    info = torch.finfo(dtype)
    values = torch.tensor(
        [
            *(-INF, -info.max, -1.5, -info.tiny, -info.tiny / 4, -0.0, 0.0),
            *(info.tiny / 4, info.tiny, 1.0, 1.0 + info.eps, info.max, INF),
        ],
        dtype=dtype,
    )
    keys = float_keys(values)
    assert keys.dtype == torch.int64
    assert (keys[1:] >= keys[:-1]).all() and keys[5] == keys[6]
    assert (keys[1:5] < keys[2:6]).all() and (keys[7:] > keys[6:-1]).all()
    back = keys_to_float(keys, dtype)
    assert torch.equal(bits(back), bits(torch.where(values == 0, 0.0, values)))
    assert len(key_passes(dtype)) == (4 if dtype == torch.float32 else 8)


@pytest.mark.usefixtures("candidates")
def test_top_p_keeps_a_value_only_while_the_mass_above_it_is_strictly_below() -> None:
    """The boundary at the fixed-point level: with ``top_p Z`` equal to the mass above the
    second value (in the float64 comparison the threshold makes) it is dropped; one ulp of
    ``top_p`` more keeps it. The masses are those of the module docstring."""
    logits = rows_of([3.0, 1.5, 1.0, -2.0])
    z = logits[0, :4]
    masses = fixed_point_terms(torch.exp(z - z.max()), fraction_bits(PADDED)).tolist()
    above, total = np.float64(masses[0]), np.float64(sum(masses))
    top_p = above / total
    while top_p * total < above:
        top_p = np.nextafter(top_p, 1.0)
    while top_p * total > above:
        top_p = np.nextafter(top_p, 0.0)
    assert top_p * total == above
    for layout in ("tp1", "tp3-uneven"):
        assert threshold(logits, layout, top_p=float(top_p))[1].tolist() == [1]
        more = float(np.nextafter(top_p, 1.0))
        assert threshold(logits, layout, top_p=more)[1].tolist() == [2]


class CountingGroup:
    """One rank of one: counts the all-gathers a call makes."""

    rank, world_size = 0, 1

    def __init__(self) -> None:
        self.calls = 0

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        self.calls += 1
        return [tensor.clone()]


WIDE = 1000
# Rules, scale of the logits, and the all-gathers the threshold makes: the row extremes,
# min-p's minimum, top-k's candidates (or 4 radix passes past 256), top-p's candidates
# (plus 4 radix passes when a nucleus is wider than a rank's 256), and one count of |S|
# when min-p or top-k is the last rule on.
COLLECTIVES = {
    "all-off": ({"top_p": 1.0}, 4.0, 1),
    "min_p": ({"min_p": 0.05}, 4.0, 3),
    "top_k": ({"top_k": 50}, 4.0, 3),
    "top_k-radix": ({"top_k": 300}, 4.0, 5),
    "vLLM-like": ({"min_p": 0.05, "top_k": 50, "top_p": 0.9}, 4.0, 4),
    "top_p-narrow": ({"top_p": 0.9}, 4.0, 2),
    "top_p-wide": ({"top_p": 0.9}, 0.3, 6),
}


@pytest.mark.parametrize(
    ("rules", "scale", "calls"), list(COLLECTIVES.values()), ids=list(COLLECTIVES)
)
def test_collectives_and_a_wide_vocabulary(
    rules: dict[str, float], scale: float, calls: int
) -> None:
    """Each path against the rules on a 1000-column vocabulary (a radix top-k past 256, a
    nucleus of hundreds of tokens), with its count of all-gathers."""
    gen = torch.Generator().manual_seed(17)
    logits = torch.randn(5, WIDE, generator=gen) * scale
    support = tpl.SupportSpec(**rules)  # type: ignore[arg-type]
    contract = support_contract(((0, WIDE),), support, num_tokens=5, real=WIDE)
    group = CountingGroup()
    tau, size = support_threshold.support_threshold(logits, contract, group)
    assert group.calls == calls
    want = reference_support(logits.double().numpy(), **rules)  # type: ignore[arg-type]
    assert (want.margin > 1e-4).all()
    assert size.tolist() == want.size.tolist()
    np.testing.assert_array_equal(tau.double().numpy(), want.tau)
    layout = ((0, 333), (333, 334), (334, WIDE))
    uneven = support_contract(layout, support, num_tokens=5, real=WIDE)
    got = tp_threshold(logits, uneven)
    assert torch.equal(bits(got[0]), bits(tau)) and torch.equal(got[1], size)


@pytest.mark.usefixtures("candidates")
@pytest.mark.parametrize("rules", list(RULES.values()), ids=list(RULES))
def test_float64_logits_select_the_same_support(rules: dict[str, float]) -> None:
    """The gradcheck path: float64 keys (8 radix digits) and float64 masses give the fp32
    path's support on well-separated rows."""
    logits = random_logits(19, 6)
    want = threshold(logits, "tp3-uneven", **rules)
    support = tpl.SupportSpec(**rules)  # type: ignore[arg-type]
    contract = support_contract(LAYOUTS["tp3-uneven"], support, num_tokens=6)
    got = tp_threshold(logits.double(), contract)
    assert got[0].dtype == torch.float64
    assert torch.equal(got[0], want[0].double()) and torch.equal(got[1], want[1])
