"""One row whose tempered logits overflow makes SGLang's sampler raise for the batch
(sglang 0.5.23, PyTorch path).

SGLang divides the fp32 logits by the temperature in place and takes the softmax;
a logit of ``2.6e38`` at ``T = 0.6`` is ``+inf`` in fp32, so that row's
probabilities are NaN, and ``top_k_top_p_min_p_sampling_from_probs_torch`` draws
with ``torch.multinomial``, which raises ``RuntimeError: probability tensor contains
either inf, nan or element < 0`` for the whole batch (a NaN logit does the same).
The exact rules give such a row an undefined support (NaN outputs) and every
other row its values; the engine gives none. (``SGLANG_SANITIZE_NAN_LOGITS``, off by
default, maps NaN to ``-1e30`` before the division, which does not help ``+inf``.)
The function is compiled from SGLang's installed ``sglang/srt/layers/sampler.py``
(its module does not import without a GPU build; ``tp_logprob.peers.sglang_sampler``).
Run: ``python docs/repro_sglang_nonfinite_raises.py`` (exits 1 while SGLang differs).
"""

import torch

from tp_logprob.peers.sglang_sampler import installed_definitions

sample = installed_definitions()["top_k_top_p_min_p_sampling_from_probs_torch"]
logits = torch.tensor([[2.6e38, 0.0], [1.0, 0.0]])
temperature = 0.6
probs = torch.softmax(logits / torch.full((2, 1), temperature), dim=-1)
print("logits", logits.tolist(), " T", temperature, " probabilities", probs.tolist())
try:
    sample(
        probs,
        torch.tensor([2, 2], dtype=torch.int32),
        torch.tensor([1.0, 1.0]),
        torch.tensor([0.0, 0.0]),
        False,
        None,
        torch.zeros(2, dtype=torch.int64),
        return_filtered_probs=True,
    )
except RuntimeError as error:
    print("SGLang raises for the batch:", error)
    raise SystemExit(1) from None
print("SGLang returns a support for every row")
