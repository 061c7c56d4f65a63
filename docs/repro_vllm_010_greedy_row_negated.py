"""vLLM 0.10 divides a greedy request's row by -1 in a mixed batch (vllm 0.10.2).

0.10's ``InputBatch.add_request`` stores ``-1.0`` as a greedy request's temperature
("avoid later division by zero"), and ``Sampler.sample`` divides every row of a batch
that is not all greedy by its temperature before top-k and top-p. With
``logprobs_mode="processed_logprobs"`` 0.10.2 returns ``log_softmax`` of those divided
logits, so a greedy row's processed logprobs are those of ``-x``: the token it picked,
the argmax, gets the smallest logprob of the row. A greedy row's processed logprob is
its raw logprob (``docs/semantics.md``, "Heterogeneous batches"; 0.11 divides a greedy
row by 1). Here row 0 is sampled at ``T = 0.7`` and row 1 is greedy, as 0.10's input
batch holds them. Run on 0.10.2: ``python docs/repro_vllm_010_greedy_row_negated.py``
(exits 1 while vLLM differs). 0.10.0 and 0.10.1 take every processed logprob before the
division, so their greedy row is the raw one (and every sampled row is too).
"""

import mpmath
import torch
from vllm.config import LogprobsMode
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.sampler import Sampler

x = torch.tensor([[1.0, 0.0, -1.0], [2.0, 0.0, -1.0]])
metadata = SamplingMetadata(
    temperature=torch.tensor([0.7, -1.0]),  # the input batch's -1.0 for the greedy request
    all_greedy=False,
    all_random=False,
    top_p=None,
    top_k=None,
    generators={},
    max_num_logprobs=3,
    no_penalties=True,
    prompt_token_ids=None,
    frequency_penalties=torch.zeros(2),
    presence_penalties=torch.zeros(2),
    repetition_penalties=torch.ones(2),
    output_token_ids=[[], []],
    allowed_token_ids_mask=None,
    bad_words_token_ids={},
    logitsprocs=LogitsProcessors(),
)
output = Sampler(logprobs_mode=LogprobsMode.PROCESSED_LOGPROBS)(x.clone(), metadata)
returned = output.logprobs_tensors
ids, values = returned.logprob_token_ids[1, 1:].tolist(), returned.logprobs[1, 1:].tolist()
logprob = dict(zip(ids, values, strict=True))[0]  # the greedy row's argmax, column 0
with mpmath.workdps(50):
    row = [mpmath.mpf(float(v)) for v in x[1]]
    exact = row[0] - mpmath.log(sum(mpmath.exp(v) for v in row))
print("greedy row x", x[1].tolist(), " sampled token", int(output.sampled_token_ids[1, 0]))
print("exact raw logprob of token 0      ", mpmath.nstr(exact, 17))
print("vLLM processed logprob of token 0 ", logprob)
raise SystemExit(0 if abs(logprob - float(exact)) < 1e-5 else 1)
