"""Liger-Kernel's cross entropy with ``reduction="none"`` returned one summed scalar (<= 0.4.2).

``cross_entropy_forward`` summed the per-row losses whatever the reduction, so
``LigerCrossEntropyLoss(reduction="none")`` (and the Function under it) gave a 0-d
tensor, the sum of the rows,
where torch gives one loss per row (linkedin/Liger-Kernel#421, fixed in 0.5.0 by
PR #435). Run ``python docs/history/repro_liger_ce_none_summed.py`` (on CPU it sets
``TRITON_INTERPRET=1`` itself); it exits 1 while the bug is there.
"""

import inspect
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction

# From 0.5.3 on, forward takes a class weight after the target.
WEIGHT = ("weight" in inspect.signature(LigerCrossEntropyFunction.forward).parameters) * (None,)


def liger_loss(logits, target):
    """Per-row losses, ``reduction="none"``, no weight, z-loss, smoothing or softcap."""
    return LigerCrossEntropyFunction.apply(logits, target, *WEIGHT, -100, 0.0, 0.0, "none")[0]


device = "cuda" if torch.cuda.is_available() else "cpu"
logits = torch.linspace(-2.0, 3.0, 24, device=device).reshape(3, 8)
target = torch.tensor([1, 5, 7], device=device)
loss = liger_loss(logits.clone(), target)
expected = torch.nn.functional.cross_entropy(logits, target, reduction="none")
print(f"liger {loss.tolist()!r} (shape {tuple(loss.shape)}), torch {expected.tolist()!r}")
same = loss.shape == expected.shape and torch.allclose(loss, expected, rtol=1e-5, atol=1e-6)
raise SystemExit(0 if same else 1)
