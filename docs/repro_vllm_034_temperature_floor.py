"""vLLM raises a temperature below 0.01 to 0.01 (vllm 0.34.0, ``CPUSamplingStates``).

The processed logprob at temperature ``T`` is that of ``z = x / T``. vLLM's
``SamplingParams`` logs a warning and replaces any ``0 < T < 0.01`` by ``0.01``;
from 0.34 the model runner's ``CPUSamplingStates.add_request`` stores that value
and ``apply_temperature`` divides each row by it, so at ``T = 0.005`` the logprob of
the second token of ``x = [1, 0]`` is ``-100`` (that of ``x / 0.01``), not ``-200``.
Run: ``python docs/repro_vllm_034_temperature_floor.py`` (exits 1 while vLLM differs).
"""

import mpmath
import numpy as np
import torch
from vllm import SamplingParams
from vllm.v1.worker.cpu.sampler import CPUSamplingStates

temperature = 0.005
x = torch.tensor([[1.0, 0.0]])
states = CPUSamplingStates(max_num_reqs=1, vocab_size=2, device=torch.device("cpu"))
states.add_request(0, SamplingParams(temperature=temperature, seed=0))
z = x.clone()
states.apply_temperature(z, torch.tensor([0]), np.array([0]))
logprob = torch.log_softmax(z, dim=1)[0, 1].item()
with mpmath.workdps(50):
    exact_z = [mpmath.mpf(float(v)) / mpmath.mpf(temperature) for v in x[0]]
    exact = exact_z[1] - mpmath.log(sum(mpmath.exp(v) for v in exact_z))
print("x", x[0].tolist(), " temperature", temperature)
print("temperature the sampler holds     ", states.temperature_np[0])
print("exact logprob of token 1          ", mpmath.nstr(exact, 17))
print("vLLM logprob of token 1           ", logprob)
raise SystemExit(0 if abs(logprob - float(exact)) < 1e-3 else 1)
