"""vLLM's "processed" logprobs ignored the temperature (vllm 0.10.0 to 0.10.1.1).

``logprobs_mode="processed_logprobs"`` is documented as the logprobs after all
processors, temperature and top-k/top-p included, the distribution the engine
samples from. In 0.10.0 to 0.10.1.1 ``Sampler.forward`` computed them before
``self.sample``, which divides by the temperature: they were
``log_softmax(logits)``. From 0.10.2 (vllm-project/vllm PR #22387) they come out
of ``TopKTopPSampler``, after the division. This runs the installed sampler on
one request at temperature 0.5 and asks for every token's logprob. Run
``python docs/history/repro_vllm_processed_logprobs_temperature.py``; it exits 1
while the bug is there.
"""

from importlib import metadata

import torch
from vllm import SamplingParams
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.sampler import Sampler

version = tuple(int(part) for part in metadata.version("vllm").split(".")[:3])
temperature, logits = 0.5, torch.tensor([[1.0, 0.0, -1.0, 2.0]])
params = SamplingParams(temperature=temperature)

# The min-p processor holds the request (min_p = 0 here); its API changed in 0.10.1.
if version < (0, 10, 1):
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessorManager
    from vllm.v1.sample.logits_processor import MinPLogitsProcessor as MinP

    min_p = MinP(max_num_reqs=1, pin_memory=False, device=torch.device("cpu"))
    min_p.update_state(BatchUpdate(batch_size=1, removed=[], moved=[], added=[(0, params, [])]))
    processors = LogitsProcessorManager(argmax_invariant=[min_p])
else:
    from types import SimpleNamespace

    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor as MinP
    from vllm.v1.sample.logits_processor.interface import BatchUpdate

    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=1))
    min_p = MinP(config, torch.device("cpu"), False)
    update = BatchUpdate(batch_size=1, removed=[], moved=[], added=[(0, params, [], [])])
    min_p.update_state(update)
    processors = LogitsProcessors([min_p])
mode = "processed_logprobs"
if version >= (0, 10, 2):
    from vllm.config import LogprobsMode

    mode = LogprobsMode.PROCESSED_LOGPROBS

width = logits.shape[1]
sampling = SamplingMetadata(
    temperature=torch.tensor([params.temperature]), all_greedy=False, all_random=True,
    top_p=None, top_k=None, generators={}, max_num_logprobs=width, no_penalties=True,
    prompt_token_ids=None, frequency_penalties=torch.zeros(1), presence_penalties=torch.zeros(1),
    repetition_penalties=torch.ones(1), output_token_ids=[], allowed_token_ids_mask=None,
    bad_words_token_ids={}, logitsprocs=processors,
)  # fmt: skip
out = Sampler(logprobs_mode=mode)(logits.clone(), sampling).logprobs_tensors
# Column 0 is the sampled token; then every token, most probable first.
mine = torch.empty(1, width).scatter_(1, out.logprob_token_ids[:, 1:].long(), out.logprobs[:, 1:])
expected = (logits / temperature).log_softmax(-1)
print(f"vllm {mine.tolist()!r}, log_softmax(logits / {temperature}) {expected.tolist()!r}")
raise SystemExit(0 if torch.allclose(mine, expected, rtol=1e-5, atol=1e-6) else 1)
