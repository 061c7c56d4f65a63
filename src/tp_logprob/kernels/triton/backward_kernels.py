"""The local logprob gradient, shared by both Triton backends.

``logprob_grad_kernel``: one program per ``(row, BLOCK-wide column tile)`` writes
``(g ([v == target] - p) - h p (z - LSE + H)) / T`` with ``z = x / T`` and
``p = exp(z - LSE)``, from the merged fp32 LSE (and entropy ``H``) saved by the
forward; ``g`` and ``h`` are the upstream gradients of ``selected_logp`` and
``entropy`` (the entropy term only with ``ENTROPY``, the divisions by ``T`` only
with ``SCALE``, both IEEE ``div_rn``). Computed in fp32 and stored in the logits
dtype; padding columns and inactive rows get exactly 0 (their logits are not
loaded), and a ``-inf`` column's entropy term is 0, never ``0 * -inf``.
Elementwise, so no collective and no reduction-order question. Traffic per row:
``live_width * itemsize`` bytes read (active rows only), ``width * itemsize``
bytes written, plus the row's LSE, gradients, entropy and target.

With a support (``SUPPORT``, ``support_kernels``) the LSE and entropy are over ``S``
and a column outside ``S`` counts as ``-inf`` and gets exactly 0 (the target's
column too): the gradient of ``z_y - LSE_S`` with ``S`` held fixed. The threshold
costs 4 bytes per row, a packed mask ``ceil(live_width / 32) * 4`` bytes.

``PORTABLE`` (``triton_portable``, launched without fp fusion): ``p`` is ``portable_exp``,
so the gradient's bits are the same on every target too (``z - LSE <= 0``: the fp32
``LSE`` is at least the row's maximum).
"""

# triton ships no type hints, and Triton types kernel parameters itself:
# mypy: disable-error-code="untyped-decorator, no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl

from tp_logprob.kernels.triton.common_kernels import row_temperature, scaled, stored, widen
from tp_logprob.kernels.triton.portable_math import row_exp
from tp_logprob.kernels.triton.support_kernels import kept_tile, row_threshold

__all__ = ["logprob_grad_kernel"]


@triton.jit
def logprob_grad_kernel(
    logits_ptr,
    row_stride,
    width,
    live_width,
    col_start,
    targets_ptr,
    active_ptr,
    lse_ptr,
    grad_out_ptr,
    grad_ptr,
    entropy_ptr,
    grad_entropy_ptr,
    temperature_ptr,
    threshold_ptr,
    mask_ptr,
    mask_stride,
    SCALE: tl.constexpr,
    ENTROPY: tl.constexpr,
    SUPPORT: tl.constexpr,
    PORTABLE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    temperature = row_temperature(temperature_ptr, row, row >= 0, SCALE)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_row = cols < width
    active = tl.load(active_ptr + row) != 0
    # A scalar bound rather than `vector & scalar`: the interpreter mistypes that mask.
    live = cols < tl.where(active, live_width, 0)
    x = tl.load(logits_ptr + row * row_stride + cols, mask=live, other=float("-inf"))
    z = scaled(widen(x), temperature, SCALE)
    if SUPPORT != 0:
        tau = row_threshold(threshold_ptr, row, active, SUPPORT)
        start = tl.program_id(1) * BLOCK
        mask_row_ptr = mask_ptr + row * mask_stride
        keep = kept_tile(z, start, live, tau, mask_row_ptr, live_width, SUPPORT, BLOCK)
        # Outside S a column counts as -inf (p = 0, never inf - inf) and gets 0 below.
        z = tl.where(keep, z, float("-inf"))
        live = live & keep
    lse = tl.load(lse_ptr + row)
    grad_out = tl.load(grad_out_ptr + row, mask=active, other=0.0).to(tl.float32)
    target = tl.load(targets_ptr + row, mask=active, other=-1).to(tl.int64)
    lse_finite = (lse > float("-inf")) & (lse < float("inf"))
    centred = z - tl.where(lse_finite, lse, 0.0)
    prob = row_exp(tl.where(lse_finite, centred, float("-inf")), PORTABLE)
    # A row whose selected_logp is NaN (LSE NaN, +inf or -inf) gets NaN on every live
    # column, as torch's log_softmax backward gives; exp(x - inf) alone would give 0.
    prob = tl.where(lse_finite, prob, float("nan"))
    onehot = tl.where(cols == target - col_start, 1.0, 0.0)
    grad = grad_out * (onehot - prob)
    if ENTROPY:
        entropy = tl.load(entropy_ptr + row)
        grad_entropy = tl.load(grad_entropy_ptr + row, mask=active, other=0.0).to(tl.float32)
        # p (z - LSE + H) is 0 where p is 0: a -inf column never gives 0 * -inf.
        finite_centred = tl.where(centred > float("-inf"), centred, 0.0)
        spread = prob * (finite_centred + entropy)
        grad -= grad_entropy * tl.where(prob == 0.0, 0.0, spread)
    grad = tl.where(live, scaled(grad, temperature, SCALE), 0.0)
    tl.store(grad_ptr + row * width + cols, stored(grad_ptr, grad, PORTABLE), mask=in_row)
