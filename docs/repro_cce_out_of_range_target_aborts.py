"""An out-of-range target kills the process in Cut Cross-Entropy's torch path on CPU,
where an exception is due (cut-cross-entropy 25.1.1, ``impl="torch_compile"``,
torch 2.13 Inductor).

``linear_cross_entropy`` passes every target that is not ``ignore_index`` to the
compiled ``F.cross_entropy``. Inductor's C++ kernel checks the index
(``TORCH_CHECK(0 <= t < V, "index out of bounds")``) inside its OpenMP parallel
region, so with more than one thread the exception it throws leaves that region,
and the C++ runtime calls ``std::terminate``: SIGABRT, no Python exception, every
other test or training step of the process gone. With ``torch.set_num_threads(1)``
the kernel has no parallel region and the same call raises ``RuntimeError``.
Each call runs in a child process, with two threads and with one, and each child
compiles afresh (its own Inductor cache): a kernel that an earlier process left in
the shared cache, compiled by other calls (a test suite's), raised ``RuntimeError``
with two threads too, so the outcome depended on what had run before.
Run: ``python docs/repro_cce_out_of_range_target_aborts.py`` (exits 1 while a
call dies of a signal instead of raising).
"""

import os
import subprocess
import sys
import tempfile

CALL = """
import sys, torch
from cut_cross_entropy import linear_cross_entropy
torch.set_num_threads(int(sys.argv[1]))
e, c = torch.randn(64, 8), torch.randn(24, 8)
targets = torch.zeros(64, dtype=torch.long)
targets[63] = 24  # one past the vocabulary
try:
    linear_cross_entropy(e, c, targets, reduction="none", impl="torch_compile")
except RuntimeError as error:
    print("RuntimeError:", str(error).splitlines()[0][-60:])
else:
    print("returned a loss")
"""

died = False
for threads in (2, 1):
    with tempfile.TemporaryDirectory() as cache:
        child = subprocess.run(
            [sys.executable, "-c", CALL, str(threads)],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache},
        )
    if child.returncode < 0:
        died = True
        print(f"{threads} thread(s): the process died of signal {-child.returncode}")
    else:
        last = (child.stdout.strip().splitlines() or [f"exit {child.returncode}"])[-1]
        print(f"{threads} thread(s): {last}")
raise SystemExit(1 if died else 0)
