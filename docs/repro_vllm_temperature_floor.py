"""vLLM raises a temperature below 0.01 to 0.01 (vllm 0.33.0, ``SamplingParams``).

The processed logprob at temperature ``T`` is that of ``z = x / T``. vLLM's
``SamplingParams`` logs a warning and replaces any ``0 < T < 0.01`` by ``0.01``
before the sampler sees it, so at ``T = 0.005`` the logprob of the second token of
``x = [1, 0]`` is ``-100`` (that of ``x / 0.01``), not ``-200``. A trainer that
divides by the configured temperature disagrees with the engine by a factor of 2
here. Run: ``python docs/repro_vllm_temperature_floor.py`` (exits 1 while vLLM differs).
"""

import mpmath
import torch
from vllm import SamplingParams
from vllm.v1.sample.sampler import Sampler

temperature = 0.005
x = torch.tensor([[1.0, 0.0]])
params = SamplingParams(temperature=temperature)
z = Sampler.apply_temperature(x.clone(), torch.tensor([params.temperature]), True)
logprob = Sampler.compute_logprobs(z)[0, 1].item()
with mpmath.workdps(50):
    exact_z = [mpmath.mpf(float(v)) / mpmath.mpf(temperature) for v in x[0]]
    exact = exact_z[1] - mpmath.log(sum(mpmath.exp(v) for v in exact_z))
print("x", x[0].tolist(), " temperature", temperature)
print("SamplingParams.temperature        ", params.temperature)
print("exact logprob of token 1          ", mpmath.nstr(exact, 17))
print("vLLM logprob of token 1           ", logprob)
raise SystemExit(0 if params.temperature == temperature else 1)
