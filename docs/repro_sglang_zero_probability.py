"""SGLang's support is the tokens of positive fp32 probability (sglang 0.5.23, PyTorch path).

The exact rules (docs/semantics.md, "Processed logprobs") keep a token by its
logit, whatever its probability: in ``z = [0, -104]`` at ``top_k = 2`` both tokens
are kept and the second one's processed logprob is about ``-104``. SGLang filters
the fp32 probabilities, and ``Sampler._build_sampling_mask_output`` reads the
support as the weights ``> 0``: ``exp(-104)`` underflows to 0 in fp32, so the
second token leaves the support and its processed logprob is ``-inf``. The same
holds for a kept ``-inf`` logit (top-k at a ``-inf`` k-th value) and, with no rule
at all, for every token whose probability underflows.
The function is compiled from SGLang's installed ``sglang/srt/layers/sampler.py``
(its module does not import without a GPU build; ``tp_logprob.peers.sglang_sampler``).
Run: ``python docs/repro_sglang_zero_probability.py`` (exits 1 while SGLang differs).
"""

import torch

from tp_logprob.peers.sglang_sampler import installed_definitions

sample = installed_definitions()["top_k_top_p_min_p_sampling_from_probs_torch"]
z = [0.0, -104.0]
top_k = 2
exact = [1, 1]  # top_k = |V|: every token is kept
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
probs = torch.softmax(torch.tensor(z), dim=0).tolist()
print("z             ", z, " top_k", top_k, " fp32 probabilities", probs)
print("exact support ", exact, " size", sum(exact))
print("SGLang support", kept, " size", sum(kept))
raise SystemExit(0 if kept == exact else 1)
