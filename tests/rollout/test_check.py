"""The rollout check on one forward pass: every mismatch gets the cause that reproduces it.

Each test builds an engine response whose logprobs are computed in float64 from
the trainer's own logits under a known fault (another temperature, the full
vocabulary, a top-k mask missing a token, a perturbed value) and checks the
verdict. Two forward passes (the logit noise) are ``test_noise.py``'s and the
corpus test's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tp_logprob.__main__ import main
from tp_logprob.engine_formats import prime_rl_rollout, sglang_rollout
from tp_logprob.rollout import RolloutInputError, check_rollout
from tp_logprob.rollout.noise import token_shift

N, V, K, T = 10, 48, 5, 0.7


def _logits() -> torch.Tensor:
    return torch.randn(N, V, generator=torch.Generator().manual_seed(7)) * 3


def _response(
    x: torch.Tensor, *, faults: dict[int, str] | None = None, k: int = K
) -> dict[str, Any]:
    """A top-k SGLang response at temperature T, exact logprobs, with ``faults`` per token."""
    faults = faults or {}
    z = x.double() / T
    masks, tokens, logprobs = [], [], []
    for t in range(N):
        kept = torch.argsort(z[t], descending=True)[:k].tolist()
        if faults.get(t) == "drop":
            kept = kept[:-1]
        token = kept[t % len(kept)]
        value = float(z[t, token] - torch.logsumexp(z[t, kept], 0))
        fault = faults.get(t)
        if fault == "full":
            value = float(torch.log_softmax(z[t], 0)[token])
        elif fault in ("T=1", "T^2"):
            raw = x[t].double() / (1.0 if fault == "T=1" else T * T)
            value = float(raw[token] - torch.logsumexp(raw[kept], 0))
        elif fault == "wild":
            value -= 0.5
        masks.append(sorted(kept, key=lambda v: -float(z[t, v])))  # SGLang's weight order
        tokens.append(token)
        logprobs.append(value)
    meta = {"output_token_sampling_mask": masks, "output_token_sampling_logprobs": logprobs}
    return {"output_ids": tokens, "meta_info": meta}


def test_an_honest_response_agrees_on_every_token() -> None:
    x = _logits()
    check = check_rollout(x, sglang_rollout(_response(x)), engine_temperature=T, top_k=K)
    assert check.verdict == ["agree"] * N
    assert not check.failed()
    assert np.all(np.abs(check.engine_logprob - check.oracle) <= check.bound)
    assert check.noise.source == "smallest" and check.noise.eps < 1e-6


def test_each_fault_is_attributed_to_its_cause() -> None:
    x = _logits()
    faults = {1: "full", 3: "T=1", 4: "T^2", 5: "drop", 8: "wild"}
    check = check_rollout(
        [x[:, :17], x[:, 17:]], sglang_rollout(_response(x, faults=faults)),
        engine_temperature=T, top_k=K, logit_noise=0.0,
    )  # fmt: skip
    assert check.verdict[1] == "unrenormalised" and "full vocabulary" in check.details[1]
    assert check.verdict[3] == "temperature_missing", check.markdown()
    assert check.verdict[4] == "temperature_twice", check.markdown()
    assert check.verdict[5] == "support" and "drops token" in check.details[5]
    assert check.verdict[8] == "unexplained"
    others = [t for t in range(N) if t not in faults]
    assert [check.verdict[t] for t in others] == ["agree"] * len(others)
    assert check.counts() == {
        "agree": 5, "temperature_missing": 1, "temperature_twice": 1, "unrenormalised": 1,
        "unexplained": 1, "support": 1,
    }  # fmt: skip
    assert check.worst(1)[0]["token"] in faults


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_narrow_logits_in_strided_shards_agree(dtype: torch.dtype) -> None:
    x = _logits().to(dtype)
    shards = list(torch.tensor_split(x, 2, dim=1))  # column views: not contiguous
    response = _response(x.float(), faults={2: "full"})
    check = check_rollout(shards, sglang_rollout(response), engine_temperature=T, top_k=K)
    assert check.settings["dtype"] == ("bf16" if dtype == torch.bfloat16 else "fp16")
    assert check.verdict[2] == "unrenormalised"
    assert [v for t, v in enumerate(check.verdict) if t != 2] == ["agree"] * (N - 1)


def test_a_nudge_within_the_given_noise_is_noise_and_beyond_it_unexplained() -> None:
    x = _logits()
    response = _response(x)
    response["meta_info"]["output_token_sampling_logprobs"][7] -= 1e-3
    rollout = sglang_rollout(response)
    assert check_rollout(x, rollout, engine_temperature=T, logit_noise=1e-3).verdict[7] == "noise"
    assert check_rollout(x, rollout, engine_temperature=T, logit_noise=0.0).verdict[7] == (
        "unexplained"
    )


def test_a_trainer_at_another_temperature_is_named() -> None:
    x = _logits()
    check = check_rollout(
        x, sglang_rollout(_response(x)), engine_temperature=T, trainer_temperature=1.0
    )
    assert check.verdict == ["trainer_temperature"] * N
    assert all(detail.startswith("trainer: its logprob is at T=1.0") for detail in check.details)
    assert check.failed()


def test_the_mask_alone_is_not_judged_without_sampling_parameters() -> None:
    x = _logits()
    check = check_rollout(x, sglang_rollout(_response(x, faults={5: "drop"})), engine_temperature=T)
    assert check.verdict[5] == "agree"


def test_a_position_without_a_mask_is_reported_as_such() -> None:
    x = _logits()[:3]
    z = x.double()
    rows = [torch.argsort(z[t], descending=True)[:4].tolist() for t in range(3)]
    ids = [*rows[0], *rows[2]]
    tokens = [rows[0][0], 0, rows[2][1]]
    logprobs = [float(z[t, tokens[t]] - torch.logsumexp(z[t, rows[t]], 0)) for t in (0, 2)]
    rollout = prime_rl_rollout(
        ids, [4, 0, 4], tokens, logprobs=[logprobs[0], None, logprobs[1]], vocab_size=V
    )
    check = check_rollout(x, rollout)
    assert check.verdict == ["agree", "no_mask", "agree"]


def test_the_command_line_reads_a_saved_response_and_tp_shards(tmp_path: Path) -> None:
    x = _logits()
    response = tmp_path / "response.json"
    response.write_text(json.dumps([_response(x, faults={2: "full"})]))
    shards = []
    for rank, (start, end) in enumerate(((0, 16), (16, 32), (32, V))):
        path = tmp_path / f"rank{rank}.pt"
        torch.save(x[:, start:end].clone(), path)
        shards.append(str(path))
    report, plot = tmp_path / "check.json", tmp_path / "check.png"
    status = main(
        ["rollout-check", str(response), "--logits", *shards, "--engine-temperature", str(T),
         "--top-k", str(K), "--logit-noise", "0", "--json", str(report), "--plot", str(plot)]
    )  # fmt: skip
    assert status == 1
    document = json.loads(report.read_text())
    assert document["verdicts"] == {"agree": N - 1, "unrenormalised": 1}
    assert document["engine_at_fault"] == 1
    assert document["settings"]["tp"] == 3
    assert document["per_token"][2]["verdict"] == "unrenormalised"
    assert document["decomposition"]["unrenormalised"]["abs_logp"] > 0.99
    assert (document["noise"]["a"], document["noise"]["b"]) == (0.0, 0.0)
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_a_given_noise_line_widens_with_the_tokens_magnitude() -> None:
    """eps_t = a + b m_t: the same nudge is noise on a token with large logits (3) and beyond
    the noise on one with small logits (7)."""
    x = _logits()
    x[7] *= 0.01
    response = _response(x)
    for t in (3, 7):
        response["meta_info"]["output_token_sampling_logprobs"][t] -= 1e-3
    rollout = sglang_rollout(response)
    exact = check_rollout(x, rollout, engine_temperature=T, logit_noise=0.0)
    assert exact.noise.source == "given" and exact.verdict[3] == exact.verdict[7] == "unexplained"
    needed = token_shift(exact.engine_logprob, exact.oracle, T)
    m = exact.noise.magnitude
    assert m[7] < 0.02 * m[3]
    slope = 10.0 * needed[3] / m[3]  # 10x what token 3 needs; under a fifth of that at 7
    check = check_rollout(x, rollout, engine_temperature=T, logit_noise_model=(0.0, slope))
    assert check.noise.source == "given_model"
    assert check.noise.per_token == pytest.approx(slope * m)
    assert check.verdict[3] == "noise" and check.verdict[7] == "unexplained"


def test_the_command_line_refuses_bad_engine_data(tmp_path: Path, capsys: Any) -> None:
    x = _logits()
    bad = _response(x)
    bad["meta_info"]["output_token_sampling_mask"][4] = [0.5]
    response = tmp_path / "response.json"
    response.write_text(json.dumps(bad))
    torch.save(x, tmp_path / "x.pt")
    status = main(["rollout-check", str(response), "--logits", str(tmp_path / "x.pt")])
    assert status == 2
    assert "mask[token 4][0]=0.5: expected an int, got float" in capsys.readouterr().err


@pytest.mark.parametrize("rows", [N - 1, N + 1])
def test_logits_of_another_length_are_refused(rows: int) -> None:
    x = torch.randn(rows, V)
    with pytest.raises(RolloutInputError, match=f"{rows} rows for {N} response tokens"):
        check_rollout(x, sglang_rollout(_response(_logits())))


def test_the_worst_tokens_list_every_mismatch_before_the_agreeing_ones() -> None:
    """A support mismatch whose logprob is within its bound still heads the summary."""
    x = _logits()
    check = check_rollout(
        x, sglang_rollout(_response(x, faults={6: "drop"})), engine_temperature=T, top_k=K,
        logit_noise=0.0,
    )  # fmt: skip
    assert check.verdict[6] == "support", check.markdown()
    worst = check.worst(3)
    assert worst[0]["token"] == 6 and worst[0]["verdict"] == "support"
    assert all(row["verdict"] == "agree" for row in worst[1:])


def test_the_trainer_in_blocks_of_rows_gives_the_bits_of_one_call(monkeypatch: Any) -> None:
    """Blocks of three rows: four calls per rank, a row without a mask among them."""
    import tp_logprob.rollout.trainer as trainer_module

    x = _logits()
    response = _response(x, faults={4: "wild"})
    masks = [sorted(kept) for kept in response["meta_info"]["output_token_sampling_mask"]]
    logprobs = response["meta_info"]["output_token_sampling_logprobs"]
    masks[5], logprobs[5] = [], None
    rollout = prime_rl_rollout(
        [i for kept in masks for i in kept], [len(kept) for kept in masks],
        response["output_ids"], logprobs=logprobs, vocab_size=V,
    )  # fmt: skip
    whole = check_rollout([x[:, :20], x[:, 20:]], rollout, engine_temperature=T, logit_noise=0.0)
    monkeypatch.setattr(trainer_module, "TRAINER_BLOCK_VALUES", 3 * V)
    blocks = check_rollout([x[:, :20], x[:, 20:]], rollout, engine_temperature=T, logit_noise=0.0)
    assert whole.trainer.tobytes() == blocks.trainer.tobytes()
    assert blocks.verdict == whole.verdict
    assert whole.verdict[4] == "unexplained" and whole.verdict[5] == "no_mask"


@pytest.mark.parametrize("seed", range(6))
def test_the_screened_masks_are_those_admissible_support_refuses(seed: int) -> None:
    """Masks of every kind (the exact support, k ids that may split a tie, one short, one
    extra, a hole, three extra): the rows judged ``support`` are those
    :func:`admissible_support` refuses."""
    from tp_logprob.oracle import admissible_support, classify_support, support_margins

    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.integers(-40, 40, (N, V)).astype(np.float32) / 4)
    live = V - 2  # two padding columns
    z = x.double().numpy() / np.float32(T)
    masks = []
    for t in range(N):
        order = [int(v) for v in np.argsort(-z[t, :live], kind="stable")]
        kind = rng.integers(0, 6)
        kept = order[:K]
        if kind == 1:
            kept = order[: K - 1]
        elif kind == 2:
            kept = order[: K + 1]
        elif kind == 3:
            kept = [*order[:2], *order[3 : K + 1]]
        elif kind == 4:
            kept = order[: K + 3]
        elif kind == 5:
            kept = [int(v) for v in np.flatnonzero(z[t, :live] >= z[t, order[K - 1]])]
        masks.append(sorted(kept))
    tokens = [m[0] for m in masks]
    rollout = prime_rl_rollout(
        [i for m in masks for i in m], [len(m) for m in masks], tokens, vocab_size=V
    )
    check = check_rollout(
        x, rollout, engine_temperature=T, top_k=K, real_vocab_size=live, logit_noise=0.0
    )
    margins = support_margins("fp32", live)
    c = classify_support(x.numpy(), margins=margins, top_k=K, real_vocab_size=live, temperature=T)
    dense = np.zeros((N, V), dtype=bool)
    for t, m in enumerate(masks):
        dense[t, m] = True
    for t in range(N):
        row = admissible_support(c, dense, active_mask=np.arange(N) == t)
        assert (check.verdict[t] == "support") == bool(row), (t, masks[t], row)
    assert "support" in check.verdict and "no_logprob" in check.verdict  # no logprobs given


def test_a_mask_that_splits_the_borderline_is_not_an_upper_set() -> None:
    """Top-p's boundary within fp32's error: -30, -30.5 and -31 are all borderline, so a
    mask keeping -30.5 but not -30 misses no certain token and adds none, yet is refused."""
    x = torch.tensor([[0.0, -30.0, -30.5, -31.0]] * 2)
    mass = np.exp(x[0].double().numpy())
    top_p = float((1 + 0.5 * mass[1]) / mass.sum())
    rollout = prime_rl_rollout([0, 1, 0, 2], [2, 2], [0, 0], vocab_size=4)
    check = check_rollout(x, rollout, top_p=top_p, logit_noise=0.0)
    assert check.verdict[0] == "no_logprob"  # the mask is fine; no logprob to judge
    assert check.verdict[1] == "support" and "not an upper set" in check.details[1]


def test_the_masks_are_judged_under_the_callers_oracle_settings() -> None:
    """The masks are judged in a thread of their own, with the caller's slow_path_only."""
    from tp_logprob.oracle import fast_path_stats
    from tp_logprob.oracle.fast_path import slow_path_only

    x = _logits()
    rollout = sglang_rollout(_response(x))
    fast_path_stats(reset=True)
    with slow_path_only():
        check_rollout(x, rollout, engine_temperature=T, top_p=0.9)
    counts = fast_path_stats(reset=True)["support_top_p"]
    assert counts.hits == 0 and counts.fallbacks >= N


