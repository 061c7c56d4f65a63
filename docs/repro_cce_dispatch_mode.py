"""One call of Cut Cross-Entropy's torch path under a TorchDispatchMode breaks every later
call in the process (cut-cross-entropy 25.1.1, ``impl="torch_compile"``, CPU).

``torch_compile_linear_cross_entropy_apply`` is ``torch.compile(fullgraph=True,
dynamic=True)``. Under an active ``TorchDispatchMode`` (an allocation or FLOP
counter: ``torch.utils.flop_counter.FlopCounterMode``, the suite's allocation
watcher) Dynamo skips the frame, and ``fullgraph=True`` turns the skip into
``RuntimeError: torch.compile with fullgraph=True found no compiled frames``. The
skip stays on the code object: every later call, with no mode active, raises the
same error, so the loss cannot be computed again in that process (a fresh process,
or ``torch._dynamo.reset()``, compiles it again).
Run: ``python docs/repro_cce_dispatch_mode.py`` (exits 1 while later calls raise).
"""

import torch
from cut_cross_entropy import linear_cross_entropy
from torch.utils.flop_counter import FlopCounterMode

e, c, targets = torch.randn(5, 16), torch.randn(40, 16), torch.tensor([0, 1, 2, 3, 4])


def loss() -> torch.Tensor:
    return linear_cross_entropy(e, c, targets, reduction="none", impl="torch_compile")


print("before any mode:", loss().tolist())
try:
    with FlopCounterMode(display=False):
        loss()
    print("under FlopCounterMode: computed")
except RuntimeError as error:
    print("under FlopCounterMode:", str(error).splitlines()[0])
try:
    print("after the mode:", loss().tolist())
except RuntimeError as error:
    print("after the mode:", str(error).splitlines()[0])
    raise SystemExit(1) from None
