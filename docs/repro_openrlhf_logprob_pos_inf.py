"""OpenRLHF's log_probs_from_logits answers a +inf row by dtype: -inf in fp32, NaN in bf16
(openrlhf 0.11.2).

Without flash-attn (CPU) the fp32 path computes ``gather(logits) - logsumexp``, the
identity its comment states (``log_softmax(x_i) = x_i - logsumexp(x)``); on a row
holding +inf that gives ``-inf`` for a finite target, where ``log_softmax`` gives NaN
(``inf - inf``), and so does OpenRLHF's own 16-bit path (row-wise ``log_softmax``).
``openrlhf.models.utils`` does not import without flash-attn, so the function is
compiled from the installed ``openrlhf/models/utils.py`` (``tp_logprob.peers.openrlhf``).
Run: ``python docs/repro_openrlhf_logprob_pos_inf.py`` (exits 1 while they disagree).
"""

import torch

from tp_logprob.peers.openrlhf import installed_definitions

log_probs_from_logits = installed_definitions()["log_probs_from_logits"]
logits = torch.tensor([[float("inf"), 0.5]])
labels = torch.tensor([1])
stated = torch.log_softmax(logits, dim=-1).gather(-1, labels[:, None])[:, 0]
fp32_path = log_probs_from_logits(logits.clone(), labels)
bf16_path = log_probs_from_logits(logits.bfloat16(), labels)
print("log_softmax().gather()          ", stated.tolist())
print("log_probs_from_logits fp32 path ", fp32_path.tolist())
print("log_probs_from_logits bf16 path ", bf16_path.float().tolist())
raise SystemExit(0 if torch.equal(stated.isnan(), fp32_path.isnan()) else 1)
