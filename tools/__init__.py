"""The project's tools, beside the package and outside its wheel.

``tools.gpu_readiness`` compiles every Triton kernel for every GPU target and
gates the result (``nox -s compile``). Run from a checkout: ``python -m
tools.gpu_readiness``. The package never imports anything here.
"""
