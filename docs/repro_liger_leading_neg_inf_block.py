"""Liger-Kernel's cross entropy is NaN when a row's first block is entirely -inf (0.8.5).

The kernel runs an online softmax over blocks of ``MAX_FUSED_SIZE`` (32,768 on CUDA
and CPU) columns, starting from ``m = -inf``. If the first block holds only
``-inf``, its update computes ``exp2((m - m_new) * log2 e)`` with ``m = m_new = -inf``,
that is ``exp2(NaN)``, and the NaN survives every later block. torch's
``cross_entropy`` gives the finite answer. Rows like this arise whenever a
vocabulary mask or a top-k/top-p filter sets a leading range of token ids to
``-inf``. One column fewer of ``-inf`` (so the first block has a finite value)
gives the right loss. Found by tp-logprob's wide sweep (``test_wide_vocabularies``).

Run ``python docs/repro_liger_leading_neg_inf_block.py`` (on CPU it sets
``TRITON_INTERPRET=1`` itself); it exits 1 while the bug is there.
"""

import os

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from liger_kernel.ops import cross_entropy

device = "cuda" if torch.cuda.is_available() else "cpu"
block = cross_entropy.MAX_FUSED_SIZE
failed = False
for leading in (block - 1, block):
    logits = torch.zeros(1, 2 * block, device=device)
    logits[0, :leading] = float("-inf")
    target = torch.tensor([2 * block - 1], device=device)
    with np.errstate(all="ignore"):  # the interpreter evaluates inf - inf with numpy
        loss = cross_entropy.LigerCrossEntropyFunction.apply(
            logits.clone(), target, None, -100, 0.0, 0.0, "none"
        )[0]
    expected = torch.nn.functional.cross_entropy(logits, target, reduction="none")
    print(f"{leading} leading -inf columns: liger {loss.item()!r}, torch {expected.item()!r}")
    failed |= bool(torch.isnan(loss).any())
raise SystemExit(1 if failed else 0)
