"""Shared checks of the Triton backends' processed outputs: against torch_native's on the same
logits, and the cases the kernels treat apart (a replayed mask that is not an upper set).

Both backends find a recomputed support with the same ``support_threshold`` on the same
``z``, so ``support_size`` and ``support_threshold`` must be the same bits; the values
over ``S`` must lie within twice the backend's tolerance of torch_native's (each lies
within it of the exact value).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import tp_logprob as tpl
from tests.helpers.native_cases import REAL, bits
from tests.helpers.triton_cases import backend_tolerance

PROCESSED_OUTPUTS = (
    "selected_logp",
    "lse",
    "entropy",
    "support_lse",
    "support_size",
    "support_threshold",
)
"""Every output of a processed op that a comparison covers (None where not exported)."""

ENTROPY_REL = 1e-5
"""Relative room for entropy over ``S`` beside torch_native's (the tests' rows are well scaled)."""


def _same_special(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return (np.isnan(got) & np.isnan(want)) | (got == want)


def processed_report(
    backend: str,
    got: tpl.LogprobResult,
    want: tpl.LogprobResult,
    contract: tpl.LogprobContract,
    real: int = REAL,
) -> str | None:
    """None when ``got`` (a Triton backend's) matches torch_native's ``want`` as the module
    docstring says, else the first offending output and rows."""
    for name in ("support_size", "support_threshold"):
        a, b = getattr(got, name), getattr(want, name)
        if (a is None) != (b is None):
            return f"{backend}: {name} is {a!r}, torch_native's {b!r}"
        if a is not None and not torch.equal(bits(a), bits(b)):
            rows = torch.nonzero(bits(a) != bits(b)).flatten()[:5].tolist()
            return f"{backend}: {name} rows {rows}: {a[rows].tolist()} vs {b[rows].tolist()}"
    tol = backend_tolerance(backend, contract, real)
    active = contract.mask.dense()
    want_lse = want.support_lse.double().numpy()
    for name in ("selected_logp", "lse", "entropy", "support_lse"):
        a, b = getattr(got, name), getattr(want, name)
        if a is None or b is None:
            if (a is None) != (b is None):
                return f"{backend}: {name} is {a!r}, torch_native's {b!r}"
            continue
        x, y = a.double().numpy(), b.double().numpy()
        special = ~np.isfinite(y)
        finite = np.where(special, 0.0, y)
        if name in ("lse", "support_lse"):
            bound = tol.lse_bound(finite)
        elif name == "selected_logp":
            bound = tol.selected_bound(finite, np.where(np.isfinite(want_lse), want_lse, 0.0))
        else:
            bound = ENTROPY_REL * np.maximum(np.abs(finite), 1.0)
        with np.errstate(invalid="ignore"):
            ok = np.where(special, _same_special(x, y), np.abs(x - y) <= 2 * bound)
        if name in ("selected_logp", "entropy"):
            ok = np.where(active, ok, bits(a).numpy() == bits(b).numpy())
        if not ok.all():
            rows = np.flatnonzero(~ok)[:5].tolist()
            return f"{backend} vs torch_native, {name} rows {rows}: {x[rows]} vs {y[rows]}"
    return None


def scattered_keep(seed: int, rows: int, real: int = REAL, kept: int = 6) -> np.ndarray:
    """A replayed mask that is no upper set: ``kept`` columns per row drawn at random, so a
    row's support usually misses its maximum and a shard's support maximum lies below its
    running maximum (the kernels' second ``exp``)."""
    rng = np.random.default_rng(seed)
    keep = np.zeros((rows, real), dtype=bool)
    for row in range(rows):
        keep[row, rng.choice(real, size=kept, replace=False)] = True
    return keep


def kept_targets(keep: np.ndarray, seed: int, active: Any = None) -> torch.Tensor:
    """A target inside each row's support (as an engine samples), chosen at random;
    ``-100`` on inactive rows."""
    rng = np.random.default_rng(seed)
    targets = torch.tensor([int(rng.choice(np.flatnonzero(row))) for row in keep])
    if active is not None:
        targets[~torch.from_numpy(np.asarray(active))] = -100
    return targets
