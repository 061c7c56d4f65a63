"""TRL's Triton logprob-and-entropy kernel is NaN when a row's first block is all -inf (trl 1.16.0).

``trl.kernels.selective_log_softmax_and_entropy`` (what TRL's ``selective_log_softmax``
runs on CUDA) walks a row in blocks of 1024 columns with an online softmax that starts
from ``max = -inf``. If the first block holds only ``-inf``, its rescaling factor is
``exp(max_old - max_new) = exp(-inf - -inf) = NaN``, and the NaN survives every later
block: the logprob of a finite target is NaN where torch's ``log_softmax`` gives a
finite value. One ``-inf`` column fewer (so the first block has a finite value) gives
the right logprob. Rows like this arise whenever a vocabulary mask or a top-k/top-p
filter sets a leading range of token ids to ``-inf``.

Run ``python docs/repro_trl_kernel_leading_neg_inf_block.py`` (on CPU it sets
``TRITON_INTERPRET=1`` itself); it exits 1 while the bug is there.
"""

import os

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from trl.kernels import selective_log_softmax_and_entropy

device = "cuda" if torch.cuda.is_available() else "cpu"
block = 1024
failed = False
for leading in (block - 1, block):
    logits = torch.zeros(1, 2 * block, device=device)
    logits[0, :leading] = float("-inf")
    target = torch.tensor([2 * block - 1], device=device)
    with np.errstate(all="ignore"):  # the interpreter evaluates inf - inf with numpy
        logprob, _ = selective_log_softmax_and_entropy(logits, target)
    expected = torch.log_softmax(logits, dim=1)[0, -1]
    print(f"{leading} leading -inf columns: trl {logprob.item()!r}, torch {expected.item()!r}")
    failed |= bool(torch.isnan(logprob).any())
raise SystemExit(1 if failed else 0)