def test_a_declared_engine_order_tightens_the_numerics_bound_and_is_named() -> None:
    from tp_logprob.accumulation import AccumulationOrder

    x = _logits()
    wide = 40  # a tree's path over the 48 columns (6 additions) is shorter than 39
    rollout = sglang_rollout(_response(x, k=wide))
    loose = check_rollout(x, rollout, engine_temperature=T, top_k=wide)
    tree = AccumulationOrder.tree()
    tight = check_rollout(x, rollout, engine_temperature=T, top_k=wide, engine_order=tree)
    assert np.all(tight.bound < loose.bound)
    assert tight.verdict == loose.verdict == ["agree"] * N
    assert loose.settings["engine_order"] == AccumulationOrder.any().describe()
    assert tight.settings["engine_order"] == tree.describe()
    # The trainer is held to the order its backend's capability declares.
    assert loose.settings["trainer_order"] == tree.describe()  # torch_native's pairwise tree
    # Over K kept columns any order adds at most K - 1 times: shorter than the tree.
    narrow = sglang_rollout(_response(x))
    anywise = check_rollout(x, narrow, engine_temperature=T, top_k=K)
    declared = check_rollout(x, narrow, engine_temperature=T, top_k=K, engine_order=tree)
    assert np.array_equal(anywise.bound, declared.bound)


