"""The rollout check: a trainer's logits against an engine's responses, token by token.

For every sampled token three logprobs sit side by side: the **oracle**, the exact
processed logprob over the engine's own mask at the engine's temperature, from
the trainer's logits (:func:`~tp_logprob.oracle.exact_selected_logprob`,
correctly rounded); the **trainer**'s, its backend on the same logits
(:mod:`tp_logprob.rollout.trainer`); and the **engine**'s own, from another
forward pass. The trainer is held to the op's tight bound
(:mod:`tp_logprob.rollout.numerics`). The engine is judged against the logit
noise (:mod:`tp_logprob.rollout.noise`) plus that bound: within it a token is
``agree`` or ``noise``; beyond it the first common cause that reproduces it is
named (:mod:`tp_logprob.rollout.causes`), else ``unexplained``; a cause the
response's evidence finds present is named on its tokens within the noise that sit
on its prediction (:mod:`tp_logprob.rollout.evidence`). The mask is
judged against the sampling rules under the same noise
(:mod:`tp_logprob.rollout.support`): ``borderline`` or ``support``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import copy_context
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tp_logprob.accumulation import AccumulationOrder
from tp_logprob.engine_formats import EngineRollout
from tp_logprob.oracle import exact_processed_logprob, exact_selected_logprob, exact_support
from tp_logprob.oracle import support_margins as op_margins
from tp_logprob.rollout.borderline import judge_under_noise, reachable, supports_under_noise
from tp_logprob.rollout.causes import (
    Hypothesis,
    explained,
    fixed_hypotheses,
    full_vocabulary_lse,
    is_stale,
    kept_logprob,
    solve_temperature,
)
from tp_logprob.rollout.evidence import (
    MIN_CONFIDENT,
    POSTERIOR,
    THRESHOLD,
    TIGHT,
    CauseEvidence,
    attribute,
    log_ratios,
    mixture,
    name_within_noise,
    select_causes,
    typical_scale,
)
from tp_logprob.rollout.inputs import (
    check_logits,
    check_noise_model,
    check_options,
    join_rollouts,
)
from tp_logprob.rollout.noise import (
    estimate_noise,
    given_noise,
    noise_interval,
    token_magnitude,
    token_shift,
)
from tp_logprob.rollout.numerics import op_bound
from tp_logprob.rollout.report import ResponseFinding, RolloutCheck
from tp_logprob.rollout.support import screen_masks, tempered_top_columns
from tp_logprob.rollout.trainer import (
    dense_mask,
    kept_values,
    logit_rows,
    trainer_contract,
    trainer_logprobs,
)

__all__ = ["check_rollout"]

BLOCK_VALUES = 1 << 21  # float64 values per block: 16 MiB, a few rows at a 152k vocabulary
RESPONSE_FIT = 3.0
"""A response fits a cause when the cause's median misfit is this many times smaller."""
MIN_RESPONSE = 8

Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]


