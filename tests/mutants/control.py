"""The control: torch_native rebuilt by the mutants' ``compose`` with no step replaced.

It must pass the whole suite (including cross-backend agreement with the
built-in torch_native), which shows a mutant's failure comes from its bug and
not from the way mutants are assembled or loaded.
"""

from __future__ import annotations

from tests.mutants._compose import compose

control_native = compose("control_native", supports_temperature=True, exports_entropy=True)
