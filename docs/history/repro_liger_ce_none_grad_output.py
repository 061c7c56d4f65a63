"""Liger-Kernel's cross entropy backward with ``reduction="none"`` scaled every row by
the first row's upstream gradient (0.5.0 to 0.5.8).

The backward multiplied the stored gradient by ``grad_output`` with a Triton kernel
that loads one scalar, ``grad_output[0]``; with ``reduction="none"`` the upstream
gradient has one entry per row, so every row got row 0's (linkedin/Liger-Kernel#678,
fixed in 0.5.9 by PR #680). A per-token weighted loss, as in policy-gradient
training, gets wrong gradients. Run
``python docs/history/repro_liger_ce_none_grad_output.py`` (on CPU it sets
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
weights = torch.tensor([1.0, -2.0, 0.5], device=device)

mine = logits.clone().requires_grad_(True)
loss = liger_loss(mine, target)
(weights * loss).sum().backward()
theirs = logits.clone().requires_grad_(True)
(weights * torch.nn.functional.cross_entropy(theirs, target, reduction="none")).sum().backward()
print(f"row 1 gradient: liger {mine.grad[1].tolist()!r}")
print(f"                torch {theirs.grad[1].tolist()!r}")
raise SystemExit(0 if torch.allclose(mine.grad, theirs.grad, rtol=1e-5, atol=1e-6) else 1)