def test_the_numerics_bound_counts_the_kept_columns_not_the_vocabulary() -> None:
    """Columns outside a replayed mask add exact zeros: at a 152,064 vocabulary a one-token
    mask's logprob of 0 is held to a bound near 1e-5, and a kept mass never
    renormalised is beyond the op's numerics (the vocabulary-wide
    any-order bound, about 0.01, would have called it agree)."""
    rows, vocab = 4, 152_064
    x = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(3)) * 3
    z = x.double() / T
    top = torch.argmax(z, dim=1)
    full = torch.log_softmax(z, dim=1)
    unrenormalised = [float(full[r, top[r]]) for r in range(rows)]
    response = {
        "output_ids": top.tolist(),
        "meta_info": {
            "output_token_sampling_mask": [[int(v)] for v in top],
            "output_token_sampling_logprobs": [0.0, 0.0, *unrenormalised[2:]],
        },
    }  # fmt: skip
    check = check_rollout(x, sglang_rollout(response), engine_temperature=T, top_k=1)
    assert np.all(check.bound < 1e-4), check.bound
    assert check.verdict[:2] == ["agree", "agree"]
    assert all(v != "agree" for v in check.verdict[2:]), check.markdown()


@pytest.mark.parametrize(
    ("order", "status", "said"),
    [
        ('{"kind": "tree", "fan_in": 2}', 1, None),
        ('{"kind": "spiral"}', 2, '--engine-order=\'{"kind": "spiral"}\''),
        ("tree", 2, "--engine-order='tree'"),
    ],
    ids=["a tree", "an unknown kind", "not JSON"],
)
def test_the_command_line_takes_the_engines_order(
    tmp_path: Path, capsys: Any, order: str, status: int, said: str | None
) -> None:
    x = _logits()
    response = tmp_path / "response.json"
    response.write_text(json.dumps([_response(x, faults={2: "full"})]))
    torch.save(x, tmp_path / "x.pt")
    report = tmp_path / "check.json"
    args = ["rollout-check", str(response), "--logits", str(tmp_path / "x.pt"), "--top-k", str(K)]
    args += ["--engine-temperature", str(T), "--engine-order", order, "--json", str(report)]
    assert main(args) == status
    if said is None:
        assert "pairwise" in json.loads(report.read_text())["settings"]["engine_order"]
    else:
        assert said in capsys.readouterr().err
        assert not report.exists()


