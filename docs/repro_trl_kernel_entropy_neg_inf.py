"""TRL's Triton logprob-and-entropy kernel gives a NaN entropy beside a -inf logit (trl 1.16.0).

A -inf logit has probability 0 and contributes 0 to the entropy, so the row
[0, -inf, 0] has entropy log 2, like [0, 0]. ``trl.kernels.selective_log_softmax_and_entropy``
(what TRL's ``selective_log_softmax_and_entropy`` and ``entropy_from_logits`` run on CUDA)
sums ``exp(z - max) * z`` over each block of columns, and at a -inf logit that is
``0 * -inf = NaN``; the backward's ``p * (E[z] - z)`` is NaN there too. The selected
logprob is right. -inf logits are routine in RL: top-k / top-p filtering and vocabulary
masks set them.

Run ``python docs/repro_trl_kernel_entropy_neg_inf.py`` (on CPU it sets
``TRITON_INTERPRET=1`` itself); it exits 1 while the bug is there.
"""

import math
import os

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from trl.kernels import selective_log_softmax_and_entropy

device = "cuda" if torch.cuda.is_available() else "cpu"
logits = torch.tensor([[0.0, float("-inf"), 0.0], [0.0, 0.0, 0.0]], device=device)
expected = torch.tensor([math.log(2), math.log(3)])
with np.errstate(all="ignore"):  # the interpreter evaluates 0 * -inf with numpy
    _, entropy = selective_log_softmax_and_entropy(logits, torch.tensor([0, 0], device=device))
print("kernel  ", entropy.tolist())
print("expected", expected.tolist())
raise SystemExit(0 if torch.allclose(entropy.cpu(), expected) else 1)
