"""verl's entropy_from_logits is NaN for a row that holds a -inf logit (verl 0.9.1).

A -inf logit has probability 0 and contributes 0 to the entropy, so the row
[0, -inf, 0] has entropy log 2, like [0, 0]. ``entropy_from_logits`` computes
``logsumexp(x) - sum(softmax(x) * x)``, and ``softmax * x`` at that column is
``0 * -inf = NaN``; float64 does not help. -inf logits are routine in RL: top-k /
top-p filtering and vocabulary masks set them. verl imports ray at package import.
Run: ``python docs/repro_verl_entropy_neg_inf.py`` (exits 1 while the bug is there).
"""

import math

import torch
from verl.utils.torch_functional import entropy_from_logits

logits = torch.tensor([[0.0, float("-inf"), 0.0], [0.0, 0.0, 0.0], [1.0, float("-inf"), 1.0]])
expected = torch.tensor([math.log(2), math.log(3), math.log(2)])
entropy = entropy_from_logits(logits)
entropy64 = entropy_from_logits(logits.double())
print("entropy_from_logits fp32", entropy.tolist())
print("entropy_from_logits fp64", entropy64.tolist())
print("expected                ", expected.tolist())
raise SystemExit(0 if torch.allclose(entropy, expected) else 1)
