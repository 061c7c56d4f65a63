"""Planted-bug backends: torch_native (or, in ``fused_bugs``, torch_native_fused) with one
realistic bug each, which the suite must catch; ``processed_bugs`` plants them in its
processed op (a sampling support).

Every mutant is exposed as ``tests.mutants.<module>:<name>``, an ``(op, capability)``
pair that ``pytest --pyargs tp_logprob.properties --tp-logprob-backend=SPEC``
loads, registered as ``mutant_<name>`` with its base backend's capability (or the
false claim that is its bug). ``benchmarks/suite_power.py`` runs the suite on
each of them and on the :data:`CONTROLS`, which must pass. A mutant that only the
:data:`REACH_PROPERTIES` can see names those it needs (``reach``): the suite without
them must let it survive.

Importing this package does not import torch; the mutant modules do.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CONTROLS", "MUTANTS", "REACH_PROPERTIES", "Mutant"]


REACH_PROPERTIES: tuple[str, ...] = (
    "test_long_batches",
    "test_fused_long_batches",
    "test_row_positions",
    "test_fused_row_positions",
    "test_fused_wide_vocabularies",
    "test_fused_never_materializes_the_logits",
)
"""The properties that reach past the first 64 rows of a batch, past a shard's first
128-column tile, or into a row's position in its batch. The last is the fused memory
check, whose 384 repeated rows must keep their bits; its memory half is older."""


@dataclass(frozen=True)
class Mutant:
    """One planted bug: its name, the module that plants it, and what the bug is.

    ``reach`` names the :data:`REACH_PROPERTIES` that can see the bug, for a bug no other
    property can: the suite with those deselected must let the mutant survive.
    """

    name: str
    module: str
    bug: str
    reach: tuple[str, ...] = ()

    @property
    def spec(self) -> str:
        """The ``--tp-logprob-backend`` value that loads it."""
        return f"tests.mutants.{self.module}:{self.name}"

    @property
    def backend_id(self) -> str:
        """The id it registers under."""
        return f"mutant_{self.name}"


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "lse_average",
        "merge_bugs",
        "the merged LSE is the mean of the per-rank LSEs m_r + log s_r",
    ),
    Mutant(
        "merge_no_rescale",
        "merge_bugs",
        "partials merged as S = sum s_r, without rescaling by exp(m_r - M)",
    ),
    Mutant(
        "identity_nan",
        "merge_bugs",
        "the merge evaluates exp(m_r - M) for identity partials: exp(-inf - -inf) = NaN "
        "when every m_r is -inf",
    ),
    Mutant(
        "plus_inf_not_special",
        "merge_bugs",
        "no +inf special case in the merge: a +inf logit gives lse NaN instead of +inf",
    ),
    Mutant(
        "owner_off_by_one",
        "merge_bugs",
        "the target's owner rank found with <= on the shard end: a target in a shard's "
        "first column is taken from the previous rank (which does not hold it)",
    ),
    Mutant(
        "reverse_merge_cross_tp",
        "merge_bugs",
        "merges in reverse rank order and claims cross_tp_bitwise (a fixed order is not "
        "a fixed grouping across shard layouts)",
    ),
    Mutant(
        "ring_order_merge",
        "merge_bugs",
        "each rank sums the partials in ring order starting from its own, so ranks can "
        "disagree in the last bits (TP >= 3)",
    ),
    Mutant(
        "rank1_lse_last_bit",
        "merge_bugs",
        "rank 1's lse is one ulp above the other ranks' (nextafter)",
    ),
    Mutant(
        "partials_in_logits_dtype",
        "merge_bugs",
        "partials all-gathered in the logits dtype (bf16/fp16) to halve the traffic",
    ),
    Mutant(
        "padding_not_masked",
        "partial_bugs",
        "padding columns not masked: max and sum over the whole shard",
    ),
    Mutant(
        "padding_in_max_only",
        "partial_bugs",
        "padding masked in the sum but not in the max (the shift comes from padding)",
    ),
    Mutant(
        "padding_last_rank_only",
        "partial_bugs",
        "claims supports_vocab_padding but masks padding only on the last rank "
        "(Megatron's layout); padding in an earlier shard is summed",
    ),
    Mutant(
        "last_column_dropped",
        "partial_bugs",
        "shard bound off by one: live end = min(end, real_vocab_size - 1), dropping the "
        "last real column",
    ),
    Mutant(
        "target_local_index",
        "partial_bugs",
        "the target logit gathered at the global id instead of id - shard start",
    ),
    Mutant(
        "half_precision_accumulation",
        "partial_bugs",
        "exp and sum in the logits dtype (bf16/fp16) instead of fp32",
    ),
    Mutant(
        "no_max_shift",
        "partial_bugs",
        "sum exp(x) without the max shift: overflows (or underflows) at large |logits|",
    ),
    Mutant(
        "tiling_depends_on_n",
        "partial_bugs",
        "batches of fewer than 4 rows sum left to right, larger ones by a tree: a row's "
        "bits depend on N",
    ),
    Mutant(
        "sequential_declared_tree",
        "partial_bugs",
        "declares torch_native's pairwise tree (accumulation_order) but sums each shard left "
        "to right: the half-ulp row errs by the shard's width, not its depth",
    ),
    Mutant(
        "inactive_not_zeroed",
        "mask_bugs",
        "the mask is not passed to the merge: inactive rows get target - LSE",
    ),
    Mutant(
        "inactive_lse_zeroed",
        "mask_bugs",
        "inactive rows' lse set to 0 (it must stay the row's LSE)",
    ),
    Mutant(
        "inactive_target_checked",
        "mask_bugs",
        "every target range-checked, inactive ones too: raises on an inactive out-of-range target",
    ),
    Mutant(
        "check_after_collective",
        "mask_bugs",
        "inputs checked after the all-gather: a bad input on one rank hangs or crashes "
        "instead of raising LogprobContractError",
    ),
    Mutant(
        "grad_no_one_hot",
        "grad_bugs",
        "backward forgets the one-hot [v == target] term on the owner rank",
    ),
    Mutant(
        "grad_local_lse",
        "grad_bugs",
        "backward uses this rank's own LSE (m_r + log s_r) instead of the merged one",
    ),
    Mutant(
        "grad_padding_nonzero",
        "grad_bugs",
        "backward writes softmax gradients into the padding columns",
    ),
    Mutant(
        "grad_ignores_upstream",
        "grad_bugs",
        "backward returns [v == target] - p without multiplying by the upstream gradient",
    ),
    Mutant(
        "entropy_zero_times_neg_inf",
        "rl_bugs",
        "padding made -inf in place and the entropy partial sums exp(d) * d unguarded: "
        "0 * -inf = NaN for a -inf logit or a padded shard",
    ),
    Mutant(
        "entropy_before_temperature",
        "rl_bugs",
        "entropy of softmax(x), computed before the temperature; selected_logp and lse use x / T",
    ),
    Mutant(
        "temperature_on_logprobs",
        "rl_bugs",
        "temperature applied to the outputs, log_softmax(x) / T and lse(x) / T, not to the logits",
    ),
    Mutant(
        "entropy_grad_nan_to_num",
        "rl_bugs",
        "entropy backward p (z - LSE + H) unguarded (NaN on -inf columns), then nan_to_num: "
        "NaN rows get 0 and infinities are clipped",
    ),
    Mutant(
        "entropy_over_padding",
        "rl_bugs",
        "the entropy partial sums exp(d) * d over the whole shard: padding columns counted",
    ),
    Mutant(
        "entropy_unmerged",
        "rl_bugs",
        "rank 0's shard entropy returned on every rank, never merged across ranks "
        "(replicated, right only at TP=1)",
    ),
    Mutant(
        "block_without_finite_value",
        "wide_bugs",
        "a 2048-column block of the online softmax with no finite value gives "
        "exp(-inf - -inf) = NaN (only shards wider than one block)",
    ),
    Mutant(
        "last_block_dropped",
        "wide_bugs",
        "the blocked loop sums full 2048-column blocks only: the last partial block is lost",
    ),
    Mutant(
        "writes_input",
        "input_bugs",
        "inactive rows of the caller's logits zeroed in place (outputs right, input clobbered)",
    ),
    Mutant(
        "unit_column_stride",
        "layout_bugs",
        "only the logits' row stride reaches the kernel: columns read one element apart "
        "(right on contiguous rows, wrong on a transposed or column-stepped view)",
    ),
    Mutant(
        "dense_targets",
        "layout_bugs",
        "targets read at targets_ptr + row whatever their stride (right on a fresh tensor, "
        "wrong on a column of an id table)",
    ),
    Mutant(
        "fused_dense_hidden",
        "fused_layout_bugs",
        "fused LM head: hidden rows read H elements apart, one element per column (right on "
        "contiguous hidden states, wrong on a strided or transposed view)",
    ),
    Mutant(
        "temperature_reciprocal",
        "rl_bugs",
        "z = x * fp32(1/T) instead of the IEEE division x / T: one ulp off for some x",
    ),
    Mutant(
        "fused_sentinel_collides_with_padding",
        "fused_bugs",
        "fused LM head: a target the rank does not own is read at sentinel local index "
        "live_end - start, meant as a zero column past the shard; on a padded shard it is "
        "a padding column (garbage W row), and the all-reduced (summed) target logit adds it",
    ),
    Mutant(
        "fused_hidden_grad_missing_rank_sum",
        "fused_bugs",
        "fused LM head: only rank 0 returns its d hidden partial ('hidden is replicated: count "
        "its gradient once'); after the caller's all-reduce the other shards' terms are missing",
    ),
    Mutant(
        "fused_bias_on_padding",
        "fused_bugs",
        "fused LM head: padding columns masked to -inf before the bias is added over the whole "
        "shard: a +inf or NaN padding bias makes them NaN, and NaN reaches the max and the sum",
    ),
    Mutant(
        "fused_chunk_from_n",
        "fused_bugs",
        "fused LM head: Liger's chunk size next_power_of_2(cdiv(N, cdiv(V, H))): the matmul "
        "shape, hence a row's bits, depend on N",
    ),
    Mutant(
        "fused_inactive_nan_into_weight_grad",
        "fused_bugs",
        "fused LM head: d W = G.T @ hidden without zeroing inactive rows' hidden: G is 0 there, "
        "but 0 * NaN = NaN",
    ),
    Mutant(
        "long_batch_target_offset",
        "reach_bugs",
        "row i reads the target of row i % 64 (the offset in its 64-row tile, not the row): "
        "exactly right for the first 64 rows",
        reach=("test_long_batches", "test_row_positions"),
    ),
    Mutant(
        "blas_row_sums",
        "reach_bugs",
        "the row sums sum exp(z - m) as one BLAS matrix-vector product over the batch: the "
        "micro-kernel treats a row by its position, so a row's bits depend on where it sits",
        # No reach: the older batch-invariance sweep sees it too (a row alone and the same
        # row in a 64-row gemv get other bits).
    ),
    Mutant(
        "fused_long_batch_target_offset",
        "fused_reach_bugs",
        "fused LM head: row i reads the target of row i % 64: right for the first 64 rows",
        reach=(
            "test_fused_long_batches",
            "test_fused_row_positions",
            "test_fused_never_materializes_the_logits",
        ),
    ),
    Mutant(
        "fused_bias_first_tile_only",
        "fused_reach_bugs",
        "fused LM head: the bias is loaded with each shard's first 128-column tile only",
        reach=("test_fused_wide_vocabularies",),
    ),
    Mutant(
        "fused_last_partial_tile_dropped",
        "fused_reach_bugs",
        "fused LM head: a shard's columns are walked in 128-column tiles and a last, partial "
        "tile is never visited (unless it is the only one)",
        reach=("test_fused_wide_vocabularies",),
    ),
    Mutant(
        "fused_blas_row_sums",
        "fused_reach_bugs",
        "fused LM head: the chunk partials' row sums as a BLAS matrix-vector product: a row's "
        "bits depend on its position in the chunk",
        reach=("test_fused_row_positions", "test_fused_never_materializes_the_logits"),
    ),
    Mutant(
        "top_k_exactly_k",
        "processed_bugs",
        "top-k keeps exactly k tokens, as torch.topk does: the tie at the k-th value is cut "
        "by vocabulary id instead of kept whole",
    ),
    Mutant(
        "top_p_inclusive_cumsum",
        "processed_bugs",
        "top-p keeps a token while the cumulative mass through it (its own included) is "
        "<= top_p, not while the mass strictly above it is < top_p: the token that crosses "
        "top_p is dropped",
    ),
    Mutant(
        "rules_on_full_distribution",
        "processed_bugs",
        "SGLang's joint rule: top-k, top-p and min-p each on the full distribution and "
        "intersected; top-p not renormalised over the survivors of min-p and top-k",
    ),
    Mutant(
        "min_p_last",
        "processed_bugs",
        "min-p applied after top-k and top-p instead of first: top-p not renormalised over "
        "min-p's survivors",
    ),
    Mutant(
        "temperature_after_truncation",
        "processed_bugs",
        "the support's rules read the logits before the temperature (truncate, then divide by T)",
    ),
    Mutant(
        "mask_not_renormalised",
        "processed_bugs",
        "the support applied to the trainer's logprob without renormalising: z_y - LSE over "
        "the whole vocabulary instead of z_y - LSE_S",
    ),
    Mutant(
        "support_per_shard",
        "processed_bugs",
        "the support recomputed from each rank's shard alone (a local top-k, top-p, min-p), "
        "never across ranks",
    ),
    Mutant(
        "min_p_local_max",
        "processed_bugs",
        "min-p's bar from each rank's own max, not the row's max over every rank (top-k and "
        "top-p across the ranks on its survivors)",
    ),
    Mutant(
        "replayed_local_ids",
        "processed_bugs",
        "the replayed mask's kept ids read as each rank's local column ids instead of global ids",
    ),
    Mutant(
        "first_row_temperature",
        "processed_bugs",
        "an engine batch served one set of sampling rules at a time with one temperature per "
        "launch: every row divided by the first row's temperature, not its own",
    ),
)
"""Every planted bug, in the order the runner reports them."""

CONTROLS: tuple[tuple[str, str], ...] = (
    ("torch_native", "torch_native"),
    ("control_native", "tests.mutants.control:control_native"),
    ("my_kernel", "src/tp_logprob/templates/my_kernel.py:register"),
    ("torch_native_fused", "torch_native_fused"),
    ("control_fused", "tests.mutants.fused_bugs:control_fused"),
    ("control_processed", "tests.mutants.processed_bugs:control_processed"),
)
"""``(name, spec)`` of the backends that must pass: the built-in torch_native,
torch_native rebuilt by the mutants' own composition (loaded as module:attr),
the third-party example backend (the shipped template, loaded from its file), the same pair for the
fused LM head (the built-in torch_native_fused, and its rebuild by ``fused_bugs``),
and torch_native with sampling supports rebuilt by ``processed_bugs``."""
