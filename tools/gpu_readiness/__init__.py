"""GPU readiness without a GPU: tools, not runtime code.

Every Triton launch the backends make is recorded through the launch layer's seam
(:func:`~tp_logprob.kernels.triton.launch.recording_launches`), compiled for every GPU
target on a CPU (:mod:`.aot`), and read back for registers, spills, load widths and
IEEE division (:mod:`.resources`); :mod:`.traffic` models each backend's bytes per row
and :mod:`.readiness` writes the report (docs/gpu-readiness.md).

Run: ``python -m tools.gpu_readiness [--matrix ci|full] [--jobs N] [--json PATH]
[--markdown PATH]`` where ``TRITON_INTERPRET`` is unset; ``nox -s compile`` runs the
full matrix. Nothing in the runtime package imports this one.
"""
