"""verl's logprobs_from_logits answers a +inf row by dtype: -inf in fp32, NaN in bf16 (verl 0.9.1).

Off flash-attn (CPU, or ``VERL_DISABLE_FLASH_ATTN_CE=1``) it runs
``logprobs_from_logits_v2``, whose docstring states ``log_softmax(x_i) = x_i -
logsumexp(x)``. For fp32 logits it computes the right-hand side, which on a row
holding +inf gives ``-inf`` for a finite target; ``log_softmax`` gives NaN there
(``inf - inf``), and so do verl's own bf16 path (row-wise ``log_softmax``) and
``logprobs_from_logits_naive``. verl imports ray at package import.
Run: ``python docs/repro_verl_logprob_pos_inf.py`` (exits 1 while they disagree).
"""

import os

os.environ["VERL_DISABLE_FLASH_ATTN_CE"] = "1"  # the torch path, on any machine

import torch
from verl.utils.torch_functional import logprobs_from_logits, logprobs_from_logits_naive

logits = torch.tensor([[float("inf"), 0.5]])
labels = torch.tensor([1])
stated = torch.log_softmax(logits, dim=-1).gather(-1, labels[:, None])[:, 0]
fp32_path = logprobs_from_logits(logits, labels)
bf16_path = logprobs_from_logits(logits.bfloat16(), labels)
naive = logprobs_from_logits_naive(logits, labels)
print("log_softmax().gather()              ", stated.tolist())
print("logprobs_from_logits fp32 path      ", fp32_path.tolist())
print("logprobs_from_logits bf16 path      ", bf16_path.float().tolist())
print("logprobs_from_logits_naive          ", naive.tolist())
same = torch.equal(stated.isnan(), fp32_path.isnan())
raise SystemExit(0 if same else 1)
