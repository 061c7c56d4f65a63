"""Liger-Kernel's fused_selective_log_softmax is NaN when a row's first block is all -inf (0.8.5).

``liger_kernel.ops.grpo_loss.fused_selective_log_softmax`` (the old and reference
logprobs of Liger's Triton GRPO loss) walks each row in blocks of 2048 columns with an
online softmax that starts from ``m = -inf``. If the first block holds only ``-inf``,
its rescaling factor is ``exp(m - m_new) = exp(-inf - -inf) = NaN``, and the NaN
survives every later block: the logprob of a finite target is NaN where torch's
``log_softmax`` gives a finite value. One ``-inf`` column fewer gives the right logprob.
Rows like this arise whenever a vocabulary mask or a top-k/top-p filter sets a leading
range of token ids to ``-inf``.

Run ``python docs/repro_liger_selective_leading_neg_inf_block.py`` (on CPU it sets
``TRITON_INTERPRET=1`` itself); it exits 1 while the bug is there.
"""

import os

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from liger_kernel.ops.grpo_loss import fused_selective_log_softmax

device = "cuda" if torch.cuda.is_available() else "cpu"
block = 2048
failed = False
for leading in (block - 1, block):
    logits = torch.zeros(1, 2, 2 * block, device=device)  # [B, L + 1, V]: position 1 unread
    logits[0, 0, :leading] = float("-inf")
    ids = torch.tensor([[2 * block - 1]], device=device)
    with np.errstate(all="ignore"):  # the interpreter evaluates inf - inf with numpy
        logprob = fused_selective_log_softmax(logits, ids, temperature=1.0)[0, 0]
    expected = torch.log_softmax(logits[0, 0], dim=0)[-1]
    print(f"{leading} leading -inf columns: liger {logprob.item()!r}, torch {expected.item()!r}")
    failed |= bool(torch.isnan(logprob).any())
raise SystemExit(1 if failed else 0)
