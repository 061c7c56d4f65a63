"""What a run of a case returned, as the judging reads it: float64 copies of the outputs.

The harness makes them from an op's results (:func:`~tp_logprob.suite.running.outputs_of`);
the asserts of :mod:`tp_logprob.testing` from a kernel's tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Floats", "Outputs", "select_rows"]

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Outputs:
    """One run's replicated outputs as float64 copies of the fp32 values.

    ``entropy`` is None unless the contract has ``export_entropy``. A processed op
    (a contract with a support) also has ``support_lse``, ``support_size`` (int64)
    and, for sampling parameters, ``support_threshold``; they are None otherwise.
    """

    selected: Floats
    lse: Floats | None
    results: Any  # the per-rank LogprobResults, for gradients
    entropy: Floats | None = None
    support_lse: Floats | None = None
    support_size: npt.NDArray[np.int64] | None = None
    support_threshold: Floats | None = None


def select_rows(outputs: Outputs, rows: Any) -> Outputs:
    """The outputs of ``rows`` only (in that order)."""

    def pick(values: Any) -> Any:
        return None if values is None else values[rows]

    return Outputs(
        outputs.selected[rows],
        pick(outputs.lse),
        outputs.results,
        pick(outputs.entropy),
        support_lse=pick(outputs.support_lse),
        support_size=pick(outputs.support_size),
        support_threshold=pick(outputs.support_threshold),
    )
