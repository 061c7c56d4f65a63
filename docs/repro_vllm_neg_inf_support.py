"""vLLM's support never holds a -inf logit, where the exact top-k rule keeps some
(vllm 0.33.0 and 0.34.0, PyTorch path).

Exact top-k keeps every token ``>= z_(k)``, the k-th largest value with
multiplicity. In ``z = [1, 0, -inf, -inf]`` with ``top_k = 3`` that value is
``-inf``, so all four tokens are kept (``|S| = 4``, threshold ``-inf``).
``apply_top_k_top_p_pytorch`` keeps them too (it masks ``< z_(k)``), but a kept
``-inf`` logit is indistinguishable from a masked one, and vLLM's sampling mask is
defined as the finite processed logits (``_compact_sampling_mask_kernel``): it
reports two tokens. The processed logprobs agree; the support size and threshold
do not. Run: ``python docs/repro_vllm_neg_inf_support.py`` (exits 1 while vLLM differs).
"""

import math

import torch
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

z = [1.0, 0.0, -math.inf, -math.inf]
top_k = 3
kth = sorted(z, reverse=True)[top_k - 1]
exact = [int(v >= kth) for v in z]
processed = apply_top_k_top_p_pytorch(torch.tensor([z]), torch.tensor([top_k]), None)
kept = torch.isfinite(processed[0]).int().tolist()
print("z", z, " top_k", top_k)
print("exact support", exact, " size", sum(exact), " threshold", kth)
threshold = processed[0][processed[0] > -math.inf].min().item()
print("vLLM support ", kept, " size", sum(kept), " threshold", threshold)
raise SystemExit(0 if kept == exact else 1)