def check_rollout(
    logits: Any,
    rollouts: EngineRollout | Sequence[EngineRollout],
    *,
    engine_temperature: float = 1.0,
    trainer_temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    real_vocab_size: int | None = None,
    logit_noise: float | None = None,
    logit_noise_model: tuple[float, float] | None = None,
    clip: float = 0.2,
    engine_order: AccumulationOrder | None = None,
    backend: str = "torch_native",
    group: Any = None,
    files: Sequence[str] | None = None,
) -> RolloutCheck:
    """Check engine responses against the trainer's ``logits``: a ``[N, V]`` tensor whose
    rows are the responses' tokens in order, or one shard per TP rank (a list, in rank
    order), or, with ``group``, this rank's shard on the real group (every rank calls it).

    ``top_k`` / ``top_p`` / ``min_p`` are the engine's sampling parameters, when known;
    ``logit_noise`` the size of the perturbation between the engine's and the trainer's
    logits, the same on every token, or ``logit_noise_model`` its ``(a, b)`` in
    ``a + b m_t`` (:mod:`tp_logprob.rollout.noise`; estimated from the tokens when both
    are None); ``clip`` PPO's clip range;
    ``engine_order`` how the engine's logprob op sums a shard, when it declares one (its
    numerics bound; None: any order). The trainer's backend is held to the bound of the
    order its capability declares.

    >>> check = check_rollout(logits, rollout, engine_temperature=0.7)  # doctest: +SKIP
    >>> print(check.markdown())  # doctest: +SKIP
    """

    responses = [rollouts] if isinstance(rollouts, EngineRollout) else list(rollouts)
    params: dict[str, Any] = {"top_k": top_k, "top_p": top_p, "min_p": min_p}
    check_options(engine_temperature, trainer_temperature, params, logit_noise, clip)
    given = (
        logit_noise
        if logit_noise_model is None
        else check_noise_model(logit_noise_model, logit_noise)
    )
    shards = list(logits) if isinstance(logits, (list, tuple)) else [logits]
    rollout, owner = join_rollouts(responses)
    dtype = check_logits(shards, rollout, real_vocab_size, group, files)
    trainer_t = engine_temperature if trainer_temperature is None else trainer_temperature
    contract, columns = trainer_contract(shards, rollout, dtype, trainer_t, real_vocab_size, group)
    rv = contract.sharding.real_vocab_size
    tp = contract.sharding.tp_world_size
    has_params = any(v is not None for v in params.values())
    t = engine_temperature
    block = max(1, BLOCK_VALUES // max(contract.sharding.padded_vocab_size, 1))
    margins = op_margins(dtype, rv, num_shards=tp)
    hypotheses = fixed_hypotheses(t, has_params)
    full = list(dict.fromkeys(h.temperature for h in hypotheses if h.support == "full"))
    with ThreadPoolExecutor(max_workers=2) as pool:
        # The masks are screened and the full vocabulary's log-sum-exp taken (numpy, a
        # thread each) while the backend runs (its ranks' threads).
        screening = None
        if has_params:
            context = copy_context()  # the caller's oracle settings (slow_path_only)
            screening = pool.submit(
                lambda: context.run(screen_masks, columns, rollout, margins, rv, t, params, block)
            )
        whole = pool.submit(full_vocabulary_lse, columns, rv, full, block) if full else None
        trainer, trainer_order = trainer_logprobs(
            columns if group is None else shards[0], rollout, contract, backend, group
        )
        # Over a replayed mask the oracle needs the kept columns only: every other column
        # counts as -inf, so the kept values, padded with -inf, give the same correctly
        # rounded result.
        kept, local = kept_values(columns, rollout)
        active = rollout.has_mask
        oracle, support_lse = exact_selected_logprob(kept, local, active_mask=active, temperature=t)
        problems = {} if screening is None else screening.result()
        lse = {} if whole is None else whole.result()
    n = rollout.num_tokens
    engine = np.full(n, math.nan) if rollout.logprobs is None else rollout.logprobs.copy()
    widest = int(rollout.support.kept_counts().max(initial=1))
    bound = op_bound(contract, oracle, support_lse, engine_order, widest)
    trainer_bound = op_bound(contract, oracle, support_lse, trainer_order, widest)
    finite = np.isfinite(engine) & np.isfinite(oracle) & np.isfinite(trainer)
    judged = active & finite
    verdict = np.array(["agree"] * n, dtype=object)
    detail = np.array([""] * n, dtype=object)
    verdict[~active], detail[~active] = "no_mask", "no mask at this position"
    missing = active & np.isnan(engine)
    verdict[missing], detail[missing] = "no_logprob", "the engine gave no logprob"
    for t_ in np.flatnonzero(active & ~missing & ~finite).tolist():
        verdict[t_], detail[t_] = "nonfinite", _nonfinite(oracle[t_], trainer[t_], engine[t_])

    predicted = _predictions(hypotheses, kept, local, lse, judged)
    informative = judged & (rollout.support.kept_counts() > 1)
    shift = np.where(informative, token_shift(engine, oracle, t), math.nan)
    misfit = {h: token_shift(engine, v, h.temperature) for h, v in predicted.items()}
    magnitude = token_magnitude(kept)
    largest = float(magnitude.max(initial=0.0))
    noise = (
        estimate_noise(shift, np.stack(list(misfit.values())), magnitude, largest)
        if given is None
        else given_noise(given, magnitude, largest)
    )
    eps = noise.per_token
    low, high = noise_interval(oracle, eps, t)
    with np.errstate(invalid="ignore"):
        within_op = np.abs(engine - oracle) <= bound
    inside = explained(engine, oracle, bound, eps, t)
    verdict[judged & ~within_op & inside] = "noise"
    beyond = judged & ~inside
    refused = np.zeros(n, dtype=np.bool_)
    refused[list(problems)] = True
    fine = _masks_under_noise(problems, columns, rollout, margins, rv, t, eps, params, block)
    recomputed_rows: Callable[[Bools], Floats] | None = None
    strict = refused.copy()
    strict[[row for row, ok in fine.items() if ok]] = False
    # A mask refused beyond the noise beside a logprob within it: the logprob may be over
    # the rules' support all the same (:func:`_hidden_recomputed`).
    hidden = strict & judged & ~beyond
    recomputed = next((h for h in hypotheses if h.support == "recomputed"), None)
    if recomputed is not None and (beyond & refused).any():
        # The recomputed support is tried where the rules refuse the mask only. A mask the
        # noise explains is the rules' up to borderline ids: the engine's support is then
        # the recomputed one as the trainer's logits give it (no noise).
        seen = _Seen(engine, np.where(strict, eps, 0.0), margins)
        values = _recomputed(columns, rollout, beyond & refused, t, rv, params, block, seen)
        predicted[recomputed] = values
        misfit[recomputed] = token_shift(engine, values, t)
        recomputed_rows = lambda rows: _recomputed(  # noqa: E731
            columns, rollout, rows & refused, t, rv, params, block, seen
        )

    open_ = _name_tokens(beyond, engine, bound, eps, predicted, misfit, verdict, detail)
    findings = []
    sigma = typical_scale(shift, eps, informative & np.isin(verdict, ("agree", "noise")))
    for index, (begin, end) in enumerate(_spans(owner)):
        span = np.zeros(n, dtype=np.bool_)
        span[begin:end] = True
        # The temperature solved for this response joins the causes for it alone.
        tried, misfits = dict(predicted), dict(misfit)
        solved = _solve(engine, kept, local, t, span & informative)
        if solved is not None and min(abs(solved / c - 1.0) for c in (t, 1.0, t * t)) > 0.02:
            other = Hypothesis(
                "temperature_other", solved, "mask",
                f"the logprob is at T={solved:.4g} (solved for this response)",
            )  # fmt: skip
            tried[other] = kept_logprob(kept, local, solved)
            misfits[other] = token_shift(engine, tried[other], solved)
        fit = _response_fit(span & informative, shift, misfits)
        if fit is not None:
            # Two causes in runs whose predictions sit near each other can each fit most of
            # a response: one fits the whole only where the evidence finds no second.
            causes = _response_evidence(
                span, informative, beyond, verdict, engine, bound, eps, shift, sigma, tried, misfits
            )  # fmt: skip
            if len(causes) > 1:
                fit = None
        if fit is not None:
            # The whole response fits one cause: it is named on every token it fits better
            # than the noise does, within the noise too, before any cause of a single token.
            with np.errstate(invalid="ignore"):
                hit = span & judged & (misfits[fit] < shift)
            hit |= span & open_ & explained(engine, tried[fit], bound, eps, fit.temperature)
            verdict[hit] = fit.name
            detail[hit] = _said(fit, tried[fit], hit)
            open_ &= ~hit
        solved = fit.temperature if fit is not None and fit.name == "temperature_other" else None
        stale = fit is None and is_stale(span & beyond, span & open_, span & informative)
        if stale:
            # Every token of the response came from the other weights; the ones the noise
            # hides are stale too.
            hit = span & judged & ~within_op
            verdict[hit] = "stale_policy"
            detail[hit] = "most of this response is far beyond the noise and no cause fits it"
            open_ &= ~hit
        evidence: list[CauseEvidence] = []
        if fit is None and not stale:
            if recomputed_rows is not None:
                _extend_recomputed(span, verdict, predicted, misfit, recomputed_rows, engine, t)
            evidence = _response_evidence(
                span, informative, beyond, verdict, engine, bound, eps, shift, sigma, tried, misfits
            )  # fmt: skip
            found_names = {found.cause for found in evidence}
            present = [h for h in tried if h.name in found_names]
            _prefer_present(span, present, engine, bound, eps, tried, misfits, verdict, detail)
            for found in evidence:
                h = next(h for h in tried if h.name == found.cause)
                if h.name == "temperature_other":
                    solved = h.temperature
                for row in found.tokens:
                    verdict[row] = h.name
                    detail[row] = (
                        f"named by the response's evidence (the cause raises Lambda by "
                        f"{found.gain:.3g} over {found.within} tokens within the noise, "
                        f"{found.beyond} beyond it that it explains): "
                        f"{h.what}: it predicts {tried[h][row]:.6g}"
                    )
                for row in found.placed:
                    if verdict[row] in found_names and verdict[row] != h.name:
                        verdict[row] = h.name
                        detail[row] = (
                            f"{h.what}: it predicts {tried[h][row]:.6g} (another cause this "
                            f"response's evidence finds explains the token too; the tokens "
                            f"around it hold this one)"
                        )
        findings.append(
            ResponseFinding(index, begin, end, solved, stale, _name(fit), tuple(evidence))
        )
    verdict[open_] = "unexplained"
    for t_ in np.flatnonzero(open_).tolist():
        detail[t_] = f"{shift[t_]:.3g} logit shift needed, beyond the noise {eps[t_]:.3g}"
    if recomputed is not None and hidden.any():
        # The rules' own support on the trainer's logits: the support nearest the engine's
        # logprob under the noise would fit a logprob over the returned mask as well.
        point = _Seen(engine, np.zeros(n), margins)
        values = _recomputed(columns, rollout, hidden, t, rv, params, block, point)
        _hidden_recomputed(hidden, engine, oracle, recomputed, values, t, sigma, verdict, detail)
    _mask_verdicts(problems, fine, verdict, detail)
    for finding in findings:
        if finding.stale:  # its masks come from the other weights too
            part = verdict[finding.begin : finding.end]  # a view: written through
            part[part == "support"] = "stale_policy"
    _judge_trainer(
        trainer, oracle, trainer_bound, kept, local, trainer_t, t, judged, verdict, detail
    )
    settings = {
        "engine_temperature": t,
        "trainer_temperature": trainer_t,
        "backend": backend,
        "tp": tp,
        "vocab": rv,
        "dtype": dtype,
        "clip": clip,
        "engine_order": (engine_order or AccumulationOrder.any()).describe(),
        "trainer_order": trainer_order.describe(),
        **{k: v for k, v in params.items() if v is not None},
    }
    return RolloutCheck(
        engine=rollout.engine,
        settings=settings,
        noise=noise,
        response=owner,
        token_ids=rollout.token_ids,
        oracle=oracle,
        trainer=trainer,
        engine_logprob=engine,
        bound=bound,
        noise_low=low,
        noise_high=high,
        verdict=[str(v) for v in verdict],
        details=[str(d) for d in detail],
        responses=findings,
    )


def _predictions(
    hypotheses: list[Hypothesis],
    kept: Floats,
    local: npt.NDArray[np.int64],
    lse: dict[float, Floats],
    judged: Bools,
) -> dict[Hypothesis, Floats]:
    """Each mask or full-vocabulary hypothesis' logprob on every judged token (``lse``: the
    full vocabulary's log-sum-exp at each full hypothesis' temperature)."""
    found: dict[Hypothesis, Floats] = {}
    sampled = np.take_along_axis(kept, local[:, None], axis=1)[:, 0]
    for h in hypotheses:
        if h.support == "mask":
            found[h] = kept_logprob(kept, local, h.temperature)
        elif h.support == "full":
            z = (sampled.astype(np.float32) / np.float32(h.temperature)).astype(np.float64)
            found[h] = np.where(judged, z - lse[h.temperature], math.nan)
    return found


@dataclass(frozen=True)
class _Seen:
    """What the recomputed support is judged under: the engine's logprobs, the logit noise
    per token (0 where the noise explains the returned mask: the engine's support is then
    the rules' own) and the op's margins."""

    engine: Floats
    eps: Floats
    margins: Any


def _recomputed(
    columns: list[Any],
    rollout: EngineRollout,
    rows_wanted: Bools,
    temperature: float,
    rv: int,
    params: dict[str, Any],
    block: int,
    seen: _Seen,
) -> Floats:
    """The logprob over the rules' support on the trainer's logits, on ``rows_wanted``;
    where the noise lets the rules give another support on the engine's logits, over the
    one of those whose logprob is nearest the engine's (:func:`_nearest_support`).

    With top-k the rules keep none but each row's top columns of the tempered logits
    ``fl(x / T)`` (:func:`tempered_top_columns`; not of ``x``, which ``/ T`` can tie at
    the boundary), and the logprob over a support reads its kept columns only, so both
    are computed on those columns: the same decisions and the same correctly rounded
    values."""

    found = np.full(rollout.num_tokens, math.nan)
    rows = np.flatnonzero(rows_wanted)
    top_k = params.get("top_k")
    for start in range(0, rows.size, block):
        part = rows[start : start + block]
        x, width = logit_rows(columns, part), rv
        full = x[:, :rv]
        targets = rollout.token_ids[part]
        narrowed = None if top_k is None or top_k >= rv else tempered_top_columns(
            x[:, :rv], top_k, temperature
        )  # fmt: skip
        if narrowed is not None:
            x, ids = narrowed
            width = x.shape[1]
            places = ids == targets[:, None]
            targets = np.where(places.any(axis=1), places.argmax(axis=1), -1)
        support = exact_support(x, real_vocab_size=width, temperature=temperature, **params)
        usable = targets >= 0
        usable[usable] = support.mask[np.flatnonzero(usable), targets[usable]]
        value, _, _ = exact_processed_logprob(
            x, np.where(usable, targets, 0), support.mask,
            active_mask=usable, real_vocab_size=width, temperature=temperature,
        )  # fmt: skip
        found[part] = np.where(usable, value, math.nan)
        noisy = np.flatnonzero(seen.eps[part] > 0.0)
        if not noisy.size:
            continue
        base = np.zeros((noisy.size, rv), dtype=np.bool_)
        for j, i in enumerate(noisy.tolist()):
            kept = support.mask[i, :width]
            base[j, kept.nonzero()[0] if narrowed is None else ids[i, kept & (ids[i] >= 0)]] = True
        # Columns a perturbation cannot lift to the k-th largest stay out of every support.
        reach = (
            reachable(full[noisy], base, int(top_k), seen.eps[part[noisy]])
            if top_k is not None and top_k < rv
            else np.ones_like(base)
        )
        for j, i in enumerate(noisy.tolist()):
            row = int(part[i])
            engine = float(seen.engine[row])
            if not math.isfinite(engine):
                continue
            nearest = _nearest_support(
                full[i], base[j], np.flatnonzero(reach[j]), int(rollout.token_ids[row]),
                float(found[row]), engine, float(seen.eps[row]), seen.margins, temperature,
                params,
            )  # fmt: skip
            if nearest is not None:
                found[row] = nearest
    return found


def _nearest_support(
    x: npt.NDArray[np.float32],
    base: Bools,
    cols: npt.NDArray[np.int64],
    target: int,
    point: float,
    engine: float,
    eps: float,
    margins: Any,
    temperature: float,
    params: dict[str, Any],
) -> float | None:
    """The logprob of ``target`` over the support, among those the rules can give row ``x``
    under a noise ``eps`` (:func:`supports_under_noise`; ``base`` the one they give ``x``;
    ``cols`` the columns any of them can hold), nearest the engine's logprob ``engine``;
    None where that is ``point`` (the logprob over ``base``, correctly rounded). Float64
    sums: their error is far below the noise that makes supports differ."""
    xr, kept = x[cols], base[cols]
    order, low, high = supports_under_noise(xr, kept, margins, cols.size, temperature, eps, params)
    places = np.flatnonzero(cols[order[:high]] == target)
    if not places.size or (low == high == int(kept.sum())):
        return None
    z = (xr / np.float32(temperature)).astype(np.float64)[order[:high]]
    place = int(places[0])
    top = float(z.max())
    weights = np.exp(z - top)
    start = float(weights[:low].sum()) + (float(weights[place]) if place >= low else 0.0)
    extra = weights[low:high].copy()
    if place >= low:
        extra[place - low] = 0.0
    mass = start + np.concatenate([[0.0], np.cumsum(extra)])
    values = z[place] - (top + np.log(mass))
    best = float(values[int(np.argmin(np.abs(values - engine)))])
    if math.isfinite(point) and abs(point - engine) <= abs(best - engine):
        return None
    return best


def _name_tokens(
    beyond: Bools,
    engine: Floats,
    bound: Floats,
    eps: Floats,
    predicted: dict[Hypothesis, Floats],
    misfit: dict[Hypothesis, Floats],
    verdict: npt.NDArray[Any],
    detail: npt.NDArray[Any],
) -> Bools:
    """Each token beyond the noise takes the cause that explains it with the least misfit;
    the tokens left open are returned."""
    choice = _nearest(beyond, list(predicted), engine, bound, eps, predicted, misfit)
    for row, chosen in enumerate(choice):
        if chosen is not None:
            verdict[row] = chosen.name
            detail[row] = f"{chosen.what}: it predicts {predicted[chosen][row]:.6g}"
    return np.asarray(beyond & np.array([c is None for c in choice]), dtype=np.bool_)


def _nearest(
    rows: Bools,
    hypotheses: list[Hypothesis],
    engine: Floats,
    bound: Floats,
    eps: Floats,
    predicted: dict[Hypothesis, Floats],
    misfit: dict[Hypothesis, Floats],
) -> list[Hypothesis | None]:
    """Per token of ``rows``: the one of ``hypotheses`` that explains it with the least
    misfit (the first on a tie; None where none explains it)."""
    best = np.full(engine.size, math.inf)
    choice: list[Hypothesis | None] = [None] * engine.size
    for h in hypotheses:
        fits = rows & explained(engine, predicted[h], bound, eps, h.temperature)
        score = np.where(np.isnan(misfit[h]), 0.0, misfit[h])
        for row in np.flatnonzero(fits & (score < best)).tolist():
            best[row], choice[row] = score[row], h
    return choice


def _response_fit(
    tokens: Bools, shift: Floats, misfit: dict[Hypothesis, Floats]
) -> Hypothesis | None:
    """The cause a whole response fits: its median misfit over the response's tokens a
    :data:`RESPONSE_FIT` part of the noise's (the engine's own temperature, the mask
    returned), and the smallest such; None if none.

    A temperature solved for the response has a free parameter, so it fits at least as
    well as any fixed one near it (T^2 solved as 1.02 T^2 from noisy tokens): it
    displaces a fixed cause that fits only where it fits a :data:`RESPONSE_FIT` part of
    that cause's misfit."""
    if int(tokens.sum()) < MIN_RESPONSE:
        return None
    null = float(np.nanmedian(shift[tokens]))
    scores = {
        h: float(np.median(values[tokens]))
        for h, values in misfit.items()
        if not np.isnan(values[tokens]).any()
    }
    fits = {h: score for h, score in scores.items() if score * RESPONSE_FIT < null}
    fixed = {h: score for h, score in fits.items() if h.name != "temperature_other"}
    solved = {h: score for h, score in fits.items() if h.name == "temperature_other"}
    found = min(fixed, key=fixed.__getitem__, default=None)
    for h, score in solved.items():
        if found is None or score * RESPONSE_FIT < fixed[found]:
            found = h
    return found


def _prefer_present(
    span: Bools,
    present: list[Hypothesis],
    engine: Floats,
    bound: Floats,
    eps: Floats,
    predicted: dict[Hypothesis, Floats],
    misfit: dict[Hypothesis, Floats],
    verdict: npt.NDArray[Any],
    detail: npt.NDArray[Any],
) -> None:
    """A token beyond the noise named after a cause the response's evidence did not find,
    which a cause it found also explains, takes the found cause (the nearest, if several).

    Causes predict alike on many tokens (the temperature missing and the kept mass not
    renormalised both raise a likely token's logprob): token by token the smaller misfit
    wins by chance, where the response says which cause is there."""
    if not present:
        return
    names = {h.name for h in present}
    moved = span & np.isin(verdict, [h.name for h in predicted]) & ~np.isin(verdict, list(names))
    choice = _nearest(moved, present, engine, bound, eps, predicted, misfit)
    for row, h in enumerate(choice):
        if h is not None:
            verdict[row] = h.name
            detail[row] = (
                f"{h.what}: it predicts {predicted[h][row]:.6g} (the cause this response's "
                f"evidence finds, which explains the token as well)"
            )


def _extend_recomputed(
    span: Bools,
    verdict: npt.NDArray[Any],
    predicted: dict[Hypothesis, Floats],
    misfit: dict[Hypothesis, Floats],
    compute: Callable[[Bools], Floats],
    engine: Floats,
    t: float,
) -> None:
    """The recomputed support on a response's other tokens, where enough of its tokens beyond
    the noise took it for its evidence to be weighed (the support is costly to recompute)."""
    h = next(h for h in predicted if h.support == "recomputed")
    if int((span & (verdict == h.name)).sum()) < MIN_CONFIDENT:
        return
    rows = span & np.isnan(predicted[h])
    values = compute(rows)
    done = rows & np.isfinite(values)
    predicted[h][done] = values[done]
    misfit[h][done] = token_shift(engine[done], values[done], t)


def _hidden_recomputed(
    hidden: Bools,
    engine: Floats,
    oracle: Floats,
    h: Hypothesis,
    values: Floats,
    t: float,
    sigma: Floats,
    verdict: npt.NDArray[Any],
    detail: npt.NDArray[Any],
) -> None:
    """A token whose mask the rules refuse beyond the noise and whose logprob lies within
    it (``hidden``) takes ``recomputed_mask`` (``h``) where ``values``, the logprob over the
    rules' support, lies :data:`TIGHT` typical scales (``sigma``) or more from the returned
    mask's, and its logprob within :data:`TIGHT` of ``values`` and :data:`RESPONSE_FIT`
    times nearer it than the returned mask's: the engine took it over the support the
    rules give, and returned another mask (said beside it). Elsewhere the mask alone is at
    fault. The token is at fault either way (its mask is refused), so the two faults are
    weighed at the noise's typical scale, not at its worst case."""
    with np.errstate(invalid="ignore"):
        fit = token_shift(engine, values, t)
        apart = token_shift(values, oracle, t) >= TIGHT * sigma
        nearer = (fit * RESPONSE_FIT < token_shift(engine, oracle, t)) & (fit <= TIGHT * sigma)
    named = hidden & np.isin(verdict, ("agree", "noise")) & np.isfinite(values) & apart & nearer
    for row in np.flatnonzero(named).tolist():
        verdict[row] = h.name
        detail[row] = (
            f"{h.what}: it predicts {values[row]:.6g}, the returned mask {oracle[row]:.6g}"
        )


def _response_evidence(
    span: Bools,
    informative: Bools,
    far: Bools,
    verdict: npt.NDArray[Any],
    engine: Floats,
    bound: Floats,
    eps: Floats,
    shift: Floats,
    sigma: Floats,
    predicted: dict[Hypothesis, Floats],
    misfit: dict[Hypothesis, Floats],
) -> list[CauseEvidence]:
    """The causes present in the response ``span`` (:mod:`tp_logprob.rollout.evidence`; the
    temperature solved for it among them) and, for each, its tokens within the noise that
    it names and those beyond it (``far``) that it takes from other causes present."""
    within = span & informative & np.isin(verdict, ("agree", "noise"))
    explains = {
        h: span & far & explained(engine, values, bound, eps, h.temperature)
        for h, values in predicted.items()
    }
    causes = {h.name: h for h in misfit}
    beyond = {h.name: int(explains[h].sum()) for h in misfit}
    if max(beyond.values(), default=0) < MIN_CONFIDENT:
        return []
    confident = np.logical_or.reduce([explains[h] for h in misfit])
    usable = np.isfinite(sigma) & np.isfinite(shift)
    rows = np.flatnonzero((within | confident) & usable)
    s = sigma[rows]
    ratios = {name: log_ratios(shift[rows], misfit[h][rows], s) for name, h in causes.items()}
    chosen = _choose(ratios, beyond)
    if not chosen:
        return []
    names = [name for name, _ in chosen]
    stacked = np.stack([ratios[name] for name in names])
    statistic, share = mixture(stacked)
    distance = np.stack(
        [np.nan_to_num(misfit[causes[name]][rows] / s, nan=math.inf) for name in names]
    )
    split = attribute(stacked)
    picked = name_within_noise(stacked, distance, share, split)
    picked[~within[rows]] = -1
    several = np.stack([explains[causes[name]][rows] for name in names]).sum(axis=0) > 1
    sure = several & ~within[rows] & (split.max(axis=0) >= POSTERIOR)
    placed = np.where(sure, np.argmax(split, axis=0), -1)
    return [
        CauseEvidence(
            name,
            beyond[name],
            int((within & usable).sum()),
            gain,
            statistic,
            float(share[i]),
            tuple(rows[picked == i].tolist()),
            tuple(rows[placed == i].tolist()),
        )
        for i, (name, gain) in enumerate(chosen)
    ]


def _choose(ratios: dict[str, Floats], beyond: dict[str, int]) -> list[tuple[str, float]]:
    """The fixed causes present (:func:`select_causes`), unless the temperature solved for
    the response alone raises ``Lambda`` by :data:`THRESHOLD` over all of them: it has a
    free parameter, so it fits at least as well as a fixed temperature near it, and must
    do clearly better to displace them."""
    solved = "temperature_other"
    fixed = {name: r for name, r in ratios.items() if name != solved}
    chosen = select_causes(fixed, beyond)
    if solved not in ratios or beyond[solved] < MIN_CONFIDENT:
        return chosen
    alone = mixture(ratios[solved][None])[0]
    if alone >= sum(gain for _, gain in chosen) + THRESHOLD:
        return [(solved, alone)]
    return chosen


def _name(h: Hypothesis | None) -> str | None:
    return None if h is None else h.name


def _solve(
    engine: Floats, kept: Floats, local: npt.NDArray[np.int64], t: float, rows: Bools
) -> float | None:
    picked = np.flatnonzero(rows)
    if not picked.size:
        return None
    return solve_temperature(engine[picked], kept[picked], local[picked], t)


def _spans(owner: npt.NDArray[np.int64]) -> list[tuple[int, int]]:
    ends = np.flatnonzero(np.diff(owner)) + 1
    starts = np.concatenate([[0], ends]).tolist()
    stops = np.concatenate([ends, [owner.size]]).tolist()
    return list(zip(starts, stops, strict=True))


def _said(h: Hypothesis, values: Floats, hit: Bools) -> list[str]:
    return [f"{h.what}: it predicts {values[i]:.6g}" for i in np.flatnonzero(hit).tolist()]


def _nonfinite(oracle: float, trainer: float, engine: float) -> str:
    parts = [
        f"{name} {float(value)!r}"
        for name, value in (("oracle", oracle), ("trainer", trainer), ("engine", engine))
        if not math.isfinite(value)
    ]
    return "non-finite: " + ", ".join(parts)


def _masks_under_noise(
    problems: dict[int, str],
    columns: list[Any],
    rollout: EngineRollout,
    margins: Any,
    rv: int,
    t: float,
    eps: Floats,
    params: dict[str, Any],
    block: int,
) -> dict[int, bool]:
    """Per mask the op's margins refuse: can the noise explain it (borderline)?"""
    rows = np.array(sorted(problems), dtype=np.int64)
    fine: list[bool] = []
    for start in range(0, rows.size, block):
        part = rows[start : start + block]
        x = logit_rows(columns, part)
        mask = dense_mask(rollout, part, x.shape[1])
        fine += judge_under_noise(x, mask, margins, rv, t, eps[part], params)
    return dict(zip(rows.tolist(), fine, strict=True))


def _mask_verdicts(
    problems: dict[int, str],
    fine: dict[int, bool],
    verdict: npt.NDArray[Any],
    detail: npt.NDArray[Any],
) -> None:
    """Each refused mask's verdict: borderline or support (beside a logprob cause, said in
    its detail)."""
    for row, ok in fine.items():
        current = str(verdict[row])
        if ok:
            if current in ("agree", "noise", "no_logprob"):
                verdict[row] = "borderline"
                detail[row] = f"within the noise: {problems[row]}"
        elif current in ("agree", "noise", "no_logprob"):
            verdict[row], detail[row] = "support", problems[row]
        else:
            detail[row] = f"{detail[row]}; the mask too: {problems[row]}"


def _judge_trainer(
    trainer: Floats,
    oracle: Floats,
    bound: Floats,
    kept: Floats,
    local: npt.NDArray[np.int64],
    trainer_t: float,
    t: float,
    judged: Bools,
    verdict: npt.NDArray[Any],
    detail: npt.NDArray[Any],
) -> None:
    """The trainer's backend against the oracle, within the op's bound alone."""
    with np.errstate(invalid="ignore"):
        off = judged & (np.abs(trainer - oracle) > bound)
    if not off.any():
        return
    at_own = kept_logprob(kept, local, trainer_t) if trainer_t != t else None
    for row in np.flatnonzero(off).tolist():
        if at_own is not None and abs(trainer[row] - at_own[row]) <= bound[row]:
            cause, why = "trainer_temperature", f"trainer: its logprob is at T={trainer_t!r}"
        else:
            cause = "trainer_numerics"
            why = f"trainer: {abs(trainer[row] - oracle[row]):.3g} from the oracle, bound " \
                f"{bound[row]:.3g}"  # fmt: skip
        if str(verdict[row]) in ("agree", "noise", "borderline"):
            verdict[row], detail[row] = cause, why
        else:
            detail[row] = f"{detail[row]}; {why}"
