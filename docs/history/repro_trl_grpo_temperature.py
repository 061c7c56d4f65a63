"""TRL's GRPO trainer computed the policy's logprobs without the sampling temperature (<= 0.15.2).

``GRPOTrainer._get_per_token_logps`` returned ``log_softmax(logits)`` of the
completion tokens, while the completions were sampled from
``softmax(logits / temperature)`` (``GRPOConfig.temperature``, 0.9 by default),
so the policy's logprobs, and the importance ratio against the old policy's,
were those of another distribution (huggingface/trl PR #3029, first released in
0.16.0). This calls the trainer's own method on a model that returns fixed
logits. Run ``python docs/history/repro_trl_grpo_temperature.py``; it exits 1
while the bug is there.
"""

from types import SimpleNamespace

import torch
from trl.trainer.grpo_trainer import GRPOTrainer

temperature = 0.7
logits = torch.linspace(-2.0, 3.0, 24).reshape(1, 3, 8)  # 3 positions; the last is dropped
completion = torch.tensor([[0, 5, 7]])  # the prompt's last id, then 2 completion tokens


def model(**inputs):
    return SimpleNamespace(logits=logits)


# The trainer's state the method reads: its temperature, and (0.16's profiling) report_to.
trainer = SimpleNamespace(temperature=temperature, args=SimpleNamespace(report_to=[]))
mine = GRPOTrainer._get_per_token_logps(trainer, model, completion, torch.ones_like(completion), 2)
expected = (
    (logits[:, :-1] / temperature).log_softmax(-1).gather(-1, completion[:, 1:, None])[..., 0]
)
print(f"trl {mine.tolist()!r}, log_softmax(logits / {temperature}) {expected.tolist()!r}")
raise SystemExit(0 if torch.allclose(mine, expected, rtol=1e-5, atol=1e-6) else 1)
