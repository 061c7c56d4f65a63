"""Triton backends: ``triton_online`` (one pass, fixed topology) and ``triton_exact_sum``
(cross-TP bitwise).

Importing this package imports neither torch nor triton; the registry loads
:mod:`.online` and :mod:`.exact_sum` on first dispatch. On CPU the kernels run
through the Triton interpreter, which needs ``TRITON_INTERPRET=1`` set before
triton is imported.
"""
