"""vLLM refuses a temperature above 2 (vllm 0.33.0 and 0.34.0, ``SamplingParams``).

The processed logprob at temperature ``T`` is that of ``z = x / T`` for any
``T > 0``; a trainer may evaluate at ``T = 4`` (a flattened policy, an
exploration schedule). vLLM's ``SamplingParams`` raises ``VLLMValidationError``
("temperature must be in [0, 2]") for ``T > 2``, so the engine has no processed
logprob there to compare with. Run: ``python docs/repro_vllm_temperature_range.py``
(exits 1 while vLLM refuses).
"""

from vllm import SamplingParams

temperature = 4.0
try:
    params = SamplingParams(temperature=temperature)
except Exception as error:  # VLLMValidationError, a ValueError
    print("temperature", temperature, "refused:", type(error).__name__, error)
    raise SystemExit(1) from None
print("temperature", temperature, "accepted:", params.temperature)
raise SystemExit(0)
