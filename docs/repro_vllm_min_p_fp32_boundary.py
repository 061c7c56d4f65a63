"""vLLM's min-p keeps a token the exact rule drops (vllm 0.33.0, ``MinPLogitsProcessor``).

Exact min-p keeps ``v`` iff ``exp(z_v - M) >= min_p``. With ``z = [0, fp32(log 0.5)]``
and ``min_p = 0.5``, ``exp(fp32(log 0.5)) = 0.4999999990...`` is below ``0.5``: the
second token is out. vLLM compares fp32 probabilities, ``p_v < max p * min_p``,
and both sides round to ``1/3``: it keeps the token. (vLLM's model runner v2 uses
another rounding again, ``z_v < M + log(min_p)`` in a Triton kernel, not runnable
on CPU.) Run: ``python docs/repro_vllm_min_p_fp32_boundary.py`` (exits 1 while vLLM
differs).
"""

from types import SimpleNamespace

import mpmath
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor
from vllm.v1.sample.logits_processor.interface import BatchUpdate

min_p = 0.5
z = torch.tensor([[0.0, -0.6931471824645996]])  # fp32(log 0.5), just below log 0.5
config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=1))
processor = MinPLogitsProcessor(config, torch.device("cpu"), False)
added = [(0, SamplingParams(min_p=min_p), None, [])]
processor.update_state(BatchUpdate(batch_size=1, removed=[], added=added, moved=[]))
kept = torch.isfinite(processor.apply(z.clone())[0]).int().tolist()
with mpmath.workdps(50):
    ratios = [mpmath.exp(mpmath.mpf(float(v)) - 0) for v in z[0]]
    exact = [int(ratio >= mpmath.mpf(min_p)) for ratio in ratios]
print("z               ", z[0].tolist(), " min_p", min_p)
print("exact exp(z - M)", [mpmath.nstr(ratio, 15) for ratio in ratios])
print("exact support   ", exact)
print("vLLM support    ", kept)
raise SystemExit(0 if kept == exact else 1)
