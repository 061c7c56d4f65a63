"""The historical benchmark's corpus: released logprob bugs, each with a buggy and a fixed release.

Each :class:`HistoricalBug` names the library, the bug in one sentence, the
public issue and pull request, the release that shipped it and the release that
fixed it (read from the library's own release history: its tags and the fix's
commit), the adapter (``--tp-logprob-backend``) the suite runs on, whether it
runs on CPU, and a standalone reproducer that exits 1 on the buggy release and 0
on the fixed one. An open bug has no fixed release. An entry that cannot run
here says why in ``unavailable``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CORPUS", "HistoricalBug", "releases", "requirements"]


@dataclass(frozen=True)
class HistoricalBug:
    """One released bug: where it shipped, where it was fixed, and how the suite runs on it."""

    key: str
    library: str
    distribution: str
    summary: str
    reference: str
    buggy: str
    fixed: str | None
    adapter: str
    cpu: str
    reproducer: str | None = None
    unavailable: str | None = None
    requires: tuple[str, ...] = ()
    """What the adapter imports beside the release (installed with the CPU constraints)."""

    @property
    def versions(self) -> tuple[str, ...]:
        """The releases the benchmark installs for this entry: buggy, then fixed."""
        return (self.buggy,) if self.fixed is None else (self.buggy, self.fixed)


_LIGER_CE = "tp_logprob.peers.liger:honest"
_INTERPRETED = "yes: Triton under the interpreter (TRITON_INTERPRET=1)"
# What importing trl 0.15/0.16's grpo_trainer needs, at releases of that time (Feb 2025).
_TRL_2025_Q1 = ("transformers==4.49.0", "accelerate==1.4.0", "datasets==3.3.2", "rich")
# What importing trl 1.16's trainer utilities needs, at the versions the conformance run has.
_TRL_1_16 = ("transformers==5.20.2", "accelerate==1.16.0", "datasets==5.2.0", "rich")
# What importing vllm 0.10.0 to 0.10.2's v1 sampler needs, at releases of their time
# (July to September 2025).
_VLLM_010_SAMPLER = (
    "transformers==4.56.1", "pydantic==2.11.7", "regex==2025.7.34", "cachetools==6.1.0",
    "cbor2==5.6.5", "cloudpickle==3.1.1", "pyzmq==27.0.2", "msgspec==0.19.0", "blake3==1.0.5",
    "pybase64==1.4.2", "psutil==7.0.0", "setproctitle==1.3.6",
)  # fmt: skip

CORPUS: tuple[HistoricalBug, ...] = (
    HistoricalBug(
        key="liger_ce_none_summed",
        library="Liger-Kernel",
        distribution="liger-kernel",
        summary='LigerCrossEntropyFunction with reduction="none" returned the rows\' losses '
        "summed into one scalar instead of one loss per row",
        reference="linkedin/Liger-Kernel#421, fixed by PR #435 (d790b64c, first released in 0.5.0)",
        buggy="0.4.2",
        fixed="0.5.0",
        adapter=_LIGER_CE,
        cpu=_INTERPRETED,
        reproducer="docs/history/repro_liger_ce_none_summed.py",
    ),
    HistoricalBug(
        key="liger_ce_none_grad_output",
        library="Liger-Kernel",
        distribution="liger-kernel",
        summary='with reduction="none" the backward scaled every row\'s gradient by '
        "grad_output[0], the first row's upstream gradient",
        reference="linkedin/Liger-Kernel#678, fixed by PR #680 (05b43a14, first released in 0.5.9)",
        buggy="0.5.8",
        fixed="0.5.9",
        adapter=_LIGER_CE,
        cpu=_INTERPRETED,
        reproducer="docs/history/repro_liger_ce_none_grad_output.py",
    ),
    HistoricalBug(
        key="liger_ce_leading_neg_inf_block",
        library="Liger-Kernel",
        distribution="liger-kernel",
        summary="NaN when a row's first 32,768-column block is all -inf: the online softmax "
        "starts from m = -inf and computes exp2(-inf - -inf)",
        reference="open; found by this suite (docs/conformance.md, liger_ce)",
        buggy="0.8.5",
        fixed=None,
        adapter=_LIGER_CE,
        cpu=_INTERPRETED,
        reproducer="docs/repro_liger_leading_neg_inf_block.py",
    ),
    HistoricalBug(
        key="trl_entropy_neg_inf",
        library="TRL",
        distribution="trl",
        summary="entropy_from_logits (and selective_log_softmax_and_entropy off CUDA) is NaN for "
        "a row with a -inf logit: it sums exp(logp) * logp, and 0 * -inf is NaN",
        reference="open; found by this suite (docs/conformance.md, trl_selective_log_softmax)",
        buggy="1.16.0",
        fixed=None,
        adapter="tp_logprob.peers.trl:honest",
        cpu="yes: pure torch",
        reproducer="docs/repro_trl_entropy_neg_inf.py",
        requires=_TRL_1_16,
    ),
    HistoricalBug(
        key="trl_grpo_logprob_temperature",
        library="TRL",
        distribution="trl",
        summary="GRPOTrainer computed the policy's per-token logprobs from logits not divided "
        "by the sampling temperature",
        reference="huggingface/trl PR #3029 (04f65973, first released in 0.16.0; 0.15.2's "
        "_get_per_token_logps has no division)",
        buggy="0.15.2",
        fixed="0.16.0",
        adapter="tp_logprob.peers.trl_grpo:honest",
        cpu="yes: pure torch (the trainer's method on a harness model, no weights)",
        reproducer="docs/history/repro_trl_grpo_temperature.py",
        requires=_TRL_2025_Q1,
    ),
    HistoricalBug(
        key="vllm_processed_logprobs_temperature",
        library="vLLM",
        distribution="vllm",
        summary='logprobs_mode="processed_logprobs" returned log_softmax of the logits before '
        "the temperature division, min-p, top-k and top-p",
        reference="vllm-project/vllm PR #22387 (TopKTopPSampler returns the processed logprobs), "
        "first released in 0.10.2; 0.10.0, 0.10.1 and 0.10.1.1 ship the same sampler.py, "
        "whose Sampler.forward takes them before self.sample (reported by prime-rl PR #697, "
        "huggingface/trl#4159)",
        buggy="0.10.0",
        fixed="0.10.2",
        adapter="tp_logprob.peers.vllm_sampler_010:honest",
        cpu="yes: vLLM's sampler code on the CPU build of torch (installed --no-deps, "
        "no CUDA extension)",
        reproducer="docs/history/repro_vllm_processed_logprobs_temperature.py",
        requires=_VLLM_010_SAMPLER,
    ),
    HistoricalBug(
        key="flash_attn_triton_ce_neg_inf",
        library="flash-attn",
        distribution="flash-attn",
        summary="the Triton cross entropy is NaN when most of a row's logits are -inf",
        reference="open; Dao-AILab/flash-attention#1930",
        buggy="2.8.3",
        fixed=None,
        adapter="none",
        cpu="no: the kernel's launcher selects a CUDA device, which the CPU build of torch "
        "refuses for a CPU tensor",
        unavailable="flash_attn/ops/triton/cross_entropy.py imports only torch and triton, but "
        "its package does not import without the CUDA build. The sdist's setup.py imports torch "
        "(so pip needs --no-build-isolation) and, unless FLASH_ATTENTION_FORCE_BUILD=TRUE, "
        "guesses a prebuilt wheel's URL from torch.version.cuda, None on the CPU build "
        "(InvalidVersion); with that and FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE it installs without "
        "the extension, and `import flash_attn.ops.triton.cross_entropy` then runs "
        "flash_attn/__init__.py, whose flash_attn_interface does `import flash_attn_2_cuda` "
        "(ModuleNotFoundError). Loaded from its file the module imports, but "
        "CrossEntropyLoss.forward launches the kernel inside "
        "`torch.cuda.device(logits.device.index)`, and for a CPU tensor (index None) the CPU "
        "build of torch raises TypeError in torch.cuda._exchange_device ('<' not supported "
        "between 'NoneType' and 'int'): it runs on CUDA tensors only",
    ),
)


def releases() -> tuple[str, ...]:
    """Every ``distribution==version`` a runnable entry needs, each once, in corpus order."""
    found: dict[str, None] = {}
    for bug in CORPUS:
        if bug.unavailable is None:
            found.update({f"{bug.distribution}=={version}": None for version in bug.versions})
    return tuple(found)


def requirements(release: str) -> tuple[str, ...]:
    """What the entries of ``release`` (``distribution==version``) need installed beside it."""
    distribution, _, version = release.partition("==")
    found: dict[str, None] = {}
    for bug in CORPUS:
        if bug.distribution == distribution and version in bug.versions:
            found.update(dict.fromkeys(bug.requires))
    return tuple(found)
