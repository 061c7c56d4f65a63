"""OpenRLHF's compute_entropy is NaN for a row that holds a -inf logit (openrlhf 0.11.2).

A -inf logit has probability 0 and contributes 0 to the entropy, so the row
[0, -inf, 0] has entropy log 2, like [0, 0]. ``compute_entropy`` (what the actor's
``forward(..., return_entropy=True)`` returns) is ``logsumexp(z) - sum(softmax(z) * z)``,
and ``softmax(z) * z`` is ``0 * -inf = NaN`` there. -inf logits are routine in RL:
top-k / top-p filtering and vocabulary masks set them. ``openrlhf.models.utils`` does
not import without flash-attn, so the function is compiled from the installed
``openrlhf/models/utils.py`` (``tp_logprob.peers.openrlhf_actor``), its
``@torch.compile`` included.
Run: ``python docs/repro_openrlhf_entropy_neg_inf.py`` (exits 1 while the bug is there).
"""

import math

import torch

from tp_logprob.peers.openrlhf_actor import installed_definitions

compute_entropy = installed_definitions()["compute_entropy"]
logits = torch.tensor([[0.0, float("-inf"), 0.0], [0.0, 0.0, 0.0]])
expected = torch.tensor([math.log(2), math.log(3)])
entropy = compute_entropy(logits)
print("compute_entropy", entropy.tolist())
print("expected       ", expected.tolist())
raise SystemExit(0 if torch.allclose(entropy, expected) else 1)
