"""vLLM's min-p keeps a token the exact rule drops (vllm 0.34.0, ``CPUSamplingStates``).

Exact min-p keeps ``v`` iff ``exp(z_v - M) >= min_p``. With ``z = [0, fp32(log 0.5)]``
and ``min_p = 0.5``, ``exp(fp32(log 0.5)) = 0.4999999990...`` is below ``0.5``: the
second token is out. From 0.34 the model runner's min-p drops ``z_v < M + log(min_p)``
in fp32 (``CPUSamplingStates.apply_min_p``; the Triton runner's ``_min_p_kernel`` is
the same comparison): ``log(fp32(0.5))`` rounds to ``fp32(log 0.5)`` itself, the
token equals the threshold, and it is kept. (Up to 0.33 vLLM compared fp32
probabilities and kept it too: ``docs/repro_vllm_min_p_fp32_boundary.py``.) Run:
``python docs/repro_vllm_034_min_p_boundary.py`` (exits 1 while vLLM differs).
"""

import mpmath
import numpy as np
import torch
from vllm import SamplingParams
from vllm.v1.worker.cpu.sampler import CPUSamplingStates

min_p = 0.5
z = torch.tensor([[0.0, -0.6931471824645996]])  # fp32(log 0.5), just below log 0.5
states = CPUSamplingStates(max_num_reqs=1, vocab_size=2, device=torch.device("cpu"))
states.add_request(0, SamplingParams(min_p=min_p, seed=0))
processed = z.clone()
states.apply_min_p(processed, torch.tensor([0]), np.array([0]))
kept = torch.isfinite(processed[0]).int().tolist()
with mpmath.workdps(50):
    ratios = [mpmath.exp(mpmath.mpf(float(v)) - 0) for v in z[0]]
    exact = [int(ratio >= mpmath.mpf(min_p)) for ratio in ratios]
print("z               ", z[0].tolist(), " min_p", min_p)
print("exact exp(z - M)", [mpmath.nstr(ratio, 15) for ratio in ratios])
print("exact support   ", exact)
print("vLLM support    ", kept)
raise SystemExit(0 if kept == exact else 1)
