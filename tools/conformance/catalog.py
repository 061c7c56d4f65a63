"""What the conformance report runs: each peer, its variants, and why a variant fails.

Each row of the matrix is one adapter (:class:`Peer`); each column a contract
feature, and the last one (:data:`REAL_GROUP`) the honest backend on a real
process group (``torchrun``, gloo), where the library does its own communication.
A cell is a backend spec (``module:attr``) the property suite runs, or a note
saying why there is nothing to run (the honest capability already claims the
feature, or the feature cannot apply). Every variant that is expected to fail
carries its :class:`Explanation`; a failure without one is reported as
unexplained and fails the run.

Processed logprobs (a sampling support) have their own peers: the rollout
engines' and trainers' sampler code (:class:`ProcessedPeer`), each with the ways
it differs from the exact rules (:class:`Finding`, each with a reproducer), and
the libraries that cannot run on CPU, with the reason (:class:`Unavailable`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "COLUMNS",
    "PEERS",
    "PROCESSED_PEERS",
    "REAL_GROUP",
    "REAL_GROUP_RANKS",
    "UNAVAILABLE",
    "Cell",
    "Explanation",
    "Finding",
    "Peer",
    "ProcessedPeer",
    "Unavailable",
]

PEER_LIMITATION = "peer limitation"
PEER_BUG = "peer bug"
ADAPTER_CHOICE = "adapter choice"

COLUMNS = (
    ("honest", "honest capability"),
    ("padding", "vocab padding"),
    ("uneven", "uneven shards"),
    ("16bit", "16-bit inputs"),
    ("inactive", "inactive tokens"),
    ("batch", "batch invariance"),
    ("cross_tp", "cross-TP bitwise"),
    ("real_group", "real group (torchrun, gloo)"),
)
"""``(key, heading)`` of each matrix column, in order."""

REAL_GROUP = "real_group"
"""The column whose cell runs on a real process group rather than the emulated one."""

REAL_GROUP_RANKS = 3
"""Ranks of that group: three, so that shards can be uneven."""


@dataclass(frozen=True)
class Explanation:
    """Why a variant fails: a peer limitation, a peer bug (with a reproducer), an adapter choice."""

    kind: str
    cause: str
    reproducer: str | None = None


@dataclass(frozen=True)
class Cell:
    """One matrix cell: a backend to run (``attr`` in the peer's module), or a note.

    ``explanation`` explains every failing property of the backend;
    ``by_property`` overrides it for the named property tests; ``crash`` explains a test
    in which the library killed the test process (a signal, which the runner records).
    """

    attr: str | None = None
    note: str = ""
    explanation: Explanation | None = None
    by_property: tuple[tuple[str, Explanation], ...] = ()
    crash: Explanation | None = None

    def explain(self, test: str, *, crashed: bool = False) -> Explanation | None:
        """Why property test ``test`` fails for this cell's backend, if known; ``crashed``:
        the library killed the test process there (``crash`` explains that, and only that)."""
        if crashed:
            return self.crash
        return dict(self.by_property).get(test, self.explanation)

    @property
    def expects_failure(self) -> bool:
        """Whether some failure of this backend is explained (so a pass is news)."""
        return self.explanation is not None or bool(self.by_property)


@dataclass(frozen=True)
class Peer:
    """One adapter: its module under ``tp_logprob.peers``, the library, and its cells."""

    name: str
    module: str
    library: str
    distribution: str
    cells: dict[str, Cell] = field(default_factory=dict)

    def spec(self, attr: str) -> str:
        """The ``--tp-logprob-backend`` value of ``attr``."""
        return f"tp_logprob.peers.{self.module}:{attr}"


_PADDING = Explanation(
    PEER_LIMITATION,
    "the library normalizes over every column it is given; it has no notion of padding "
    "columns, so garbage (or even finite values) there changes the result",
)


def _gathers_every_label(library: str) -> Explanation:
    """Why an inactive row fails in ``library``, which takes no ``ignore_index``."""
    return Explanation(
        PEER_LIMITATION,
        f"{library} has no ignore_index: every label is gathered, so an inactive row's "
        "out-of-range target raises an index error",
    )


_ONE_RANK = Cell(note="n/a: TP=1 only")
_NO_XTP = Cell(note="n/a: TP=1 only")
_REAL_GROUP_ONLY = Cell(note="n/a: real process group only")
_STRIDED_REDUCTION = Explanation(
    PEER_LIMITATION,
    "the row max and sum over the vocabulary run in torch on the logits as given: on a "
    "column-major view (one of the input forms trainers pass) torch orders the reduction by "
    "the strides and the batch's size, so a row's bits depend on its batch; on the "
    "contiguous logits Megatron's LM head produces it is batch invariant",
)

_TRANSPORT_SUM = Explanation(
    PEER_LIMITATION,
    "on a real group Megatron's all-reduce SUM is the transport's own (gloo here, NCCL on "
    "GPUs): a ring all-reduce adds each row's per-rank partials in an order set by the chunk "
    "the row falls in, which moves with N and the row's position, so the batch invariance "
    "that fixed_topology claims does not hold there (the emulated column adds them in rank "
    "order)",
)
_TRL_POS_INF = (
    (
        "test_special_values_match_oracle",
        Explanation(
            PEER_BUG,
            "selective_log_softmax's fp32 path (gather - logsumexp) gives -inf for a finite "
            "target beside a +inf logit, where the log_softmax().gather() it documents itself "
            "as equal to gives NaN (and so does its own 16-bit path)",
            "docs/repro_trl_logprob_pos_inf.py",
        ),
    ),
)

_VERL_POS_INF = Explanation(
    PEER_BUG,
    "logprobs_from_logits' fp32 path (logprobs_from_logits_v2: gather - logsumexp) gives -inf "
    "for a finite target beside a +inf logit, where the log_softmax it states as its identity "
    "gives NaN, and so do its own 16-bit path and logprobs_from_logits_naive",
    "docs/repro_verl_logprob_pos_inf.py",
)
_VERL_ENTROPY_NEG_INF = Explanation(
    PEER_BUG,
    "entropy_from_logits computes logsumexp(x) - sum(softmax(x) * x), which is 0 * -inf = NaN "
    "wherever a logit is -inf (and so is its gradient); the entropy of such a row is finite",
    "docs/repro_verl_entropy_neg_inf.py",
)
_VERL_ENTROPY_CANCELS = Explanation(
    PEER_LIMITATION,
    "entropy_from_logits subtracts two fp32 numbers the size of the logits, logsumexp(x) and "
    "sum(softmax(x) * x), so its absolute error grows with |x| instead of staying shift "
    "invariant: the row [1000.12573, 999.8679] gives 0.6849365 where the entropy is 0.6849073",
)
_VERL_HONEST = (
    ("test_special_values_match_oracle", _VERL_POS_INF),
    *(
        (test, _VERL_ENTROPY_NEG_INF)
        for test in (
            "test_gradients_match_exact",
            "test_matches_reference_on_larger_shapes",
            "test_entropy_is_nan_free_where_exact_is_finite",
            "test_entropy_ignores_appended_neg_inf_columns",
            "test_wide_vocabularies",
        )
    ),
)

_VERL_CHUNKED_ENTROPY_CANCELS = Explanation(
    PEER_LIMITATION,
    "entropy_from_logits_with_chunking casts each chunk of 2048 rows to fp32 and takes "
    "entropy_from_logits' formula, logsumexp(x) - sum(softmax(x) * x): two fp32 numbers the "
    "size of the logits, so its absolute error grows with |x| (a two-column row: 0.48 ulp of "
    "the row's scale where the tolerance is 0.06)",
)
_VERL_NAIVE_HONEST = tuple(
    (test, _VERL_ENTROPY_NEG_INF)
    for test in (
        "test_gradients_match_exact",
        "test_matches_reference_on_larger_shapes",
        "test_entropy_is_nan_free_where_exact_is_finite",
        "test_entropy_ignores_appended_neg_inf_columns",
        "test_wide_vocabularies",
    )
)
_OPENRLHF_POS_INF = Explanation(
    PEER_BUG,
    "log_probs_from_logits' fp32 path (gather - logsumexp) gives -inf for a finite target beside "
    "a +inf logit (or one that x / T overflows to +inf), where the log_softmax it states as its "
    "identity gives NaN, and so does its own 16-bit path; its gradient there is finite where "
    "the exact one is NaN",
    "docs/repro_openrlhf_logprob_pos_inf.py",
)

_FLCE_BATCH = Explanation(
    PEER_LIMITATION,
    "each chunk's logits come from one torch matmul whose row count follows N "
    "(chunk_size = min(next_pow2(ceil(N / ceil(V / H))), N)), and a matmul's bits for "
    "a row depend on its shape (CPU BLAS kernels; cuBLAS heuristics on GPU)",
)
_CLAIMED_BATCH = Cell(note="claimed: fixed_topology")
_CCE_DISPATCH_MODE = Explanation(
    PEER_LIMITATION,
    "Cut Cross-Entropy's torch path is torch.compile(fullgraph=True): under the suite's "
    "allocation watcher (a TorchDispatchMode, as FlopCounterMode is) Dynamo compiles no frame "
    "and fullgraph turns that into a RuntimeError; the skip stays on the code object, so in a "
    "program every later call raises too (the adapter resets Dynamo after such an error, so "
    "that the other tests still run the library)",
    "docs/repro_cce_dispatch_mode.py",
)
_CCE_WATCHED = (("test_fused_never_materializes_the_logits", _CCE_DISPATCH_MODE),)

_VERL_MP_ENTROPY_NEG_INF = Explanation(
    PEER_BUG,
    "vocab_parallel_entropy computes M + log(sum exp(x - M)) - sum(softmax(x) * x) over the "
    "group, and softmax * x is 0 * -inf = NaN wherever a logit is -inf (so is its gradient); "
    "the entropy of such a row is finite",
    "docs/repro_verl_vocab_parallel_entropy_neg_inf.py",
)
_VERL_MP_ENTROPY_CANCELS = Explanation(
    PEER_LIMITATION,
    "vocab_parallel_entropy subtracts the all-reduced sum(softmax(x) * x) from M + log(sum): "
    "two fp32 numbers the size of the logits, so its absolute error grows with |x| instead of "
    "staying shift invariant, and its rounding follows the column order and shard layout: the "
    "row [3.4e38, 3.4e38, -3.4e38] gives 0 where the entropy is log 2",
)
_VERL_MP_TRANSPORT = Explanation(
    PEER_LIMITATION,
    "on a real group the all-reduce SUMs (Megatron's of the target logits and shifted sums, "
    "verl's of the entropy's two sums) are the transport's own (gloo here, NCCL on GPUs): a "
    "ring all-reduce adds a row's per-rank partials in an order set by the chunk the row falls "
    "in, which moves with N and the row's position, so the batch invariance that "
    "fixed_topology claims does not hold there",
)
_VERL_MP = (
    *((test, _VERL_MP_TRANSPORT) for test in ("test_batch_invariance", "test_row_positions")),
    *(
        (test, _VERL_MP_ENTROPY_NEG_INF)
        for test in (
            "test_gradients_match_exact",
            "test_entropy_is_nan_free_where_exact_is_finite",
            "test_entropy_ignores_appended_neg_inf_columns",
            "test_wide_vocabularies",
        )
    ),
)
_VERL_FUSED_16BIT = Explanation(
    PEER_LIMITATION,
    "each chunk's logits are the matmul's output in the input dtype, divided by T there "
    "((hidden @ W.T) / T in bf16/fp16) before .float(), so they carry 8/11 bits before the "
    "fp32 softmax",
)
_VERL_FUSED_MEMORY = Explanation(
    PEER_LIMITATION,
    "FusedLinearForPPO chunks the rows, not the vocabulary: each chunk of up to 512 rows gets "
    "its fp32 logits over the whole vocabulary, so at N <= 512 (the property's 384 rows) that "
    "chunk is the [N, V] logits (and its backward's one-hot and softmax are as large)",
)
_VERL_FUSED_WATCHED = (("test_fused_never_materializes_the_logits", _VERL_FUSED_MEMORY),)
_VERL_FUSED_ENTROPY = Explanation(
    PEER_LIMITATION,
    "the entropy is logsumexp(z) - sum(softmax(z) * z), entropy_from_logits' formula: two fp32 "
    "numbers the size of the logits, so its absolute error grows with |z| (exact dot products "
    "of |hidden| <= 8: 9.155e-05 where the entropy is 7.987e-05, with lse 125)",
)
_TRL_CHUNKED_16BIT = Explanation(
    PEER_LIMITATION,
    "each tile's logits are torch.mm's output in the input dtype (bias added there), so they "
    "carry 8/11 bits before the fp32 fold",
)
_TRL_CHUNKED_UNMASKED = Explanation(
    PEER_LIMITATION,
    "ChunkedLogProbFunction has no mask: the fused head scores every position and drops the "
    "-100 labels afterwards; a target outside [0, V) is found in no tile, so its logit stays "
    "0 and the row's logprob is -lse, not the contract's 0",
)
_TRL_CHUNKED_MEMORY = Explanation(
    PEER_LIMITATION,
    "a tile is min(N, 4096) tokens by 32768 vocabulary columns (the chunk_size TRL's fused "
    "head passes): below 32768 columns one tile holds every logit of up to 4096 rows, so the "
    "saving is for real vocabularies only (a 4096 x 32768 fp32 tile is 512 MiB)",
)
_TRL_CHUNKED_WATCHED = (("test_fused_never_materializes_the_logits", _TRL_CHUNKED_MEMORY),)
_TRL_CHUNKED_BATCH = Explanation(
    PEER_LIMITATION,
    "each tile's torch.mm has min(N, 4096) rows, and a matmul's bits for a row follow its "
    "shape (the CPU GEMM's blocking here), so a row run alone gives other bits than in a batch",
)
_TRL_KERNEL_ENTROPY_NEG_INF = Explanation(
    PEER_BUG,
    "the kernel's entropy sums exp(z - max) * z over each block, which is 0 * -inf = NaN "
    "wherever a logit is -inf, and so is its backward's p * (E[z] - z); the entropy of such a "
    "row is finite (the logprob is right)",
    "docs/repro_trl_kernel_entropy_neg_inf.py",
)
_TRL_KERNEL_ENTROPY_CANCELS = Explanation(
    PEER_LIMITATION,
    "the kernel's entropy is log_z - weighted / sum: two fp32 numbers the size of the logits, "
    "so its absolute error grows with |z| instead of staying shift invariant: the row "
    "[1000.12573, 999.8679] gives 0.6848755 where the entropy is 0.6849073",
)
_TRL_KERNEL_HONEST = tuple(
    (test, _TRL_KERNEL_ENTROPY_NEG_INF)
    for test in (
        "test_gradients_match_exact",
        "test_entropy_is_nan_free_where_exact_is_finite",
        "test_entropy_ignores_appended_neg_inf_columns",
        "test_wide_vocabularies",
    )
)
_OPENRLHF_ENTROPY_NEG_INF = Explanation(
    PEER_BUG,
    "compute_entropy is logsumexp(z) - sum(softmax(z) * z), which is 0 * -inf = NaN wherever a "
    "logit is -inf; the entropy of such a row is finite",
    "docs/repro_openrlhf_entropy_neg_inf.py",
)
_OPENRLHF_ENTROPY_CANCELS = Explanation(
    PEER_LIMITATION,
    "compute_entropy subtracts two fp32 numbers the size of the logits, logsumexp(z) and "
    "sum(softmax(z) * z), so its absolute error grows with |z| instead of staying shift "
    "invariant: the row [1000.12573, 999.8679] gives 0.6849365 where the entropy is 0.6849073",
)
_OPENRLHF_ACTOR_HONEST = (
    ("test_special_values_match_oracle", _OPENRLHF_POS_INF),
    *(
        (test, _OPENRLHF_ENTROPY_NEG_INF)
        for test in (
            "test_entropy_is_nan_free_where_exact_is_finite",
            "test_entropy_ignores_appended_neg_inf_columns",
            "test_wide_vocabularies",
        )
    ),
)
_LIGER_SELECTIVE_LEADING_NEG_INF = Explanation(
    PEER_BUG,
    "NaN when a row's first 2048-column block is all -inf: the online softmax starts from "
    "m = -inf and rescales by exp(-inf - -inf)",
    "docs/repro_liger_selective_leading_neg_inf_block.py",
)
_LIGER_PPO_MEMORY = Explanation(
    PEER_LIMITATION,
    "a chunk is min(N, 2048) rows by 4096 vocabulary columns: below 4096 columns one chunk "
    "holds every logit of up to 2048 rows, so the saving is for real vocabularies only",
)
_LIGER_PPO_WATCHED = (("test_fused_never_materializes_the_logits", _LIGER_PPO_MEMORY),)
_VERL_TRITON_CPU = (
    "not run: CUDA only, even under the Triton interpreter: its forward opens "
    "torch.cuda.nvtx.range, which raises RuntimeError on a CPU build of torch, and its launcher "
    "asserts hidden.is_cuda and hidden_size % 128 == 0 (kernels.py, efficient_entropy_forward)"
)
_CUDA_ONLY = Cell(note="not run: CUDA only")

PEERS = (
    Peer(
        name="liger_ce",
        module="liger",
        library="Liger-Kernel cross entropy (Triton, interpreter on CPU)",
        distribution="liger-kernel",
        cells={
            "honest": Cell(
                "honest",
                by_property=(
                    (
                        "test_wide_vocabularies",
                        Explanation(
                            PEER_BUG,
                            "NaN when a row's first 32,768-column block is all -inf: the "
                            "online softmax starts from m = -inf and computes exp2(-inf - -inf)",
                            "docs/repro_liger_leading_neg_inf_block.py",
                        ),
                    ),
                ),
            ),
            "padding": Cell("assume_padding", explanation=_PADDING),
            "uneven": _ONE_RANK,
            "16bit": Cell(
                "assume_16bit",
                explanation=Explanation(
                    PEER_LIMITATION,
                    "the per-token loss is stored in the input dtype, so bf16/fp16 inputs "
                    "give a logprob rounded to 8/11 bits",
                ),
            ),
            "inactive": Cell(
                "assume_inactive_tokens",
                explanation=Explanation(
                    PEER_LIMITATION,
                    "Liger skips a row only when its target equals ignore_index; an inactive "
                    "row's other target is read (a nonzero loss) or trips Liger's bounds assert",
                ),
            ),
            "batch": _CLAIMED_BATCH,
            "cross_tp": _NO_XTP,
            "real_group": _ONE_RANK,
        },
    ),
    Peer(
        name="liger_flce",
        module="liger_fused",
        library="Liger-Kernel fused linear cross entropy, hidden in (Triton, interpreter on CPU)",
        distribution="liger-kernel",
        cells={
            "honest": Cell("honest"),
            "padding": Cell("assume_padding", explanation=_PADDING),
            "uneven": _ONE_RANK,
            "16bit": Cell(
                "assume_16bit",
                explanation=Explanation(
                    PEER_LIMITATION,
                    "each logits chunk is the matmul's output in the input dtype (hidden @ W.T "
                    "in bf16/fp16), so the logits carry 8/11 bits before the fp32 softmax, and "
                    "d weight is accumulated in that dtype too",
                ),
            ),
            "inactive": Cell(
                note="not run: an inactive row's out-of-range target is read unchecked "
                "(X_ptr + y), and the suite's (up to 2^40) crash the interpreter's process"
            ),
            "batch": Cell("assume_batch_invariant", explanation=_FLCE_BATCH),
            "cross_tp": _NO_XTP,
            "real_group": _ONE_RANK,
        },
    ),
    Peer(
        name="cce_linear_cross_entropy",
        module="cce",
        library="Apple Cut Cross-Entropy linear_cross_entropy, hidden in (impl='torch_compile')",
        distribution="cut-cross-entropy",
        cells={
            "honest": Cell("honest", by_property=_CCE_WATCHED),
            "padding": Cell("assume_padding", explanation=_PADDING, by_property=_CCE_WATCHED),
            "uneven": _ONE_RANK,
            "16bit": Cell(
                "assume_16bit",
                explanation=Explanation(
                    PEER_LIMITATION,
                    "the logits are the matmul's output in the input dtype (e @ c.T in "
                    "bf16/fp16) before .float(), so they carry 8/11 bits before the fp32 "
                    "softmax, and the gradients are formed in that dtype too",
                ),
                by_property=_CCE_WATCHED,
            ),
            "inactive": Cell(
                "assume_inactive_tokens",
                explanation=Explanation(
                    PEER_LIMITATION,
                    "Cut Cross-Entropy drops a row only when its target equals ignore_index; an "
                    "inactive row's other target is read (a nonzero loss and gradient), or, out "
                    "of range, trips the compiled kernel's index check (RuntimeError)",
                ),
                by_property=_CCE_WATCHED,
                crash=Explanation(
                    PEER_BUG,
                    "with more than one CPU thread an inactive row's out-of-range target kills "
                    "the process (SIGABRT) instead of raising: Inductor's C++ kernel for the "
                    "compiled F.cross_entropy throws its index check inside an OpenMP parallel "
                    "region, and the C++ runtime terminates (with one thread it raises "
                    "RuntimeError)",
                    "docs/repro_cce_out_of_range_target_aborts.py",
                ),
            ),
            "batch": Cell(
                "assume_batch_invariant",
                explanation=Explanation(
                    PEER_LIMITATION,
                    "the logits come from one matmul over the kept rows, whose row count "
                    "follows the batch, and a matmul's bits for a row depend on its shape",
                ),
                by_property=_CCE_WATCHED,
            ),
            "cross_tp": _NO_XTP,
            "real_group": _ONE_RANK,
        },
    ),
    Peer(
        name="liger_vp_ce",
        module="liger_vocab_parallel",
        library="Liger-Kernel LigerVocabParallelCrossEntropy (Triton, interpreter on CPU)",
        distribution="liger-kernel",
        cells={
            "honest": Cell("honest"),
            "padding": Cell("assume_padding", explanation=_PADDING),
            "uneven": Cell(note="n/a: TP=1 on the emulated group; rank * V_local on a real one"),
            "16bit": Cell(note="claimed: each block loaded as fp32"),
            "inactive": Cell(
                "assume_inactive_tokens",
                explanation=Explanation(
                    PEER_LIMITATION,
                    "Liger skips a row only when its target equals ignore_index; any other "
                    "target outside the rank's range is read as another rank's, so an inactive "
                    "row gets the loss log(sum exp(x - M)) and a softmax gradient, unchecked",
                ),
            ),
            "batch": _CLAIMED_BATCH,
            "cross_tp": _NO_XTP,
            "real_group": Cell(
                "library",
                explanation=Explanation(
                    PEER_LIMITATION,
                    "on a real group Liger's dist.all_reduce SUM of the per-rank fp32 sums is "
                    "the transport's own (gloo here, NCCL on GPUs): a ring all-reduce adds a "
                    "row's partials in an order set by the chunk the row falls in, which moves "
                    "with N and the row's position, so the batch invariance that fixed_topology "
                    "claims does not hold there",
                ),
            ),
        },
    ),
    Peer(
        name="megatron_vp_ce",
        module="megatron",
        library="Megatron-Core VocabParallelCrossEntropy, contract's shard bounds",
        distribution="megatron-core",
        cells={
            "honest": Cell("honest", by_property=(("test_batch_invariance", _STRIDED_REDUCTION),)),
            "padding": Cell("assume_padding", explanation=_PADDING),
            "uneven": Cell(note="claimed: takes any bounds"),
            "16bit": Cell(note="claimed: upcast to fp32"),
            "inactive": Cell(
                "assume_inactive_tokens",
                explanation=Explanation(
                    PEER_LIMITATION,
                    "Megatron has no mask; its training loop's -(loss * loss_mask) gives -0.0 "
                    "on inactive rows and NaN where an inactive row holds NaN or inf",
                ),
            ),
            "batch": _CLAIMED_BATCH,
            "cross_tp": Cell(
                "assume_cross_tp_bitwise",
                explanation=Explanation(
                    PEER_LIMITATION,
                    "fp32 per-shard sums added in rank order: the rounding depends on where "
                    "the shard boundaries fall, so other TP layouts differ in the last bits",
                ),
            ),
            "real_group": Cell("honest", explanation=_TRANSPORT_SUM),
        },
    ),
    Peer(
        name="megatron_vp_ce_equal_shards",
        module="megatron",
        library="Megatron-Core VocabParallelCrossEntropy, Megatron's VocabUtility ranges",
        distribution="megatron-core",
        cells={
            # even_shards_only: tp divides the padded vocabulary, as VocabUtility needs.
            "honest": Cell(
                "equal_shards", by_property=(("test_batch_invariance", _STRIDED_REDUCTION),)
            ),
            "padding": Cell(note="as megatron_vp_ce"),
            "uneven": Cell(
                "assume_uneven_shards",
                explanation=Explanation(
                    PEER_LIMITATION,
                    "start = rank * local width: with uneven bounds each rank reads its target "
                    "logits from the wrong global columns",
                ),
            ),
            "16bit": Cell(note="claimed: upcast to fp32"),
            "inactive": Cell(note="as megatron_vp_ce"),
            "batch": Cell(note="as megatron_vp_ce"),
            "cross_tp": Cell(note="as megatron_vp_ce"),
            "real_group": Cell("equal_shards", explanation=_TRANSPORT_SUM),
        },
    ),
    Peer(
        name="megatron_vp_ce_library",
        module="megatron",
        library="Megatron-Core vocab_parallel_cross_entropy whole, on its own parallel_state group",
        distribution="megatron-core",
        cells={
            **{key: _REAL_GROUP_ONLY for key, _ in COLUMNS if key != REAL_GROUP},
            "real_group": Cell("library", explanation=_TRANSPORT_SUM),
        },
    ),
    Peer(
        name="torch_loss_parallel",
        module="torch_loss_parallel",
        library="PyTorch loss_parallel on a Shard(1) DTensor (TorchTitan's path)",
        distribution="torch",
        cells={
            "honest": Cell("honest"),
            "padding": Cell("assume_padding", explanation=_PADDING),
            "uneven": Cell(
                "assume_uneven_shards",
                explanation=Explanation(
                    PEER_LIMITATION,
                    "a Shard(1) DTensor has torch.chunk's layout; with other bounds the "
                    "masked target gather indexes past the local shard (RuntimeError) or "
                    "reads the wrong column",
                ),
            ),
            "16bit": Cell(note="claimed: .float() first, as TorchTitan"),
            "inactive": Cell(
                "assume_inactive_tokens",
                explanation=Explanation(
                    PEER_LIMITATION,
                    "only target == ignore_index is skipped; any other out-of-range target of "
                    "an inactive row is silently masked to a zero target logit (loss = lse)",
                ),
            ),
            "batch": Cell(
                "assume_batch_invariant",
                explanation=Explanation(
                    PEER_LIMITATION,
                    "the all-reduce SUM of per-rank fp32 partials is not batch invariant: the "
                    "threaded group sums torch.stack(partials) with torch.sum, whose association "
                    "changes with N; ring all-reduces (NCCL, gloo) likewise order an element's "
                    "partials by the chunk it falls in",
                ),
            ),
            "cross_tp": Cell(
                "assume_cross_tp_bitwise",
                explanation=Explanation(
                    PEER_LIMITATION,
                    "an all-reduce SUM of fp32 per-shard sums: the rounding depends on the "
                    "shard layout",
                ),
            ),
            "real_group": Cell("honest"),
        },
    ),
    Peer(
        name="trl_selective_log_softmax",
        module="trl",
        library="TRL selective_log_softmax (+ _and_entropy), torch path on CPU",
        distribution="trl",
        cells={
            "honest": Cell(
                "honest",
                explanation=Explanation(
                    PEER_BUG,
                    "entropy_from_logits sums exp(logp) * logp, which is 0 * -inf = NaN "
                    "wherever a log-probability is -inf (a -inf logit, or one ~3.4e38 below "
                    "the max); the entropy of such a row is finite",
                    "docs/repro_trl_entropy_neg_inf.py",
                ),
                by_property=_TRL_POS_INF,
            ),
            "padding": Cell("assume_padding", explanation=_PADDING, by_property=_TRL_POS_INF),
            "uneven": _ONE_RANK,
            "16bit": Cell(
                "assume_16bit",
                explanation=Explanation(
                    PEER_LIMITATION,
                    "for bf16/fp16 logits TRL takes log_softmax in the input dtype, so the "
                    "logprob has 8/11 bits",
                ),
                by_property=_TRL_POS_INF,
            ),
            "inactive": Cell(
                "assume_inactive_tokens",
                explanation=Explanation(
                    PEER_LIMITATION,
                    "TRL has no ignore_index and applies row_mask after the gather, so an "
                    "inactive row's out-of-range target raises an index error",
                ),
            ),
            "batch": _CLAIMED_BATCH,
            "cross_tp": _NO_XTP,
            "real_group": _ONE_RANK,
        },
    ),
    Peer(
        name="verl_logprobs_from_logits",
        module="verl",
        library="verl logprobs_from_logits (+ entropy_from_logits), torch path on CPU",
        distribution="verl",
        cells={
            "honest": Cell("honest", explanation=_VERL_ENTROPY_CANCELS, by_property=_VERL_HONEST),
            "padding": Cell("assume_padding", explanation=_PADDING),
            "uneven": _ONE_RANK,
            "16bit": Cell(
                "assume_16bit",
                explanation=Explanation(
                    PEER_LIMITATION,
                    "for bf16/fp16 logits logprobs_from_logits_v2 takes log_softmax in the input "
                    "dtype, so the logprob has 8/11 bits",
                ),
                by_property=(("test_special_values_match_oracle", _VERL_POS_INF),),
            ),
            "inactive": Cell("assume_inactive_tokens", explanation=_gathers_every_label("verl")),
            "batch": _CLAIMED_BATCH,
            "cross_tp": _NO_XTP,
            "real_group": _ONE_RANK,
        },
    ),
    Peer(
        name="openrlhf_log_probs_from_logits",
        module="openrlhf",
        library="OpenRLHF log_probs_from_logits (with its temperature), torch path on CPU",
        distribution="openrlhf",
        cells={
            "honest": Cell("honest", explanation=_OPENRLHF_POS_INF),
            "padding": Cell("assume_padding", explanation=_PADDING),
            "uneven": _ONE_RANK,
            "16bit": Cell(
                "assume_16bit",
                explanation=Explanation(
                    PEER_LIMITATION,
                    "for bf16/fp16 logits log_probs_from_logits divides by T and takes "
                    "log_softmax in the input dtype, so the logprob has 8/11 bits",
                ),
                by_property=(("test_matches_exact_oracle", _OPENRLHF_POS_INF),),
            ),
            "inactive": Cell(
                "assume_inactive_tokens",
                explanation=_gathers_every_label("OpenRLHF"),
                by_property=tuple(
                    (test, _OPENRLHF_POS_INF)
                    for test in (
                        "test_long_batches",
                        "test_matches_exact_oracle",
                        "test_special_values_match_oracle",
                    )
                ),
            ),
            "batch": _CLAIMED_BATCH,
            "cross_tp": _NO_XTP,
            "real_group": _ONE_RANK,
        },
    ),
    Peer(
        name="verl_megatron_vocab_parallel",
        module="verl_megatron",
        library="verl vocab_parallel_log_probs_from_logits + vocab_parallel_entropy (Megatron "
        "engine), on Megatron's parallel_state group",
        distribution="verl",
        cells={
            **{key: _REAL_GROUP_ONLY for key, _ in COLUMNS if key != REAL_GROUP},
            "real_group": Cell(
                "library", explanation=_VERL_MP_ENTROPY_CANCELS, by_property=_VERL_MP
            ),
        },
    ),
    Peer(
        name="verl_fused_linear_for_ppo",
        module="verl_fused",
        library="verl FusedLinearForPPO (use_fused_kernels, impl_backend='torch'), hidden in",
        distribution="verl",
        cells={
            "honest": Cell(
                "honest",
                by_property=(
                    *_VERL_FUSED_WATCHED,
                    ("test_fused_exact_dot_products_match_logits_path", _VERL_FUSED_ENTROPY),
                ),
            ),
            "padding": Cell(
                "assume_padding", explanation=_PADDING, by_property=_VERL_FUSED_WATCHED
            ),
            "uneven": _ONE_RANK,
            "16bit": Cell(
                "assume_16bit", explanation=_VERL_FUSED_16BIT, by_property=_VERL_FUSED_WATCHED
            ),
            "inactive": Cell(
                "assume_inactive_tokens",
                explanation=_gathers_every_label("FusedLinearForPPO"),
                by_property=_VERL_FUSED_WATCHED,
            ),
            # Claimed away from the source (a chunk's matmul has min(512, rows left) rows);
            # on CPU the suite finds no row whose bits follow N.
            "batch": Cell("assume_batch_invariant", by_property=_VERL_FUSED_WATCHED),
            "cross_tp": _NO_XTP,
            "real_group": _ONE_RANK,
        },
    ),
    Peer(
        name="verl_linear_cross_entropy",
        module="verl_fused",
        library="verl linear_cross_entropy (use_fused_kernels, impl_backend='triton'), hidden in",
        distribution="verl",
        cells={
            "honest": Cell(note=_VERL_TRITON_CPU),
            **{key: _CUDA_ONLY for key, _ in COLUMNS if key != "honest"},
        },
    ),
    Peer(
        name="trl_chunked_logprob",
        module="trl_chunked",
        library="TRL ChunkedLogProbFunction (its fused LM head), hidden in, torch tiles on CPU",
        distribution="trl",
        cells={
            "honest": Cell("honest", by_property=_TRL_CHUNKED_WATCHED),
            "padding": Cell(
                "assume_padding", explanation=_PADDING, by_property=_TRL_CHUNKED_WATCHED
            ),
            "uneven": _ONE_RANK,
            "16bit": Cell(
                "assume_16bit", explanation=_TRL_CHUNKED_16BIT, by_property=_TRL_CHUNKED_WATCHED
            ),
            "inactive": Cell(
                "assume_inactive_tokens",
                explanation=_TRL_CHUNKED_UNMASKED,
                by_property=_TRL_CHUNKED_WATCHED,
            ),
            "batch": Cell(
                "assume_batch_invariant",
                explanation=_TRL_CHUNKED_BATCH,
                by_property=_TRL_CHUNKED_WATCHED,
            ),
            "cross_tp": _NO_XTP,
            "real_group": _ONE_RANK,
        },
    ),
    Peer(
        name="verl_logprobs_from_logits_naive",
        module="verl_naive",
        library="verl logprobs_from_logits_naive (+ entropy_from_logits_with_chunking)",
        distribution="verl",
        cells={
            "honest": Cell(
                "honest", explanation=_VERL_CHUNKED_ENTROPY_CANCELS, by_property=_VERL_NAIVE_HONEST
            ),
            "padding": Cell("assume_padding", explanation=_PADDING),
            "uneven": _ONE_RANK,
            "16bit": Cell(
                "assume_16bit",
                explanation=Explanation(
                    PEER_LIMITATION,
                    "for bf16/fp16 logits logprobs_from_logits_naive takes log_softmax in the "
                    "input dtype, so the logprob has 8/11 bits",
                ),
            ),
            "inactive": Cell("assume_inactive_tokens", explanation=_gathers_every_label("verl")),
            "batch": _CLAIMED_BATCH,
            "cross_tp": _NO_XTP,
            "real_group": _ONE_RANK,
        },
    ),
    Peer(
        name="trl_kernel_logprob_entropy",
        module="trl_kernel",
        library="TRL trl.kernels.selective_log_softmax_and_entropy (Triton, interpreter on CPU)",
        distribution="trl",
        cells={
            "honest": Cell(
                "honest", explanation=_TRL_KERNEL_ENTROPY_CANCELS, by_property=_TRL_KERNEL_HONEST
            ),
            "padding": Cell("assume_padding", explanation=_PADDING),
            "uneven": _ONE_RANK,
            "16bit": Cell(note="claimed: each block converted to fp32"),
            "inactive": Cell(note="claimed: the contract's mask as row_mask"),
            "batch": _CLAIMED_BATCH,
            "cross_tp": _NO_XTP,
            "real_group": _ONE_RANK,
        },
    ),
    Peer(
        name="liger_ppo_chunk_forward",
        module="liger_ppo",
        library="Liger-Kernel LigerFusedLinearPPOBase.chunk_forward (the logprobs of its GRPO "
        "loss), hidden in",
        distribution="liger-kernel",
        cells={
            "honest": Cell("honest", by_property=_LIGER_PPO_WATCHED),
            "padding": Cell("assume_padding", explanation=_PADDING, by_property=_LIGER_PPO_WATCHED),
            "uneven": _ONE_RANK,
            "16bit": Cell(
                "assume_16bit",
                explanation=Explanation(
                    PEER_LIMITATION,
                    "each chunk's logits are the matmul's output in the input dtype "
                    "((hidden @ W.T) in bf16/fp16) before .float(), so they carry 8/11 bits "
                    "before the fp32 fold",
                ),
                by_property=_LIGER_PPO_WATCHED,
            ),
            "inactive": Cell(
                "assume_inactive_tokens",
                explanation=Explanation(
                    PEER_LIMITATION,
                    "chunk_forward has no mask (the losses multiply by their attention_mask "
                    "afterwards): a target outside [0, V) is in no chunk, so its logit stays 0 "
                    "and the row gets the logprob -lse and its gradient, not the contract's 0",
                ),
                by_property=_LIGER_PPO_WATCHED,
            ),
            "batch": Cell(
                "assume_batch_invariant",
                explanation=Explanation(
                    PEER_LIMITATION,
                    "each chunk's matmul has min(N, 2048) rows, and a matmul's bits for a row "
                    "follow its shape (the CPU GEMM's blocking here), so a row run alone gives "
                    "other bits than in a batch",
                ),
                by_property=_LIGER_PPO_WATCHED,
            ),
            "cross_tp": _NO_XTP,
            "real_group": _ONE_RANK,
        },
    ),
    Peer(
        name="liger_fused_selective_log_softmax",
        module="liger_selective",
        library="Liger-Kernel fused_selective_log_softmax (its Triton GRPO loss's old and "
        "reference logprobs; Triton, interpreter on CPU)",
        distribution="liger-kernel",
        cells={
            "honest": Cell(
                "honest",
                by_property=(("test_wide_vocabularies", _LIGER_SELECTIVE_LEADING_NEG_INF),),
            ),
            "padding": Cell("assume_padding", explanation=_PADDING),
            "uneven": _ONE_RANK,
            "16bit": Cell(note="claimed: each block converted to fp32"),
            "inactive": Cell(note="claimed: the contract's mask as mask"),
            "batch": _CLAIMED_BATCH,
            "cross_tp": _NO_XTP,
            "real_group": _ONE_RANK,
        },
    ),
    Peer(
        name="openrlhf_actor_logprob_entropy",
        module="openrlhf_actor",
        library="OpenRLHF Actor.forward's steps: fp32, div_(T), compute_entropy, "
        "log_probs_from_logits",
        distribution="openrlhf",
        cells={
            "honest": Cell(
                "honest", explanation=_OPENRLHF_ENTROPY_CANCELS, by_property=_OPENRLHF_ACTOR_HONEST
            ),
            "padding": Cell("assume_padding", explanation=_PADDING),
            "uneven": _ONE_RANK,
            "16bit": Cell(note="claimed: the actor's .to(torch.float32) first"),
            "inactive": Cell(
                "assume_inactive_tokens",
                explanation=_gathers_every_label("OpenRLHF"),
                by_property=tuple(
                    (test, _OPENRLHF_POS_INF)
                    for test in ("test_long_batches", "test_special_values_match_oracle")
                ),
            ),
            "batch": _CLAIMED_BATCH,
            "cross_tp": _NO_XTP,
            "real_group": _ONE_RANK,
        },
    ),
)
"""Every peer, in matrix order."""


@dataclass(frozen=True)
class Finding:
    """One way a processed-logprob peer differs from the exact rules of the semantics.

    ``rule`` names the rule in a few words; ``explanation`` says why (its
    ``reproducer`` prints the library's support next to the exact one and exits 1
    while they differ); ``properties`` are the tests of
    ``tp_logprob.properties.test_processed`` that fail on the reproducer's row.
    """

    rule: str
    explanation: Explanation
    properties: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProcessedPeer:
    """A rollout engine's or trainer's sampler as a processed-logprob backend (``attr``).

    ``agrees`` says where it follows the exact rules (pinned by its tests).
    """

    name: str
    module: str
    library: str
    distribution: str
    attr: str = "honest"
    findings: tuple[Finding, ...] = ()
    agrees: str = ""

    def spec(self) -> str:
        """The ``--tp-logprob-backend`` value of the adapter."""
        return f"tp_logprob.peers.{self.module}:{self.attr}"

    def findings_for(self, test: str) -> tuple[Finding, ...]:
        """The findings that explain a failure of property test ``test`` (none: unexplained).

        Hypothesis reports one failing example per test, so a test that several
        findings fail is explained by whichever of them its example shows.
        """
        return tuple(finding for finding in self.findings if test in finding.properties)


@dataclass(frozen=True)
class Unavailable:
    """A library whose sampler code cannot run here: ``reason`` says why, exactly.

    ``source`` is what its published source does where it differs from the exact
    rules: read, not run, so no reproducer backs it.
    """

    library: str
    distribution: str
    reason: str
    source: str = ""


_VLLM_TOP_P = "apply_top_k_top_p_pytorch sorts ascending and drops the positions whose fp32 cumsum "
_ORACLE = ("test_processed_matches_exact_oracle_on_its_support",)
_SGLANG_SORT = (
    "top_k_top_p_min_p_sampling_from_probs_torch sorts the fp32 probabilities descending and "
)

_VLLM_FINDINGS = (
    Finding(
        "top-p, ties at the boundary",
        Explanation(
            PEER_LIMITATION,
            _VLLM_TOP_P + "is <= 1 - top_p: of tokens tied at the boundary it keeps "
            "those the sort put last, where the exact rule keeps the whole tie",
            "docs/repro_vllm_top_p_ties.py",
        ),
        _ORACLE,
    ),
    Finding(
        "top-p, fp32 boundary",
        Explanation(
            PEER_LIMITATION,
            "the top-p decision is taken on fp32 softmax, fp32 cumsum and fp32 1 - top_p: "
            "a token whose exact mass above lies within that rounding of top_p can land "
            "on either side (here it is dropped, kept exactly by 3.7e-8); a borderline "
            "token, admissible either way within the bound of docs/tolerances.md",
            "docs/repro_vllm_top_p_fp32_boundary.py",
        ),
    ),
    Finding(
        "min-p, fp32 boundary",
        Explanation(
            PEER_LIMITATION,
            "min-p compares fp32 probabilities, p < max p * min_p, both sides rounded: "
            "exp(z - M) = 0.499999999 against min_p = 0.5 rounds to a tie and is kept; "
            "a borderline token, admissible either way within the bound of "
            "docs/tolerances.md",
            "docs/repro_vllm_min_p_fp32_boundary.py",
        ),
    ),
    Finding(
        "top_p = 1 beside a top-p request",
        Explanation(
            PEER_LIMITATION,
            "one top_p tensor serves the batch once any request has top_p < 1; a top_p = 1 "
            "row then loses every token whose fp32 probability underflows (cumsum <= 0), "
            "so its support and processed logprob (-inf for such a token) depend on the "
            "other requests",
            "docs/repro_vllm_top_p_one_in_batch.py",
        ),
    ),
    Finding(
        "temperature below 0.01",
        Explanation(
            PEER_LIMITATION,
            "SamplingParams raises any temperature in (0, 0.01) to 0.01 (with a logged "
            "warning), so the processed logprob is that of x / 0.01, not x / T",
            "docs/repro_vllm_temperature_floor.py",
        ),
        _ORACLE,
    ),
    Finding(
        "temperature above 2",
        Explanation(
            PEER_LIMITATION,
            "SamplingParams (from 0.24.0) refuses any temperature outside [0, 2] with "
            "VLLMValidationError, so the engine has no processed logprob at T > 2 to "
            "compare with; the adapter passes the error on",
            "docs/repro_vllm_temperature_range.py",
        ),
        (*_ORACLE, "test_processed_run_to_run_and_batch_invariance"),
    ),
    Finding(
        "-inf logits inside the support",
        Explanation(
            PEER_LIMITATION,
            "a kept -inf logit is indistinguishable from a masked one, and vLLM's sampling "
            "mask is the finite processed logits: where the k-th largest value is -inf the "
            "exact support (and size, and threshold -inf) holds -inf columns vLLM's does "
            "not; the logprobs agree",
            "docs/repro_vllm_neg_inf_support.py",
        ),
        _ORACLE,
    ),
)
"""vLLM's findings up to 0.33 (``vllm_sampler``), in the order of its report."""

_VLLM_034_MIN_P = Finding(
    "min-p, fp32 boundary",
    Explanation(
        PEER_LIMITATION,
        "from 0.34 min-p drops z < max z + log(min_p), all in fp32: z = fp32(log 0.5) against "
        "min_p = 0.5 equals the fp32 threshold and is kept, where exactly exp(z - M) = "
        "0.499999999 < 0.5 drops it; a borderline token, admissible either way within the bound "
        "of docs/tolerances.md",
        "docs/repro_vllm_034_min_p_boundary.py",
    ),
)
_VLLM_034_TEMPERATURE_FLOOR = Finding(
    "temperature below 0.01",
    Explanation(
        PEER_LIMITATION,
        "SamplingParams raises any temperature in (0, 0.01) to 0.01 (with a logged warning), and "
        "CPUSamplingStates divides by what it holds, so the processed logprob is that of "
        "x / 0.01, not x / T",
        "docs/repro_vllm_034_temperature_floor.py",
    ),
    _ORACLE,
)

PROCESSED_PEERS = (
    ProcessedPeer(
        name="vllm_sampler",
        module="vllm_sampler",
        library="vLLM v1 Sampler, processed_logits mode (PyTorch top-k/top-p, MinPLogitsProcessor)",
        distribution="vllm",
        findings=_VLLM_FINDINGS,
        agrees="top-k keeps the whole tie at the k-th value; the order is the exact one "
        "(temperature, then min-p, then top-k, then top-p on the distribution renormalised "
        "over the survivors); the maximum is always kept; the processed logprob of a dropped "
        "target is -inf",
    ),
    ProcessedPeer(
        name="vllm_sampler_034",
        module="vllm_sampler_034",
        library="vLLM CPU model runner sampler, processed_logprobs mode with the sampling mask "
        "(CPUSampler: PyTorch top-k/top-p, min-p in logit space)",
        distribution="vllm",
        findings=(
            *_VLLM_FINDINGS[:2],  # top-p: apply_top_k_top_p_pytorch is unchanged in 0.34
            _VLLM_034_MIN_P,
            _VLLM_FINDINGS[3],  # top_p = 1 beside a top-p request: one top_p tensor still
            _VLLM_034_TEMPERATURE_FLOOR,
            *_VLLM_FINDINGS[5:],  # SamplingParams' range; the mask is the finite logits
        ),
        agrees="top-k keeps the whole tie at the k-th value; the order is the exact one "
        "(temperature, then min-p, then top-k, then top-p on the distribution renormalised "
        "over the survivors); the maximum is always kept; the processed logprob of a dropped "
        "target is -inf",
    ),
    ProcessedPeer(
        name="sglang_sampler",
        module="sglang_sampler",
        library="SGLang Sampler, pytorch backend with the sampling mask "
        "(top_k_top_p_min_p_sampling_from_probs_torch)",
        distribution="sglang",
        findings=(
            Finding(
                "top-k, ties at the k-th value",
                Explanation(
                    PEER_LIMITATION,
                    _SGLANG_SORT + "keeps exactly top_k positions: of tokens tied at the k-th "
                    "value it keeps those the sort put first, where the exact rule keeps the "
                    "whole tie",
                    "docs/repro_sglang_top_k_ties.py",
                ),
                _ORACLE,
            ),
            Finding(
                "top-p, ties at the boundary",
                Explanation(
                    PEER_LIMITATION,
                    _SGLANG_SORT + "drops a position whose mass before it is > top_p, a mass "
                    "that counts the tied tokens sorted first: of tokens tied at the boundary it "
                    "keeps the first ones, where the exact rule keeps the whole tie",
                    "docs/repro_sglang_top_p_ties.py",
                ),
                _ORACLE,
            ),
            Finding(
                "top-p on the full distribution",
                Explanation(
                    PEER_LIMITATION,
                    "the top-p cumsum is taken over the full sorted distribution before the "
                    "top-k cut (the joint rule), and min-p comes last, so top-p is not "
                    "renormalised over the top-k or min-p survivors as in the exact order: it "
                    "keeps tokens the exact rules drop",
                    "docs/repro_sglang_top_p_joint.py",
                ),
                _ORACLE,
            ),
            Finding(
                "tokens of zero fp32 probability",
                Explanation(
                    PEER_LIMITATION,
                    "the sampling mask is the tokens of positive filtered fp32 probability: a "
                    "kept token whose probability underflows (z more than ~104 below the "
                    "maximum), or a kept -inf logit, leaves the support, with processed logprob "
                    "-inf where the exact one is finite",
                    "docs/repro_sglang_zero_probability.py",
                ),
                _ORACLE,
            ),
            Finding(
                "a row with NaN or +inf tempered logits",
                Explanation(
                    PEER_LIMITATION,
                    "a NaN logit, or a finite one that overflows when divided by T, makes that "
                    "row's probabilities NaN, and torch.multinomial raises RuntimeError for the "
                    "whole batch; the exact rules leave only that row undefined",
                    "docs/repro_sglang_nonfinite_raises.py",
                ),
                (*_ORACLE, "test_processed_run_to_run_and_batch_invariance"),
            ),
            Finding(
                "temperature below 1e-6",
                Explanation(
                    PEER_LIMITATION,
                    "SamplingParams turns any temperature in [0, 1e-6) into greedy decoding "
                    "(temperature 1, top_k 1): the support is the first index of the maximum, "
                    "whatever rules the request asked for",
                    "docs/repro_sglang_temperature_greedy.py",
                ),
                _ORACLE,
            ),
        ),
        agrees="min-p keeps p >= min_p * max p, as the exact rule (after top-k and top-p, "
        "against the largest probability, which they always keep); top-k alone and top-p "
        "alone agree away from ties; the processed logprob is log(w / sum of kept w) on "
        "SGLang's fp32 probabilities, -inf for a dropped target",
    ),
)
"""Every processed-logprob peer, in report order."""

UNAVAILABLE = (
    Unavailable(
        "NeMo-RL trainer-side top-k/top-p (nemo_rl.algorithms.logits_sampling_utils)",
        "nemo-rl",
        "not on PyPI: its only release there, nemo-rl 0.0.0, holds nemo_rl/__init__.py and "
        "package_info.py and no code (the library installs from its Git repository, which "
        "the conformance session cannot reach)",
        "apply_top_k_top_p is a port of vLLM's PyTorch rule for one top_k and top_p per batch: "
        "top-k keeps ties (>= the k-th value), top-p keeps the ascending positions whose fp32 "
        "cumsum is > 1 - top_p (1 - top_p in double, rounded once to fp32, where vLLM subtracts "
        "from top_p already rounded to fp32), so "
        "boundary ties are cut by sort position as in vLLM; no min-p; the backward zeroes the "
        "gradient outside the kept mask",
    ),
    Unavailable(
        "prime-rl trainer-side mask recompute",
        "prime-rl",
        "not on PyPI ('No matching distribution found for prime-rl'; 'prime' is Prime "
        "Intellect's command-line client, another package)",
    ),
)
"""Libraries the issue names whose code cannot be installed or imported on CPU here."""
