"""SGLang's top-k cuts a tie at the k-th value by sort position (sglang 0.5.23, PyTorch path).

The exact rule (docs/semantics.md, "Processed logprobs") keeps every token
``>= z_(k)``, the k-th largest value with multiplicity, so tokens tied at the k-th
value are all kept. ``top_k_top_p_min_p_sampling_from_probs_torch`` sorts the fp32
probabilities descending and zeroes every position ``>= top_k``: of
``z = [1, 0, 0, 0, -1]`` at ``top_k = 2`` it keeps the maximum and one of the three
zeros, so the processed logprob of the other two is ``-inf`` where the exact value
is ``-log(e + 3)``. Which zero survives depends on the sort.
The function is compiled from SGLang's installed ``sglang/srt/layers/sampler.py``
(its module does not import without a GPU build; ``tp_logprob.peers.sglang_sampler``).
Run: ``python docs/repro_sglang_top_k_ties.py`` (exits 1 while SGLang differs).
"""

import torch

from tp_logprob.peers.sglang_sampler import installed_definitions

sample = installed_definitions()["top_k_top_p_min_p_sampling_from_probs_torch"]
z = [1.0, 0.0, 0.0, 0.0, -1.0]
top_k = 2
kth = sorted(z, reverse=True)[top_k - 1]
exact = [int(v >= kth) for v in z]
_, weights, ids, _ = sample(
    torch.softmax(torch.tensor([z]), dim=-1),
    torch.tensor([top_k], dtype=torch.int32),
    torch.tensor([1.0]),
    torch.tensor([0.0]),
    False,
    None,
    torch.zeros(1, dtype=torch.int64),
    return_filtered_probs=True,
)
kept = [0] * len(z)
for weight, token in zip(weights[0].tolist(), ids[0].tolist(), strict=True):
    kept[token] = int(weight > 0)
print("z             ", z, " top_k", top_k)
print("exact support ", exact, " size", sum(exact))
print("SGLang support", kept, " size", sum(kept))
raise SystemExit(0 if kept == exact else 1)
