"""A vLLM request with top_p = 1 loses its underflowing tokens when another request
in the batch uses top-p (vllm 0.33.0 and 0.34.0, PyTorch path).

``top_p = 1`` leaves the rule off, so the exact support of ``z = [0, -200]`` is both
tokens, and the processed logprob of the second is ``-200 - log1p(exp(-200))``.
vLLM's input batch passes one ``top_p`` tensor for the whole batch as soon as one
request has ``top_p < 1``; for the ``top_p = 1`` row ``apply_top_k_top_p_pytorch``
then drops every position whose ascending fp32 ``cumsum`` is ``<= 1 - 1 = 0``,
which is every token whose fp32 probability underflows to 0. The row's support,
and its processed logprob (``-inf``), depend on the other requests in the batch.
Run: ``python docs/repro_vllm_top_p_one_in_batch.py`` (exits 1 while vLLM differs).
"""

import mpmath
import torch
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

row = [0.0, -200.0]
batch = torch.tensor([[0.0, -1.0], row])  # request 0 uses top_p 0.9, request 1 top_p 1
alone = apply_top_k_top_p_pytorch(torch.tensor([row]), None, None)
together = apply_top_k_top_p_pytorch(batch.clone(), None, torch.tensor([0.9, 1.0]))
with mpmath.workdps(50):
    exact = -200 - mpmath.log1p(mpmath.exp(-200))
print("z                                ", row, " top_p 1 (rule off)")
print("exact support, processed logprob ", [1, 1], mpmath.nstr(exact, 17))
for name, out in (("vLLM alone", alone[0]), ("vLLM beside a top_p 0.9 request", together[1])):
    kept = torch.isfinite(out).int().tolist()
    logprob = out.log_softmax(dim=-1)[1].item()
    print(f"{name:33}", kept, logprob)
raise SystemExit(0 if torch.isfinite(together[1]).all() else 1)
