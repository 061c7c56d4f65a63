"""Memory traffic per row of each Triton backend, and the roofline time it predicts.

Each backend's function lists its kernels' bytes read and written per row (the
numbers the kernel modules' docstrings state), for one rank of a
:class:`Shape`. These kernels do a few flops per byte, so the predicted time
is the bytes over peak HBM bandwidth: ``rows * sum(read + written) / bandwidth``.
Launch latency and the all-gathers are left out (they do not scale with the
vocabulary). The fused LM-head backends are not modelled (:data:`FUSED_NOT_MODELLED`).

>>> shape = Shape(rows=8192, vocab=152064, itemsize=2)
>>> round(predicted_seconds("triton_online", shape, PEAK_BANDWIDTH["H200"]) * 1e3, 3)
0.519
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "BENCH_SHAPE",
    "FUSED_NOT_MODELLED",
    "PEAK_BANDWIDTH",
    "TRAFFIC",
    "Shape",
    "StageTraffic",
    "logprob_grad_traffic",
    "predicted_seconds",
    "triton_exact_sum_traffic",
    "triton_online_traffic",
]

PEAK_BANDWIDTH = {"H100": 3.35e12, "H200": 4.8e12, "MI300X": 5.3e12}  # bytes/s, HBM peak

_TARGET_ID = 8  # int64 target per row
_ACTIVE = 1  # int8 active flag per row
_FP32 = 4


@dataclass(frozen=True)
class Shape:
    """One rank's problem: ``rows`` tokens over an evenly split ``vocab`` (the padded size)."""

    rows: int
    vocab: int
    itemsize: int  # logits bytes per element
    tp: int = 1
    real_vocab: int | None = None  # live columns (default: all)
    out_itemsize: int = _FP32  # selected_logp / lse dtype
    export_lse: bool = True

    @property
    def width(self) -> int:
        return math.ceil(self.vocab / self.tp)

    @property
    def live_width(self) -> int:
        real = self.vocab if self.real_vocab is None else self.real_vocab
        return min(self.width, real)  # rank 0's live columns: the widest on any rank


@dataclass(frozen=True)
class StageTraffic:
    """Bytes one kernel reads and writes per row."""

    kernel: str
    read: int
    written: int


BENCH_SHAPE = Shape(rows=8192, vocab=152064, itemsize=2)


def _merge_written(shape: Shape) -> int:
    """fp32 LSE for the backward, selected_logp, and the exported LSE when it is a separate cast."""
    separate_lse = shape.export_lse and shape.out_itemsize != _FP32
    return _FP32 + shape.out_itemsize + (shape.out_itemsize if separate_lse else 0)


def triton_online_traffic(shape: Shape) -> tuple[StageTraffic, ...]:
    """``online_partial_kernel`` reads each live column once; the merge reads R partials."""
    row_meta = _TARGET_ID + _ACTIVE
    return (
        StageTraffic(
            "online_partial_kernel",
            shape.live_width * shape.itemsize + shape.itemsize + row_meta,
            12,
        ),
        StageTraffic("online_merge_kernel", 12 * shape.tp + row_meta, _merge_written(shape)),
    )


def triton_exact_sum_traffic(shape: Shape) -> tuple[StageTraffic, ...]:
    """Two passes over the live columns (maxima, then fixed-point sums), then the merge."""
    row_meta = _TARGET_ID + _ACTIVE
    live = shape.live_width * shape.itemsize
    return (
        StageTraffic("exact_max_kernel", live + shape.itemsize + row_meta, 8),
        StageTraffic("exact_sum_kernel", live + 8 * shape.tp, 8),
        StageTraffic("exact_merge_kernel", 16 * shape.tp + row_meta, _merge_written(shape)),
    )


def logprob_grad_traffic(shape: Shape) -> tuple[StageTraffic, ...]:
    """The backward (role ``train``): reads the live columns, writes the whole local gradient."""
    read = shape.live_width * shape.itemsize + _FP32 + shape.out_itemsize + _TARGET_ID + _ACTIVE
    return (StageTraffic("logprob_grad_kernel", read, shape.width * shape.itemsize),)


TRAFFIC: dict[str, Callable[[Shape], tuple[StageTraffic, ...]]] = {
    "triton_online": triton_online_traffic,
    "triton_exact_sum": triton_exact_sum_traffic,
    "backward (both backends)": logprob_grad_traffic,
}


FUSED_NOT_MODELLED = (
    "The fused LM head forms each logits tile with an fp32 `tl.dot` (ieee: FMAs, no tensor "
    "cores) and reads the rank's weight rows once per block of `BLOCK_M` rows: 2 x BLOCK_M "
    "flops per weight element read, so its time depends on the FMA rate as much as on "
    "bytes, and bytes / bandwidth would not predict it. Its bytes per row are in "
    "`tp_logprob.kernels.triton.fused`'s docstring."
)
"""Why :data:`TRAFFIC` has no entry for the backends that take hidden states."""


def predicted_seconds(backend: str, shape: Shape, bandwidth: float) -> float:
    """Roofline time of ``backend``'s kernels on ``shape`` at ``bandwidth`` bytes/s."""
    per_row = sum(stage.read + stage.written for stage in TRAFFIC[backend](shape))
    return shape.rows * per_row / bandwidth
