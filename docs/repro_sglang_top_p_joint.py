"""SGLang's top-p reads the mass of the full distribution, not of the top-k survivors
(sglang 0.5.23, PyTorch path).

The exact rules (docs/semantics.md, "Processed logprobs") apply top-p after top-k,
on the distribution renormalised over the survivors. ``top_k_top_p_min_p_sampling_
from_probs_torch`` takes the cumsum of the sorted probabilities *before* zeroing the
positions past ``top_k`` (the joint rule of FlashInfer's ``filter_apply_order=
"joint"``), so the mass before a token is its share of the whole vocabulary. With
probabilities ``[0.4, 0.3, 0.2, 0.1]``, ``top_k = 3`` and ``top_p = 0.42``: exactly,
the second token has ``0.4 / 0.9 = 0.444 >= 0.42`` above it and is dropped; SGLang
sees ``0.4 <= 0.42`` and keeps it.
The function is compiled from SGLang's installed ``sglang/srt/layers/sampler.py``
(its module does not import without a GPU build; ``tp_logprob.peers.sglang_sampler``).
Run: ``python docs/repro_sglang_top_p_joint.py`` (exits 1 while SGLang differs).
"""

from fractions import Fraction

import torch

from tp_logprob.peers.sglang_sampler import installed_definitions

sample = installed_definitions()["top_k_top_p_min_p_sampling_from_probs_torch"]
probs = [Fraction(4, 10), Fraction(3, 10), Fraction(2, 10), Fraction(1, 10)]
top_k, top_p = 3, Fraction(42, 100)
survivors = sorted(probs, reverse=True)[:top_k]
mass = sum(survivors)
exact = [int(p in survivors and sum(q for q in survivors if q > p) / mass < top_p) for p in probs]
z = torch.tensor([[float(p) for p in probs]]).log()
_, weights, ids, _ = sample(
    torch.softmax(z, dim=-1),
    torch.tensor([top_k], dtype=torch.int32),
    torch.tensor([float(top_p)]),
    torch.tensor([0.0]),
    False,
    None,
    torch.zeros(1, dtype=torch.int64),
    return_filtered_probs=True,
)
kept = [0] * len(probs)
for weight, token in zip(weights[0].tolist(), ids[0].tolist(), strict=True):
    kept[token] = int(weight > 0)
print("p             ", [float(p) for p in probs], " top_k", top_k, " top_p", float(top_p))
print("exact support ", exact, " size", sum(exact))
print("SGLang support", kept, " size", sum(kept))
raise SystemExit(0 if kept == exact else 1)
