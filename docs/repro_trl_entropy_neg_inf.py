"""TRL's entropy is NaN for a row that holds a -inf logit (trl 1.16.0, torch path).

A -inf logit has probability 0 and contributes 0 to the entropy, so the row
[0, -inf, 0] has entropy log 2, like [0, 0]. ``entropy_from_logits``
(and ``selective_log_softmax_and_entropy``, which calls it off CUDA) computes
``-(exp(logp) * logp).sum()``, and ``exp(-inf) * -inf`` is ``0 * -inf = NaN``.
-inf logits are routine in RL: top-k / top-p filtering and vocabulary masks set
them. Run: ``python docs/repro_trl_entropy_neg_inf.py`` (exits 1 while the bug is there).
"""

import math

import torch
from trl.trainer.utils import entropy_from_logits, selective_log_softmax_and_entropy

logits = torch.tensor([[0.0, float("-inf"), 0.0], [0.0, 0.0, 0.0], [1.0, float("-inf"), 1.0]])
expected = torch.tensor([math.log(2), math.log(3), math.log(2)])
entropy = entropy_from_logits(logits)
_, entropy_too = selective_log_softmax_and_entropy(logits, torch.tensor([0, 0, 0]))
print("entropy_from_logits              ", entropy.tolist())
print("selective_log_softmax_and_entropy", entropy_too.tolist())
print("expected                         ", expected.tolist())
raise SystemExit(0 if torch.allclose(entropy, expected) else 1)
