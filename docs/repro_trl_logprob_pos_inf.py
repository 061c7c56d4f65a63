"""TRL's selective_log_softmax disagrees with the log_softmax().gather() it documents (trl 1.16.0).

The docstring says it equals ``torch.gather(logits.log_softmax(-1), -1, index)``.
For fp32 logits it computes ``logits[index] - logsumexp(logits)`` instead, which
differs on a row holding +inf: ``log_softmax`` gives NaN (``inf - inf``), TRL's fp32
path gives ``-inf`` for a finite target, and TRL's own bf16 path (row-wise
``log_softmax``) gives NaN, so the answer depends on the dtype.
Run: ``python docs/repro_trl_logprob_pos_inf.py`` (exits 1 while they disagree).
"""

import torch
from trl.trainer.utils import selective_log_softmax

logits = torch.tensor([[float("inf"), 0.5]])
index = torch.tensor([1])
documented = torch.gather(logits.log_softmax(-1), -1, index[:, None])[:, 0]
fp32_path = selective_log_softmax(logits, index)
bf16_path = selective_log_softmax(logits.bfloat16(), index)
print("log_softmax().gather()         ", documented.tolist())
print("selective_log_softmax fp32 path", fp32_path.tolist())
print("selective_log_softmax bf16 path", bf16_path.float().tolist())
same = torch.equal(documented.isnan(), fp32_path.isnan())
raise SystemExit(0 if same else 1)
