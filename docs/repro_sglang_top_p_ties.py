"""SGLang's top-p cuts a tie at the boundary by sort position (sglang 0.5.23, PyTorch path).

The exact rule (docs/semantics.md, "Processed logprobs") keeps a token iff the
mass of the tokens with strictly larger probability is ``< top_p``, so tokens
tied at the boundary are all kept. ``top_k_top_p_min_p_sampling_from_probs_torch``
sorts descending and drops a position whose running mass *before it* is
``> top_p``, a mass that counts the tied tokens the sort put first: of four equal
logits at ``top_p = 0.5`` it keeps three (masses 0, 1/4, 1/2) and drops the
fourth (3/4), where the exact rule keeps all four (the mass above each is 0).
The function is compiled from SGLang's installed ``sglang/srt/layers/sampler.py``
(its module does not import without a GPU build; ``tp_logprob.peers.sglang_sampler``).
Run: ``python docs/repro_sglang_top_p_ties.py`` (exits 1 while SGLang differs).
"""

from fractions import Fraction

import torch

from tp_logprob.peers.sglang_sampler import installed_definitions

sample = installed_definitions()["top_k_top_p_min_p_sampling_from_probs_torch"]
z = [0.0, 0.0, 0.0, 0.0]
top_p = Fraction(1, 2)
mass_above = [sum(Fraction(1, 4) for u in z if u > v) for v in z]
exact = [int(mass < top_p) for mass in mass_above]
_, weights, ids, _ = sample(
    torch.softmax(torch.tensor([z]), dim=-1),
    torch.tensor([1 << 30], dtype=torch.int32),
    torch.tensor([float(top_p)]),
    torch.tensor([0.0]),
    False,
    None,
    torch.zeros(1, dtype=torch.int64),
    return_filtered_probs=True,
)
kept = [0] * len(z)
for weight, token in zip(weights[0].tolist(), ids[0].tolist(), strict=True):
    kept[token] = int(weight > 0)
print("z             ", z, " top_p", float(top_p))
print("exact support ", exact, " size", sum(exact))
print("SGLang support", kept, " size", sum(kept))
raise SystemExit(0 if kept == exact else 1)
