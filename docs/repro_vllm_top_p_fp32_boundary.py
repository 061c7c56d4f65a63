"""vLLM's fp32 top-p drops a token the exact rule keeps (vllm 0.33.0 and 0.34.0, PyTorch path).

Two tokens, ``z = [a, b]`` with ``a > b``, and ``top_p`` one fp32 step above the
probability ``p_a`` of the first. The exact rule keeps ``b`` iff the mass above it,
``p_a``, is ``< top_p``: it is, by one ulp of ``top_p``. vLLM decides with an fp32
``softmax``, an fp32 ascending ``cumsum`` and ``1 - top_p`` rounded to fp32, and
drops ``b``. Any fp32 implementation errs within its rounding error at such a
boundary (the suite judges it admissible there); the row shows how close the
boundary has to be, and that vLLM's error falls on the dropping side here.
Run: ``python docs/repro_vllm_top_p_fp32_boundary.py`` (exits 1 while vLLM differs).
"""

import mpmath
import torch
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

z = torch.tensor([[1.2608230113983154, 1.1623315811157227]])  # both exact fp32 values
top_p = 0.524603009223938  # an fp32 value, so vLLM's fp32 copy is the same number
with mpmath.workdps(50):
    weights = [mpmath.exp(mpmath.mpf(float(v))) for v in z[0]]
    p_a = weights[0] / (weights[0] + weights[1])
    exact = [1, int(p_a < mpmath.mpf(top_p))]
    margin = mpmath.mpf(top_p) - p_a
processed = apply_top_k_top_p_pytorch(z.clone(), None, torch.tensor([top_p], dtype=torch.float32))
kept = torch.isfinite(processed[0]).int().tolist()
print("z                ", z[0].tolist(), " top_p", top_p)
print("exact p_a        ", mpmath.nstr(p_a, 20), " top_p - p_a", mpmath.nstr(margin, 5))
print("exact support    ", exact)
print("vLLM support     ", kept)
raise SystemExit(0 if kept == exact else 1)
