"""The releases of each peer library that ``nox -s peer_releases`` runs an adapter's tests on.

Keyed by the adapter's module in ``tp_logprob.peers``: the first release with the
adapter's entry point (or the first whose tests pass, where an older one is
refused or pinned), each release that changed the call, and the newest (the
conformance run's). ``noxfile.py`` reads this file (it imports nothing of the package
until :func:`served_and_tested` runs) for its sessions, and the conformance report lists
it beside each adapter's served range.
"""

from __future__ import annotations

import importlib

TESTED_RELEASES: dict[str, tuple[str, ...]] = {
    "liger": ("0.5.0", "0.5.3", "0.5.8", "0.6.4", "0.7.0", "0.8.0", "0.8.5"),
    "liger_fused": (
        "0.5.3",
        "0.5.8",
        "0.6.3",
        "0.6.4",
        "0.7.0",
        "0.8.0",
        "0.8.1",
        "0.8.2",
        "0.8.5",
    ),
    "liger_vocab_parallel": ("0.8.1", "0.8.5"),
    "trl_chunked": ("1.15.0", "1.16.0"),
    "trl_kernel": ("1.14.0", "1.15.0", "1.16.0"),
    "liger_ppo": ("0.8.0", "0.8.3", "0.8.5"),
    "liger_selective": ("0.7.0", "0.8.5"),
    "openrlhf_actor": ("0.11.1", "0.11.2"),
    "trl": (
        "0.15.0",
        "0.15.2",
        "0.16.0",
        "0.17.0",
        "0.19.1",
        "0.20.0",
        "0.29.1",
        "1.0.0",
        "1.14.0",
        "1.16.0",
    ),
    "trl_grpo": (
        "0.15.0",
        "0.15.2",
        "0.16.0",
        "0.17.0",
        "0.19.1",
        "0.20.0",
        "0.29.1",
        "1.0.0",
        "1.8.0",
        "1.13.0",
        "1.14.0",
    ),
    "verl": (
        "0.1",
        "0.2.0.post2",
        "0.3.0.post1",
        "0.4.1",
        "0.5.0",
        "0.6.1",
        "0.7.1",
        "0.8.0",
        "0.9.0",
        "0.9.1",
    ),
    "verl_naive": ("0.4.1", "0.5.0", "0.9.1"),
    "verl_fused": ("0.4.1", "0.5.0", "0.6.1", "0.7.1", "0.8.0", "0.9.0", "0.9.1"),
    "sglang_sampler": ("0.5.21", "0.5.22", "0.5.23"),
    "megatron": ("0.8.0", "0.10.0", "0.16.1", "0.18.2", "0.19.2"),
    "torch_loss_parallel": ("2.13.0", "2.14.1"),
    # 0.11.1 first returns whole rows (max_num_logprobs=-1); 0.24.0 first refuses T > 2.
    "vllm_sampler": (
        "0.11.0",
        "0.11.1",
        "0.14.0",
        "0.17.0",
        "0.20.0",
        "0.24.0",
        "0.27.0",
        "0.29.0",
        "0.33.0",
    ),
    # 0.34 replaced vllm.v1.sample.sampler with the model runner's samplers.
    "vllm_sampler_034": ("0.34.0",),
    # 0.10.1 moved the logits processors into a package; 0.10.2 made the mode an enum.
    "vllm_sampler_010": ("0.10.0", "0.10.1", "0.10.2"),
    "openrlhf": ("0.6.2", "0.7.0", "0.8.0", "0.8.11", "0.9.5", "0.10.4", "0.11.2"),
    "cce": ("24.11.3", "24.11.4", "24.12.3", "25.1.1"),
}

# What trl below 1.0 imports, at releases of its time: 0.15 to 0.20 (at least) read
# transformers' private _is_package_available as a bool, and transformers 5 returns a
# tuple, always true, so their trainers import optional packages that are absent (mergekit).
_TRANSFORMERS_4_49 = ("transformers==4.49.0", "accelerate==1.4.0", "datasets==3.3.2", "rich")
_TRANSFORMERS_4_51 = ("transformers==4.51.3", "accelerate==1.6.0", "datasets==3.5.0", "rich")
_TRANSFORMERS_4_53 = ("transformers==4.53.2", "accelerate==1.9.0", "datasets==4.0.0", "rich")
_TRANSFORMERS_4_57 = ("transformers==4.57.6", "accelerate==1.11.0", "datasets==4.4.1", "rich")

RELEASE_REQUIRES: dict[str, dict[str, tuple[str, ...]]] = {
    "trl": {
        "0.15.0": _TRANSFORMERS_4_49,
        "0.15.2": _TRANSFORMERS_4_49,
        "0.16.0": _TRANSFORMERS_4_49,
        "0.17.0": _TRANSFORMERS_4_49,
        "0.19.1": _TRANSFORMERS_4_51,
        "0.20.0": _TRANSFORMERS_4_53,
        "0.29.1": _TRANSFORMERS_4_57,
    },
}
"""What a release imports beside it, at versions of its time, where the newest release's
dependencies do not import it; the others run on the newest release's (``PEER_TESTS`` in
``noxfile.py``)."""
_TRL_1 = ("transformers==4.57.6", "accelerate==1.11.0", "datasets==4.7.0", "rich", "jinja2")
RELEASE_REQUIRES["trl_grpo"] = {
    **RELEASE_REQUIRES["trl"],
    **dict.fromkeys(("1.0.0", "1.8.0", "1.13.0", "1.14.0"), _TRL_1),
}

BESIDE_THE_MATRIX = ("trl_grpo",)
"""Adapters the conformance matrix does not run (the history benchmark's), whose releases
the report lists after the table."""


def served_and_tested(module: str) -> str:
    """The releases ``tp_logprob.peers.module`` serves, and those its tests ran on."""
    served = importlib.import_module(f"tp_logprob.peers.{module}").SERVED
    tested = ", ".join(TESTED_RELEASES.get(module, ())) or "the installed one only"
    return f"`{served}`; {tested}"
