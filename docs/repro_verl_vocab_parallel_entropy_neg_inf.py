"""verl's Megatron vocab_parallel_entropy is NaN for a row that holds a -inf logit (verl 0.9.1).

A -inf logit has probability 0 and contributes 0 to the entropy, so the row
[0, -inf, 0] has entropy log 2, like [0, 0]. ``_VocabParallelEntropy`` (verl's
Megatron engine, ``verl.utils.megatron.tensor_parallel``) computes ``M + log(sum
exp(x - M)) - sum(softmax(x) * x)`` over the tensor-parallel group, and ``softmax * x``
at that column is ``0 * -inf = NaN``; its gradient is NaN there too. The same holds on
every TP degree; one rank (a gloo group of one process) shows it. verl imports ray at
package import; the module needs megatron-core.
Run: ``python docs/repro_verl_vocab_parallel_entropy_neg_inf.py`` (exits 1 while the bug is
there).
"""

import math
import warnings

import torch
import torch.distributed as dist

warnings.simplefilter("ignore")  # Megatron's notices that Transformer Engine and Apex are absent
from megatron.core import parallel_state  # noqa: E402
from verl.utils.megatron.tensor_parallel import vocab_parallel_entropy  # noqa: E402

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)

logits = torch.tensor([[0.0, float("-inf"), 0.0], [0.0, 0.0, 0.0], [1.0, float("-inf"), 1.0]])
expected = torch.tensor([math.log(2), math.log(3), math.log(2)])
entropy = vocab_parallel_entropy(logits.clone())
print("vocab_parallel_entropy", entropy.tolist())
print("expected              ", expected.tolist())
dist.destroy_process_group()
raise SystemExit(0 if torch.allclose(entropy, expected) else 1)
