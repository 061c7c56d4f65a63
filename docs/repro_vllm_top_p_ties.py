"""vLLM's top-p cuts a tie at the boundary by sort position (vllm 0.33.0 and 0.34.0, PyTorch path).

The exact rule (docs/semantics.md, "Processed logprobs") keeps a token iff the
mass of the tokens with strictly larger probability is ``< top_p``, so tokens
tied at the boundary are all kept. ``apply_top_k_top_p_pytorch`` sorts the row
ascending and drops the positions whose running ``cumsum`` is ``<= 1 - top_p``:
of four equal logits at ``top_p = 0.5`` it keeps the two that the sort put last
and drops the other two, so the processed logprob of a dropped one is ``-inf``
where the exact value is ``log(1/4)``. Which two survive depends on the sort.
Run: ``python docs/repro_vllm_top_p_ties.py`` (exits 1 while vLLM differs).
"""

import math
from fractions import Fraction

import torch
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

z = [0.0, 0.0, 0.0, 0.0]
top_p = Fraction(1, 2)
# Equal logits: every probability is 1/4 exactly, and no token has a strictly larger one.
mass_above = [sum(Fraction(1, 4) for u in z if u > v) for v in z]
exact = [int(mass < top_p) for mass in mass_above]
processed = apply_top_k_top_p_pytorch(torch.tensor([z]), None, torch.tensor([float(top_p)]))
kept = torch.isfinite(processed[0]).int().tolist()
logprobs = processed.log_softmax(dim=-1)[0].tolist()
print("z                     ", z, " top_p", float(top_p))
print("exact support         ", exact, " processed logprob", [math.log(1 / sum(exact))] * 4)
print("vLLM support          ", kept, " processed logprob", logprobs)
raise SystemExit(0 if kept == exact else 1)
