"""Adapters that run the logprob kernels RL teams already use as tp-logprob backends.

Each module wraps one library's real, installed code (never a re-implementation)
behind the standard op signature, with a capability taken from that library's
documentation and source, and declares the releases of the library it serves
(``SERVED``; any other is refused by name before any work,
:class:`~tp_logprob.peers._releases.UnservedReleaseError`):

- :mod:`.liger` - Liger-Kernel's Triton cross entropy (TP=1; on CPU under the
  Triton interpreter);
- :mod:`.cce` - Apple's Cut Cross-Entropy ``linear_cross_entropy``, hidden states in,
  its ``torch_compile`` implementation (TP=1);
- :mod:`.liger_vocab_parallel` - Liger-Kernel's ``LigerVocabParallelCrossEntropy``
  (TP=1 on the emulated group, any TP with its own all-reduces on a real one);
- :mod:`.megatron` - Megatron-Core's ``VocabParallelCrossEntropy`` pieces at any TP,
  with the contract's shard bounds or with Megatron's own equal-shard ranges;
- :mod:`.torch_loss_parallel` - PyTorch's ``loss_parallel`` on a DTensor, the path
  TorchTitan uses;
- :mod:`.trl` - TRL's ``selective_log_softmax``, the logprob helper of its GRPO
  and PPO trainers;
- :mod:`.trl_chunked` - TRL's ``ChunkedLogProbFunction``, the autograd function of its
  fused LM head, hidden states in, with its temperature and entropy (TP=1);
- :mod:`.trl_kernel` - TRL's Triton ``selective_log_softmax_and_entropy`` kernel, what its
  trainer helpers run on CUDA, with its row mask, temperature and entropy (TP=1; on CPU
  under the Triton interpreter);
- :mod:`.liger_ppo` - Liger-Kernel's ``LigerFusedLinearPPOBase.chunk_forward``, the
  per-token logprobs of its GRPO and other chunked RL losses, hidden states in (TP=1);
- :mod:`.liger_selective` - Liger-Kernel's Triton ``fused_selective_log_softmax``, the old
  and reference logprobs of its Triton GRPO loss, with its mask and temperature (TP=1,
  inference; on CPU under the Triton interpreter);
- :mod:`.verl` - verl's ``logprobs_from_logits`` and ``entropy_from_logits``, the
  helpers of its FSDP actor (TP=1, torch path);
- :mod:`.verl_naive` - verl's ``logprobs_from_logits_naive`` and
  ``entropy_from_logits_with_chunking``, the same module's other two helpers (TP=1);
- :mod:`.openrlhf` - OpenRLHF's ``log_probs_from_logits``, the helper of its actor,
  with its temperature (TP=1, torch path; compiled from the installed file, whose
  package needs flash-attn to import);
- :mod:`.openrlhf_actor` - OpenRLHF's actor path: fp32, one division by the temperature,
  ``compute_entropy`` and ``log_probs_from_logits`` (TP=1; compiled from the installed
  file, as :mod:`.openrlhf`);
- :mod:`.vllm_sampler` - vLLM's v1 sampler in ``processed_logits`` mode: the
  processed logprob under a sampling support (top-k, top-p, min-p), TP=1, of one
  request per row (vllm 0.11 to 0.33);
- :mod:`.vllm_sampler_034` - vLLM's CPU model runner sampler (``CPUSampler``) in
  ``processed_logprobs`` mode with its sampling mask, the same from vllm 0.34, which
  removed the v1 sampler;
- :mod:`.vllm_sampler_010` - vLLM 0.10's v1 sampler in ``processed_logprobs``
  mode, the API of each 0.10 release chosen by its version (the historical
  benchmark's vLLM entry);
- :mod:`.sglang_sampler` - SGLang's torch-native sampler and sampling mask, the same
  beside vLLM's (its functions compiled from the installed files: the sampler module
  needs a GPU build to import), TP=1.

The cross-entropy modules also offer "what users assume" variants: the same op claiming a
contract feature the library does not serve (padding, uneven shards, 16-bit
inputs, inactive tokens, cross-TP bitwise). ``python -m tools.conformance``
runs the property suite against all of them and writes ``docs/conformance.md``,
with a section on the processed-logprob peers and where they differ from the
exact rules.

Verify one adapter with::

    pytest --pyargs tp_logprob.properties --tp-logprob-backend=tp_logprob.peers.liger:honest

The libraries are optional (``pip install "tp-logprob[peers]"``; vLLM, whose wheel
and SGLang, whose wheels pin a CUDA build of torch, as ``noxfile.py``'s ``conformance``
session installs them) and ``import tp_logprob`` never imports this package; each adapter imports
its library on first call.
"""