def test_a_solved_temperature_displaces_a_fixed_cause_only_where_it_fits_far_better() -> None:
    """A response at T^2 whose temperature solves to 1.02 T^2 stays temperature_twice; one at
    0.9, which T^2 and T = 1 fit poorly, is temperature_other."""
    from tp_logprob.rollout.causes import Hypothesis
    from tp_logprob.rollout.check import _response_fit

    twice = Hypothesis("temperature_twice", T * T, "mask", "")
    missing = Hypothesis("temperature_missing", 1.0, "mask", "")
    other = Hypothesis("temperature_other", 1.02 * T * T, "mask", "")
    tokens = np.ones(40, dtype=np.bool_)
    shift = np.full(40, 1.0)
    near = {twice: np.full(40, 0.05), missing: np.full(40, 0.8), other: np.full(40, 0.04)}
    assert _response_fit(tokens, shift, near) == twice
    far = {twice: np.full(40, 0.3), missing: np.full(40, 0.2), other: np.full(40, 0.04)}
    assert _response_fit(tokens, shift, far) == other
    none = {twice: np.full(40, 0.5), missing: np.full(40, 0.9), other: np.full(40, 0.6)}
    assert _response_fit(tokens, shift, none) is None


@pytest.mark.parametrize("over_the_rules_support", [True, False])
def test_a_logprob_within_the_noise_over_the_rules_support_names_the_recomputed_mask(
    over_the_rules_support: bool,
) -> None:
    """A peaked row: top-p 0.5 keeps the top token alone, the engine returns top-k's five. Its
    logprob over the five, about -1e-6, and over the one, 0, both lie within the op's bound
    and the noise of each other: the mask is refused beyond the noise either way, and a 0,
    which the noise cannot make of the five's logprob, names the recomputed mask."""
    x = torch.zeros(1, V)
    x[0, :K] = torch.tensor([20.0, 10.0, 9.0, 8.5, 8.0])
    kept = list(range(K))
    z = x[0].double() / T
    over_five = float(z[0] - torch.logsumexp(z[kept], 0))
    assert -1e-5 < over_five < 0.0
    value = 0.0 if over_the_rules_support else over_five
    rollout = prime_rl_rollout(kept, [K], [0], logprobs=[value], vocab_size=V)
    check = check_rollout(x, rollout, engine_temperature=T, top_k=K, top_p=0.5, logit_noise=0.05)
    if over_the_rules_support:
        assert check.verdict == ["recomputed_mask"], check.details
        assert "the mask too: the mask keeps tokens" in check.details[0]
    else:
        assert check.verdict == ["support"], check.details


