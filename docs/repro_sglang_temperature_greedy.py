"""SGLang samples greedily below a temperature of 1e-6 (sglang 0.5.23).

``SamplingParams.__post_init__`` turns any ``0 <= temperature < 1e-6`` into
``temperature = 1, top_k = 1``, and a batch whose requests all have ``top_k <= 1``
takes the sampler's greedy branch: the support is the first index of the maximum
logit, whatever ``top_k``, ``top_p`` and ``min_p`` the request asked for. The exact
rules divide by the temperature and apply the request's rules: at ``T = 1e-7`` and
``top_k = 2`` the row ``[1, 0]`` keeps both tokens (``z = [1e7, 0]``), and the
second one's processed logprob is ``-1e7``, not ``-inf``.
Run: ``python docs/repro_sglang_temperature_greedy.py`` (exits 1 while SGLang differs).
"""

from sglang.srt.sampling.sampling_params import SamplingParams

params = SamplingParams(temperature=1e-7, top_k=2)
print("asked   temperature 1e-07 top_k 2")
print("SGLang  temperature", params.temperature, "top_k", params.top_k)
raise SystemExit(0 if (params.temperature, params.top_k) == (1e-7, 2) else 1)
