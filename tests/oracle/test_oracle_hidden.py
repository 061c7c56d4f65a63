"""The fused LM-head oracle: exact logits, the float64 reference, the fp32 dot-product bound,
the extra tolerance it implies, and exact gradients.

Run as a script to print the worst measured ratio ``|x_fp32 - x| / bound`` per
accumulation order (the numbers in docs/tolerances.md)::

    PYTHONPATH=. .nox/tests/bin/python tests/oracle/test_oracle_hidden.py
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tp_logprob.oracle import (
    dot_product_error_bound,
    exact_hidden_grads,
    exact_hidden_logits,
    exact_logprob_grad,
    fused_extra_bounds,
    reference_hidden_logits,
)

F32 = np.float32
U = 2.0**-24


# --- fp32 dot products in several accumulation orders (the kernels' freedom) ---------


def _products(hidden: np.ndarray, weight: np.ndarray) -> np.ndarray:
    return hidden.astype(F32)[:, None, :] * weight.astype(F32)[None, :, :]  # rounded in fp32


def sequential(p: np.ndarray) -> np.ndarray:
    acc = np.zeros(p.shape[:-1], F32)
    for i in range(p.shape[-1]):
        acc = acc + p[..., i]
    return acc


def reverse(p: np.ndarray) -> np.ndarray:
    return sequential(p[..., ::-1])


def pairwise(p: np.ndarray) -> np.ndarray:
    size = 1 << max(p.shape[-1] - 1, 0).bit_length()
    p = np.concatenate([p, np.zeros((*p.shape[:-1], size - p.shape[-1]), F32)], axis=-1)
    while p.shape[-1] > 1:
        half = p.shape[-1] // 2
        p = p[..., :half] + p[..., half:]
    return p[..., 0]


def blocked(p: np.ndarray, block: int = 4) -> np.ndarray:
    sums = [sequential(p[..., i : i + block]) for i in range(0, p.shape[-1], block)]
    return sequential(np.stack(sums, axis=-1))


def numpy_sum(p: np.ndarray) -> np.ndarray:
    return np.asarray(p.sum(axis=-1, dtype=F32))


ORDERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "sequential": sequential,
    "reverse": reverse,
    "pairwise": pairwise,
    "blocked": blocked,
    "numpy_sum": numpy_sum,
}


def fp32_logits(
    hidden: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, order: str
) -> np.ndarray:
    if order == "blas":
        x = hidden.astype(F32) @ weight.astype(F32).T
    else:
        x = ORDERS[order](_products(hidden, weight))
    return x if bias is None else (x + bias.astype(F32)).astype(F32)


def exact_fraction(hidden: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> list:
    rows = []
    for t in range(hidden.shape[0]):
        row = []
        for v in range(weight.shape[0]):
            pairs = zip(hidden[t].tolist(), weight[v].tolist(), strict=True)
            total = sum((Fraction(a) * Fraction(b) for a, b in pairs), Fraction(0))
            row.append(total + (Fraction(float(bias[v])) if bias is not None else 0))
        rows.append(row)
    return rows


def ratios(hidden: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> dict[str, float]:
    """``max |x_fp32 - x_exact| / bound`` per order, in exact rational arithmetic."""
    bound = dot_product_error_bound(hidden, weight, bias)
    exact = exact_fraction(hidden, weight, bias)
    out = {}
    for order in [*ORDERS, "blas"]:
        x = fp32_logits(hidden, weight, bias, order)
        worst = 0.0
        for (t, v), value in np.ndenumerate(x):
            error = abs(Fraction(float(value)) - exact[t][v])
            worst = max(worst, float(error / Fraction(float(bound[t, v]))))
        out[order] = worst
    return out


# --- exact logits --------------------------------------------------------------------


def test_exact_logits_closed_forms() -> None:
    # 2^60 + 1 - 2^60: float64 summation loses the 1, the exact sum keeps it.
    hidden = np.array([[2.0**60, 1.0, -(2.0**60)]], np.float32)
    weight = np.ones((2, 3), np.float32)
    assert exact_hidden_logits(hidden, weight).tolist() == [[1.0, 1.0]]
    assert (hidden.astype(np.float64) @ weight.T.astype(np.float64))[0, 0] == 0.0
    bias = np.array([0.5, -1.0], np.float32)
    assert exact_hidden_logits(hidden, weight, bias).tolist() == [[1.5, 0.0]]
    # 1 + 2^-30 + 2^-80: the exact value rounds to 1 + 2^-30 in float64.
    tiny = np.array([[1.0, 2.0**-30, 2.0**-40]], np.float32)
    assert exact_hidden_logits(tiny, np.array([[1.0, 1.0, 2.0**-40]], np.float32)).tolist() == [
        [1.0 + 2.0**-30]
    ]


def test_exact_logits_special_values_follow_ieee() -> None:
    hidden = np.array([[1.0, np.inf], [np.nan, 1.0]], np.float32)
    weight = np.array([[1.0, 1.0], [1.0, -1.0], [0.0, 1.0]], np.float32)
    got = exact_hidden_logits(hidden, weight)
    assert got[0, 0] == np.inf and got[0, 1] == -np.inf and got[0, 2] == np.inf
    assert np.isnan(got[1]).all()


def test_exact_logits_refuse_values_fp32_cannot_hold() -> None:
    with pytest.raises(ValueError, match="not an fp32 value"):
        exact_hidden_logits(np.array([[0.1]]), np.array([[1.0]]))
    with pytest.raises(ValueError, match="hidden sizes differ"):
        exact_hidden_logits(np.ones((1, 2), np.float32), np.ones((1, 3), np.float32))


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_exact_logits_agree_with_mpmath(data: st.DataObject) -> None:
    size = data.draw(st.integers(1, 24), label="H")
    values = st.floats(-(2.0**40), 2.0**40, width=32, allow_subnormal=True)
    hidden = np.array(data.draw(st.lists(values, min_size=size, max_size=size)), np.float32)
    weight = np.array(data.draw(st.lists(values, min_size=size, max_size=size)), np.float32)
    bias = np.float32(data.draw(values, label="bias"))
    got = exact_hidden_logits(hidden[None], weight[None], np.array([bias]))[0, 0]
    with mpmath.workprec(2000):  # exact for these magnitudes: no rounding at all
        total = mpmath.fsum(
            mpmath.mpf(float(a)) * mpmath.mpf(float(b)) for a, b in zip(hidden, weight, strict=True)
        )
        total += mpmath.mpf(float(bias))
        want = float(total)  # mpf -> float rounds to nearest
    assert got == want


def test_reference_within_its_bound() -> None:
    rng = np.random.default_rng(0)
    hidden = (rng.standard_normal((4, 32)) * 2.0 ** rng.integers(-20, 20, (4, 32))).astype(F32)
    weight = rng.standard_normal((5, 32)).astype(F32)
    x, bound = reference_hidden_logits(hidden, weight)
    exact = exact_fraction(hidden, weight, None)
    for (t, v), value in np.ndenumerate(x):
        assert abs(Fraction(float(value)) - exact[t][v]) <= Fraction(float(bound[t, v]))


# --- the fp32 dot-product bound: sound and tight ---------------------------------------


def _draw_operands(data: st.DataObject) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    dtype = data.draw(st.sampled_from(["fp32", "bf16", "fp16"]), label="dtype")
    size = data.draw(st.integers(1, 40), label="H")
    rows, cols = data.draw(st.integers(1, 2), label="N"), data.draw(st.integers(1, 3), label="V")
    width = 16 if dtype == "fp16" else 32
    limit = 2.0**15 if dtype == "fp16" else 2.0**50
    values = st.floats(-limit, limit, width=width, allow_subnormal=True)

    def matrix(shape: tuple[int, int], label: str) -> np.ndarray:
        flat = data.draw(
            st.lists(values, min_size=shape[0] * shape[1], max_size=shape[0] * shape[1]),
            label=label,
        )
        array = np.array(flat, np.float32).reshape(shape)
        if dtype == "bf16":  # truncate to a bfloat16 value
            array = (array.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
        return array

    hidden, weight = matrix((rows, size), "hidden"), matrix((cols, size), "weight")
    if size >= 2 and data.draw(st.booleans(), label="cancel"):
        half = size // 2  # the second half undoes the first, up to one drawn term
        hidden[:, half : 2 * half] = hidden[:, :half]
        weight[:, half : 2 * half] = -weight[:, :half]
    bias = matrix((1, cols), "bias")[0] if data.draw(st.booleans(), label="bias?") else None
    return hidden, weight, bias


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_dot_product_bound_is_sound_in_every_order(data: st.DataObject) -> None:
    hidden, weight, bias = _draw_operands(data)
    for order, ratio in ratios(hidden, weight, bias).items():
        assert ratio <= 1.0, f"{order}: error is {ratio:.3f} x the bound"


def _adversarial(size: int, dtype: str, cancel: bool) -> tuple[np.ndarray, np.ndarray]:
    """``1 + t + ... + t (- 1)`` with ``t`` just under half an ulp of 1.

    Sequentially each ``+ t`` rounds back down to 1, losing almost ``u``; the final
    ``- 1`` (``cancel``) leaves 0 where the exact value is ``(H - 2) t``.
    """
    tail = {"fp32": (1.0 - 2.0**-23, 2.0**-24), "bf16": (1.0 - 2.0**-8, 2.0**-24)}
    tail["fp16"] = (2.0**-12 * (1.0 - 2.0**-11), 2.0**-12)
    a, b = tail[dtype]
    hidden = np.full((1, size), a, np.float32)
    weight = np.full((1, size), b, np.float32)
    hidden[0, 0] = weight[0, 0] = 1.0
    if cancel:
        hidden[0, -1], weight[0, -1] = 1.0, -1.0
    return hidden, weight


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("size", [8, 16, 64])
@pytest.mark.parametrize("cancel", [False, True], ids=["accumulate", "cancel"])
def test_dot_product_bound_is_reached_within_a_factor_four(
    dtype: str, size: int, cancel: bool
) -> None:
    hidden, weight = _adversarial(size, dtype, cancel)
    got = ratios(hidden, weight, None)
    assert max(got.values()) <= 1.0
    assert got["sequential"] >= 0.25, got
    if cancel:
        assert fp32_logits(hidden, weight, None, "sequential")[0, 0] == 0.0


def test_bound_formula() -> None:
    hidden = np.array([[3.0, -4.0]], np.float32)
    weight = np.array([[1.0, 1.0]], np.float32)
    gamma = 2 * U / (1 - 2 * U)
    got = dot_product_error_bound(hidden, weight)[0, 0]
    assert math.isclose(got, gamma * 7.0, rel_tol=2.0**-40)
    with_bias = dot_product_error_bound(hidden, weight, np.array([0.5], np.float32))[0, 0]
    assert math.isclose(with_bias, gamma * 7.0 * (1 + U) + U * 0.5, rel_tol=2.0**-40)


def test_extra_bounds_follow_lipschitz_constants() -> None:
    x = np.array([[1.0, 2.0, 3.0, 4.0]])
    dot = np.array([[0.0, 1e-6, 0.0, 2e-6]])
    lse, selected, entropy = fused_extra_bounds(x, dot, [1], real_vocab_size=3)
    column = (dot[0, :3] + U * x[0, :3]) * (1 + 2.0**-20)
    assert lse[0] == column.max() and selected[0] == column[1] + column.max()
    assert entropy[0] == 2 * math.log(3) * column.max()


# --- exact gradients ----------------------------------------------------------------


def test_exact_hidden_grads_chain_the_logits_gradient() -> None:
    rng = np.random.default_rng(1)
    hidden = rng.standard_normal((3, 5)).astype(F32)
    weight = rng.standard_normal((6, 5)).astype(F32)
    weight[4:] = np.nan  # padding rows: never read
    hidden[1] = np.nan  # an inactive row: never read
    active = np.array([True, False, True])
    targets = np.array([0, -100, 3])
    d_hidden, d_weight = exact_hidden_grads(
        hidden, weight, targets, active_mask=active, real_vocab_size=4
    )
    x = exact_hidden_logits(hidden[[0, 2]], weight[:4])
    g = exact_logprob_grad(x.astype(F32).astype(np.float64), targets[[0, 2]])
    np.testing.assert_allclose(d_hidden[[0, 2]], g @ weight[:4].astype(np.float64), rtol=1e-13)
    np.testing.assert_allclose(d_weight[:4], g.T @ hidden[[0, 2]].astype(np.float64), rtol=1e-12)
    assert (d_hidden[1] == 0).all() and (d_weight[4:] == 0).all()


def test_exact_hidden_grads_are_correctly_rounded_sums() -> None:
    # G = [1 - p, -p] with p = 1/2: d hidden = 0.5 * (w0 - w1), exact in binary.
    hidden = np.zeros((1, 2), np.float32)
    weight = np.array([[2.0**30, 1.0], [2.0**30, 3.0]], np.float32)
    d_hidden, d_weight = exact_hidden_grads(hidden, weight, [0])
    assert d_hidden.tolist() == [[0.0, -1.0]]
    assert d_weight.tolist() == [[0.0, 0.0], [0.0, 0.0]]
    entropy_h, _ = exact_hidden_grads(hidden, weight, [0], of="entropy")
    assert entropy_h.tolist() == [[0.0, 0.0]]  # uniform: the entropy gradient is 0
    with pytest.raises(ValueError, match="of='lse'"):
        exact_hidden_grads(hidden, weight, [0], of="lse")


def _measure() -> dict[str, float]:
    """Worst ratio per order over adversarial and random (cancelling) inputs."""
    worst: dict[str, float] = {}
    cases: list[Any] = []
    for dtype in ("fp32", "bf16", "fp16"):
        for size in (8, 64, 512):
            for cancel in (False, True):
                cases.append((*_adversarial(size, dtype, cancel), None))
    rng = np.random.default_rng(0)
    for _ in range(200):
        size = int(rng.integers(2, 128))
        hidden = (rng.standard_normal((2, size)) * 2.0 ** rng.integers(-8, 8, (2, size))).astype(
            F32
        )
        weight = rng.standard_normal((2, size)).astype(F32)
        half = size // 2
        hidden[:, half : 2 * half], weight[:, half : 2 * half] = hidden[:, :half], -weight[:, :half]
        cases.append((hidden, weight, rng.standard_normal(2).astype(F32)))
    for hidden, weight, bias in cases:
        for order, ratio in ratios(hidden, weight, bias).items():
            worst[order] = max(worst.get(order, 0.0), ratio)
    return worst


if __name__ == "__main__":
    for order, ratio in _measure().items():
        print(f"{order:>10}: worst |x_fp32 - x| / bound = {ratio:.3f}")