@pytest.mark.parametrize("over_the_rules_support", [True, False])
def test_a_refused_mask_weighs_the_two_faults_at_the_typical_scale_of_the_noise(
    over_the_rules_support: bool,
) -> None:
    """Top-p 0.95 keeps two of top-k's five. Their logprobs lie within the worst case of a
    noise of 0.3 of each other, but 3.2 typical scales (0.3 / 6) apart: the mask is refused
    beyond the noise, so the token is at fault either way, and the logprob over the two
    names the recomputed mask, the one over the five the mask alone."""
    x = torch.full((1, V), -10.0)
    x[0, :K] = torch.tensor([5.0, 3.0, 2.5, 2.0, 1.5])
    z = x[0].double() / T
    over_two = float(z[0] - torch.logsumexp(z[:2], 0))
    over_five = float(z[0] - torch.logsumexp(z[:K], 0))
    apart = token_shift(np.array([over_two]), np.array([over_five]), T)[0]
    assert 2.5 * 0.3 / 6 < apart < 0.3
    value = over_two if over_the_rules_support else over_five
    rollout = prime_rl_rollout(list(range(K)), [K], [0], logprobs=[value], vocab_size=V)
    check = check_rollout(x, rollout, engine_temperature=T, top_k=K, top_p=0.95, logit_noise=0.3)
    expected = "recomputed_mask" if over_the_rules_support else "support"
    assert check.verdict == [expected], check.details
